"""Metrics: values accumulated over batches inside a jitted state (`Metric`, `Mean`, `as_metric`)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol, Self, TypeVar, final, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from ciclo._src.base.checks import signature_of
from ciclo._src.base.reprs import short
from ciclo._src.base.roles import Role, fields_with_role
from ciclo._src.state._pytree import register_frozen

T = TypeVar("T")


@runtime_checkable
class Metric(Protocol):
    """A metric that accumulates over batches; an immutable pytree (docs/metrics.md).

    Example:
        >>> import jax.numpy as jnp
        >>> metric = Mean(lambda preds, target: jnp.abs(preds - target))
        >>> isinstance(metric, Metric)
        True
        >>> metric = metric.update(preds=jnp.array([1.0, 2.0]), target=jnp.array([1.0, 0.0]))
        >>> float(metric.compute())
        1.0
    """

    def reset(self) -> Self:
        """Returns an empty metric with the same configuration."""

    def update(self, **kwargs: Any) -> Self:
        """Returns the metric with one more batch accumulated, from the named values it needs (`preds=`)."""

    def merge(self, other: Self, /) -> Self:
        """Returns a metric that has accumulated what both `self` and `other` have."""

    def reduce(self) -> Self:
        """Combines a metric whose leaves carry a stacked leading axis (`jax.lax.all_gather`'s) into one."""

    def compute(self) -> Any:
        """Returns the value of the metric: a scalar array or a dict of them."""


def _name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


def call_with_available(fn: Callable[..., T], /, **available: Any) -> T:
    """Calls `fn` with the arguments it accepts, by name, out of `available` (all of them for `**kwargs`).

    Raises:
        TypeError: when `fn` needs an argument that is not available, or cannot take them by name.

    Example:
        >>> def accuracy(preds, target):
        ...     return (preds == target).mean()
        >>> import numpy as np
        >>> float(call_with_available(accuracy, preds=np.array([1, 2]), target=np.array([1, 3]), batch=None))
        0.5
    """
    # Inspected at every call: this runs at trace time, not in the compiled step,
    # and a cache keyed by `fn` would keep every lambda it ever saw alive.
    signature = signature_of(fn, "by name", "lambda preds, target: fn(preds, target)")
    parameters = signature.parameters.values()
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    positional_only = [p.name for p in parameters if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    kwargs = {p.name: available[p.name] for p in parameters if p.kind in named and p.name in available}
    missing = [
        p.name for p in parameters if p.kind in named and p.name not in kwargs and p.default is p.empty
    ]
    takes_all = any(p.kind is p.VAR_KEYWORD for p in parameters)
    if positional_only:
        names = ", ".join(repr(name) for name in positional_only)
        raise TypeError(
            f"{_name(fn)}() takes {names} as positional-only, but arguments are passed by name; "
            f"wrap it, e.g. `lambda preds, target: fn(preds, target)`"
        )
    if missing:
        names = ", ".join(repr(name) for name in missing)
        plural = "s" if len(missing) > 1 else ""
        have = f"only {', '.join(available)} are available" if available else "none are available"
        raise TypeError(f"{_name(fn)}() needs argument{plural} {names}, but {have}")
    return fn(**(available if takes_all else kwargs))


_CONVERSIONS = (
    jax.errors.ConcretizationTypeError,  # float(x), bool(x), if x: ...
    jax.errors.TracerArrayConversionError,  # np.asarray(x), np.mean(x)
    jax.errors.TracerIntegerConversionError,  # int(x), x.item()
)


def call_for_array(
    fn: Callable[..., Any], what: str, hint: Callable[[], str] | None, /, **available: Any
) -> Any:
    """`call_with_available`, refusing a result that is not an array, named `what` ("loss 'mse'").

    Any other TypeError or ValueError of `fn` gets the note `hint()`.
    """
    fix = (
        "return a jax array, e.g. jnp.mean(x), not float(x), x.item() or np.mean(x), which cannot run in a "
        "compiled step"
    )
    try:
        value = call_with_available(fn, **available)
    except _CONVERSIONS as error:
        raise TypeError(
            f"{what} turned a traced array into a Python or numpy value ({type(error).__name__}): {fix}"
        ) from error
    except (TypeError, ValueError) as error:
        if hint is not None:
            error.add_note(hint())
        raise
    # A numpy array of numbers passes: a batch an eager step was given as it is.
    if not isinstance(value, jax.Array) and not (
        isinstance(value, (np.ndarray, np.generic))
        and (np.issubdtype(value.dtype, np.number) or np.issubdtype(value.dtype, np.bool_))
    ):
        raise TypeError(f"{what} returned {short(value)} (a {type(value).__name__}), not a jax array: {fix}")
    return value


def _zero() -> jax.Array:
    return jnp.zeros((), jnp.float32)


@final
@register_frozen
@dataclasses.dataclass(frozen=True, eq=False)
class Mean:
    """The running mean of a function of the batch; each element of its result counts once.

    Attributes:
        fn: the function, `fn(preds, target, ...) -> array`; static under `jax.jit`.
        total: the sum of the observations so far.
        count: how many observations were summed.

    Example:
        >>> import jax.numpy as jnp
        >>> accuracy = Mean(lambda preds, target: preds.argmax(-1) == target)
        >>> accuracy = accuracy.update(preds=jnp.array([[0.9, 0.1], [0.2, 0.8]]), target=jnp.array([0, 0]))
        >>> accuracy = accuracy.update(preds=jnp.array([[0.3, 0.7]]), target=jnp.array([1]))
        >>> round(float(accuracy.compute()), 4)
        0.6667
    """

    fn: Callable[..., Any] = dataclasses.field(metadata={"static": True})
    total: jax.Array = dataclasses.field(default_factory=_zero)
    count: jax.Array = dataclasses.field(default_factory=_zero)

    def reset(self) -> Mean:
        """Returns the same mean with nothing accumulated."""
        return dataclasses.replace(self, total=_zero(), count=_zero())

    def update(self, **kwargs: Any) -> Mean:
        """Adds the result of `fn` on one batch; see the class docstring."""
        value = jnp.asarray(
            call_for_array(self.fn, f"metric function {_name(self.fn)}", None, **kwargs), jnp.float32
        )
        return dataclasses.replace(self, total=self.total + value.sum(), count=self.count + value.size)

    def merge(self, other: Mean, /) -> Mean:
        """Returns the mean of what both `self` and `other` have seen."""
        return dataclasses.replace(self, total=self.total + other.total, count=self.count + other.count)

    def reduce(self) -> Mean:
        """Sums totals and counts along the leading (stacked) axis."""
        return dataclasses.replace(self, total=self.total.sum(axis=0), count=self.count.sum(axis=0))

    def compute(self) -> jax.Array:
        """Returns `total / count`: NaN when nothing was accumulated."""
        return self.total / self.count


@final
@register_frozen
@dataclasses.dataclass(frozen=True, eq=False)
class CluMetric:
    """Gives a clu metric (`clu.metrics.Metric` or `Collection`) the `Metric` interface: `as_metric(cls)`.

    The keyword names are clu's: its `Accuracy` needs `logits=` and `labels=`.

    Attributes:
        metric: the wrapped clu metric instance (a pytree).
        cls: its class, which makes empty metrics and batch updates (static).

    Example:
        >>> import dataclasses
        >>> @dataclasses.dataclass
        ... class Count:  # stands in for a clu metric, which needs flax
        ...     n: int
        ...     @classmethod
        ...     def empty(cls): return cls(0)
        ...     @classmethod
        ...     def from_model_output(cls, *, target, **_): return cls(len(target))
        ...     def merge(self, other): return Count(self.n + other.n)
        ...     def compute(self): return self.n
        >>> metric = as_metric(Count)
        >>> metric.update(target=[1, 2, 3], preds=[1, 2, 2]).update(target=[4]).compute()
        4
    """

    metric: Any
    cls: type[Any] = dataclasses.field(metadata={"static": True})

    def reset(self) -> CluMetric:
        """Returns `cls.empty()`, wrapped."""
        return dataclasses.replace(self, metric=self.cls.empty())

    def update(self, **kwargs: Any) -> CluMetric:
        """Merges in `cls.from_model_output(**kwargs)`; all keywords are passed on."""
        # A clu `Collection` names it `single_from_model_output`.
        from_model_output = getattr(self.cls, "from_model_output", None) or self.cls.single_from_model_output
        return dataclasses.replace(self, metric=self.metric.merge(from_model_output(**kwargs)))

    def merge(self, other: CluMetric, /) -> CluMetric:
        """Merges the wrapped metrics."""
        return dataclasses.replace(self, metric=self.metric.merge(other.metric))

    def reduce(self) -> CluMetric:
        """Reduces the wrapped metric along its leading axis (clu's `reduce`)."""
        return dataclasses.replace(self, metric=self.metric.reduce())

    def compute(self) -> Any:
        """Returns the wrapped metric's `compute()`."""
        return self.metric.compute()


def _is_clu_class(obj: type[Any]) -> bool:
    return hasattr(obj, "empty") and (
        hasattr(obj, "from_model_output") or hasattr(obj, "single_from_model_output")
    )


_ACCEPTED = (
    "a Metric (reset/update/merge/reduce/compute, e.g. a jax_metrics metric instance), "
    "a clu metric class or instance, or a function fn(preds, target, ...) -> array"
)


def as_metric(obj: object) -> Metric:
    """Turns a metric-like object into a `Metric`.

    A `Metric` is returned as is, a clu metric (class or instance) wrapped in a `CluMetric`, any other
    callable in a `Mean`.

    Raises:
        TypeError: for anything else, including a class that is not a clu metric class.

    Example:
        >>> metric = as_metric(lambda preds, target: (preds - target) ** 2)
        >>> type(metric).__name__
        'Mean'
        >>> as_metric(metric) is metric
        True
    """
    if isinstance(obj, type):
        if _is_clu_class(obj):
            clu_class: type[Any] = obj
            return CluMetric(clu_class.empty(), clu_class)
        hint = " (pass an instance, not the class)" if issubclass(obj, Metric) else ""
        raise TypeError(f"as_metric() got the class {obj.__qualname__}{hint}; it accepts {_ACCEPTED}")
    if isinstance(obj, Metric):
        return obj
    if _is_clu_class(type(obj)) and hasattr(obj, "merge") and hasattr(obj, "compute"):
        return CluMetric(obj, type(obj))
    if callable(obj):
        return Mean(obj)
    raise TypeError(f"as_metric() got {short(obj)} of type {type(obj).__qualname__}; it accepts {_ACCEPTED}")


_RUNNING: dict[Any, Mapping[str, Literal["last"]]] = {}


def running_entries(state: Any) -> Mapping[str, Literal["last"]]:
    """`{"metrics.<entry>": "last"}` for the entries the running metrics (role `METRICS`) of `state` log.

    An evaluation loop keeps their last value. Traced, not computed, once per structure of those fields.
    """
    fields = [getattr(state, name) for name in fields_with_role(type(state), Role.METRICS)]
    if not fields:
        return {}
    structure = jax.tree.structure(fields)
    found = _RUNNING.get(structure)
    if found is None:
        entries: dict[str, Literal["last"]] = {}
        for field in fields:
            named = field.items() if isinstance(field, Mapping) else [("metric", field)]
            for name, metric in named:
                # Traced, not run: a metric whose compute() returns a dict logs its keys.
                value = jax.eval_shape(lambda metric: metric.reset().compute(), metric)
                for entry in value if isinstance(value, Mapping) else (name,):
                    entries[f"metrics.{entry}"] = "last"
        if len(_RUNNING) < 256:  # one per kind of state in a process, in practice
            _RUNNING[structure] = entries
        found = entries
    return found
