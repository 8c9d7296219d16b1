"""The managed API: a state that carries its optimizer and strategy, and steps that only report losses.

`train_step` differentiates the sum of the `losses` a step logs, applies the
optimizer and runs the whole step under the state's strategy; `step` runs a
step under the strategy without updating anything. Neither needs a framework:
`ManagedState` is a plain pytree dataclass.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, cast, final, overload

import jax
import jax.numpy as jnp
import optax
from typing_extensions import Self, dataclass_transform

from ciclo._src.batches import Stacked, is_stacked
from ciclo._src.fused import as_logs_and_state, scan_steps
from ciclo._src.logs import Entries, Logs
from ciclo._src.metrics import Metric
from ciclo._src.strategies._local import Eager
from ciclo._src.strategies._registry import get_strategy
from ciclo._src.types import Strategy

S = TypeVar("S")

StepBody = Callable[[Any, Any], Any]
"""What a managed step wraps: `(state, batch) -> (logs, state)`, `logs`, or `None`."""

MODEL_STATE_FIELDS = ("batch_stats", "model_state")
"""State fields a training step synchronises across devices after the update."""

_STATIC = {"static": True}


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(dataclasses.field,))
@dataclasses.dataclass(frozen=True, kw_only=True)
class ManagedState:
    """A training state that knows its optimizer and its strategy; a pytree.

    Subclass it to add fields (rng keys, metrics, batch statistics): subclasses
    become frozen, keyword-only dataclasses registered as pytrees, with nothing
    to decorate or register. A field holding configuration rather than arrays
    must be static: `dataclasses.field(metadata={"static": True})`.

    Attributes:
        step: the number of optimizer updates applied (an int32 array).
        params: the trained parameters, any pytree.
        opt_state: the optimizer's state.
        tx: the optax optimizer (static).
        apply_fn: the model's apply function, for the step's use (static).
        strategy: where the state lives and how steps compile (static).

    Example:
        >>> import jax, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> class State(managed.ManagedState):
        ...     key: jax.Array
        >>> state = State.create(params={"w": jnp.zeros(2)}, tx=optax.sgd(0.1), key=jax.random.key(0))
        >>> state = state.apply_gradients(grads={"w": jnp.ones(2)})
        >>> state.params["w"], int(state.step)
        (Array([-0.1, -0.1], dtype=float32), 1)
    """

    step: jax.Array
    params: Any
    opt_state: Any
    tx: optax.GradientTransformation = dataclasses.field(metadata=_STATIC)
    apply_fn: Callable[..., Any] | None = dataclasses.field(default=None, metadata=_STATIC)
    strategy: Strategy = dataclasses.field(default_factory=Eager, metadata=_STATIC)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(frozen=True, kw_only=True)(cls)
        jax.tree_util.register_dataclass(cls)

    @classmethod
    def create(
        cls,
        *,
        params: Any,
        tx: optax.GradientTransformation,
        apply_fn: Callable[..., Any] | None = None,
        strategy: str | Strategy = "jit",
        **fields: Any,
    ) -> Self:
        """Makes a state at step 0 with a fresh optimizer state, placed for `strategy`.

        Args:
            params: the parameters to train, any pytree of arrays.
            tx: an optax optimizer.
            apply_fn: the model's apply function, kept for the steps' use.
            strategy: a strategy or its name (see `ciclo.get_strategy`).
            **fields: the values of a subclass's own fields.
        """
        state = cls(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=tx.init(params),
            tx=tx,
            apply_fn=apply_fn,
            strategy=Eager(),
            **fields,
        )
        return state.with_strategy(strategy)

    def replace(self, **changes: Any) -> Self:
        """A copy with some fields changed."""
        return dataclasses.replace(cast(Any, self), **changes)  # type: ignore[no-any-return]

    def apply_gradients(self, *, grads: Any, **changes: Any) -> Self:
        """Applies one optimizer update: new params and opt_state, `step + 1`."""
        updates, opt_state = self.tx.update(grads, self.opt_state, self.params)
        params = optax.apply_updates(self.params, updates)
        return self.replace(step=self.step + 1, params=params, opt_state=opt_state, **changes)

    def with_strategy(self, strategy: str | Strategy) -> Self:
        """Moves the state to another strategy (`"eager"` brings it back to one device).

        Example:
            >>> import jax.numpy as jnp, optax
            >>> from ciclo import managed
            >>> state = managed.ManagedState.create(params=jnp.zeros(2), tx=optax.sgd(0.1))
            >>> state.with_strategy("data_parallel").strategy
            DataParallel(axis_name='data', donate=False)
        """
        new = get_strategy(strategy)
        if new == self.strategy:
            return self
        on_host = self.strategy.to_host(self)
        return new.from_host(on_host.replace(strategy=new))


jax.tree_util.register_dataclass(ManagedState)


@final
class ManagedStep(Generic[S]):
    """A step function run under a strategy: what `train_step` and `step` return.

    Call it as `logs, state = step(state, batch)`. It compiles once per
    strategy: the state's own (`state.strategy`) when it has one, else the one
    given to the decorator, else `"jit"`. Defined in a class body, it binds
    like a method: `state.train_step(batch)`.
    """

    __slots__ = ("__name__", "__wrapped__", "_cache", "_compiled", "_default", "_fused", "_update")

    def __init__(self, fn: StepBody, strategy: str | Strategy | None, *, update: bool) -> None:
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self._default = get_strategy(strategy if strategy is not None else "jit")
        self._update = update
        self._compiled: dict[Strategy, Callable[[Any, Any], tuple[Logs, Any]]] = {}
        self._fused: dict[Strategy, Callable[[Any, Any], tuple[Logs, Any]]] = {}
        self._cache: tuple[Strategy | None, Callable[[Any, Any], tuple[Logs, Any]] | None] = (None, None)

    def __repr__(self) -> str:
        kind = "train_step" if self._update else "step"
        return f"managed.{kind}({self.__name__})"

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> Self: ...

    @overload
    def __get__(self, instance: S, owner: type[Any]) -> Callable[[Any], tuple[Logs, S]]: ...

    def __get__(self, instance: S | None, owner: type[Any]) -> Self | Callable[[Any], tuple[Logs, S]]:
        return self if instance is None else functools.partial(self, instance)

    def __call__(self, state: S, batch: Any) -> tuple[Logs, S]:
        """Runs one step, or all steps of a `ciclo.Stacked` batch in one dispatch: `(logs, new_state)`."""
        strategy = getattr(state, "strategy", None) or self._default
        if is_stacked(batch):
            return self._call_fused(strategy, state, batch)
        last, compiled = self._cache
        if strategy is not last or compiled is None:
            compiled = self._compiled.get(strategy)
            if compiled is None:
                compiled = self._compiled[strategy] = self._compile(strategy, state, fused=False)
            self._cache = (strategy, compiled)
        logs, state = compiled(state, strategy.lift_batch(batch))
        return strategy.lower_logs(logs), state

    def _call_fused(self, strategy: Strategy, state: S, batch: Stacked[Any]) -> tuple[Logs, S]:
        lifted = strategy.lift_batch(batch)
        compiled = self._fused.get(strategy)
        if compiled is None:
            compiled = self._fused[strategy] = self._compile(strategy, state, fused=True)
        logs, state = compiled(state, lifted)
        return strategy.lower_logs(logs), state

    def _compile(
        self, strategy: Strategy, state: Any, *, fused: bool
    ) -> Callable[[Any, Any], tuple[Logs, Any]]:
        if self._update:
            _check_trainable(state)
        body = _train_body(self.__wrapped__, strategy) if self._update else _body(self.__wrapped__, strategy)
        if fused:
            return strategy.compile(lambda state, stacked: scan_steps(body, state, stacked.batches))
        return strategy.compile(body)


@overload
def train_step(fn: StepBody, /, strategy: str | Strategy | None = None) -> ManagedStep[Any]: ...


@overload
def train_step(*, strategy: str | Strategy | None = None) -> Callable[[StepBody], ManagedStep[Any]]: ...


def train_step(
    fn: StepBody | None = None, /, strategy: str | Strategy | None = None
) -> ManagedStep[Any] | Callable[[StepBody], ManagedStep[Any]]:
    """Turns a step that logs losses into a training step: gradients and update are ciclo's.

    The step `fn(state, batch)` returns `(logs, state)` (or just `logs`) with at
    least one scalar entry in the `losses` collection. ciclo differentiates the
    sum of the losses with respect to `state.params`, combines the gradients of
    all devices, applies `state.apply_gradients`, synchronises `batch_stats` /
    `model_state` fields, and runs all of it under the strategy.

    Logs come back per collection: losses and metrics averaged over devices,
    outputs concatenated in batch order. A logged stateful metric (see
    `ciclo.Metric`), typically a state field after its `update`, is logged as
    its `compute()`; under `pmap`, where each device's copy has seen only that
    device's rows, the copies are first combined with `merge`/`reduce`.

    Args:
        fn: the step; `train_step` also works as `@train_step(strategy=...)`.
        strategy: the strategy for states that carry none (default `"jit"`).

    Raises:
        ValueError: at the first call, if the logs have no losses or a loss is not a scalar.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> @managed.train_step
        ... def train_step(state, batch):
        ...     x, y = batch
        ...     loss = jnp.mean((x @ state.params - y) ** 2)
        ...     return ciclo.logs().add_loss("mse", loss), state
        >>> state = managed.ManagedState.create(params=jnp.zeros(2), tx=optax.sgd(0.5))
        >>> batch = (jnp.array([[1.0, 0.0], [0.0, 1.0]]), jnp.array([1.0, -1.0]))
        >>> for _ in range(50):
        ...     logs, state = train_step(state, batch)
        >>> state.params, float(logs.losses.mse) < 1e-4
        (Array([ 1., -1.], dtype=float32), True)
    """
    if fn is None:
        return lambda fn: ManagedStep(fn, strategy, update=True)
    return ManagedStep(fn, strategy, update=True)


@overload
def step(fn: StepBody, /, strategy: str | Strategy | None = None) -> ManagedStep[Any]: ...


@overload
def step(*, strategy: str | Strategy | None = None) -> Callable[[StepBody], ManagedStep[Any]]: ...


def step(
    fn: StepBody | None = None, /, strategy: str | Strategy | None = None
) -> ManagedStep[Any] | Callable[[StepBody], ManagedStep[Any]]:
    """Runs a step under the state's strategy, with no gradients and no update.

    For evaluation and inference: logs are lowered as in `train_step`, and a
    returned state (updated metrics, say) is kept.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> @managed.step
        ... def test_step(state, batch):
        ...     x, y = batch
        ...     return ciclo.logs().add_metric("mse", jnp.mean((x @ state.params - y) ** 2)), state
        >>> state = managed.ManagedState.create(params=jnp.ones(2), tx=optax.sgd(0.1))
        >>> logs, state = test_step(state, (jnp.eye(2), jnp.zeros(2)))
        >>> float(logs.metrics.mse)
        1.0
    """
    if fn is None:
        return lambda fn: ManagedStep(fn, strategy, update=False)
    return ManagedStep(fn, strategy, update=False)


def _check_trainable(state: Any) -> None:
    missing = [name for name in ("params", "apply_gradients", "replace") if not hasattr(state, name)]
    if missing:
        raise TypeError(
            f"managed.train_step needs a state with params, apply_gradients and replace (a "
            f"managed.ManagedState); {type(state).__name__} has no {', '.join(missing)}"
        )


def _total_loss(logs: Logs, fn: StepBody) -> jax.Array:
    losses = logs.get("losses")
    if not losses:
        raise ValueError(
            f"managed.train_step: {getattr(fn, '__name__', fn)!r} logged no losses (collections: "
            f"{sorted(logs)}); add the loss to differentiate with logs.add_loss('loss', value)"
        )
    total = jnp.zeros((), jnp.float32)
    for name, value in losses.items():
        shape = jnp.shape(value)
        if shape != ():
            raise ValueError(
                f"managed.train_step: loss {name!r} has shape {shape}, but losses must be scalars; "
                "reduce it over the batch first, e.g. with .mean()"
            )
        total = total + value
    return total


def _train_body(fn: StepBody, strategy: Strategy) -> Callable[[Any, Any], tuple[Logs, Any]]:
    def train(state: Any, batch: Any) -> tuple[Logs, Any]:
        def loss(params: Any) -> tuple[jax.Array, tuple[Logs, Any]]:
            logs, new_state = as_logs_and_state(fn, state.replace(params=params), batch)
            return _total_loss(logs, fn), (logs, new_state)

        (_, (logs, new_state)), grads = jax.value_and_grad(loss, has_aux=True)(state.params)
        new_state = new_state.apply_gradients(grads=strategy.reduce_grads(grads))
        synced = {
            name: strategy.reduce_model_state(getattr(new_state, name))
            for name in MODEL_STATE_FIELDS
            if getattr(new_state, name, None) is not None
        }
        if synced:
            new_state = new_state.replace(**synced)
        return _finish(logs, new_state, strategy)

    return train


def _body(fn: StepBody, strategy: Strategy) -> Callable[[Any, Any], tuple[Logs, Any]]:
    def run(state: Any, batch: Any) -> tuple[Logs, Any]:
        logs, new_state = as_logs_and_state(fn, state, batch)
        return _finish(logs, new_state, strategy)

    return run


def _finish(logs: Logs, state: Any, strategy: Strategy) -> tuple[Logs, Any]:
    """Replaces stateful metrics in the logs by their values, then reduces the logs over devices."""
    lowered = Logs()
    for collection, entries in logs.items():
        values = lowered[collection] = Entries()
        for name, value in entries.items():
            if not isinstance(value, Metric):
                values[name] = value
                continue
            computed = strategy.reduce_metric(value).compute()
            if isinstance(computed, Mapping):
                values.update(computed)
            else:
                values[name] = computed
    return strategy.reduce_logs(lowered), state
