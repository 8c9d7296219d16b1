"""The protocols at ciclo's extension points and the type aliases shared by the modules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from ciclo._src.base.elapsed import Elapsed

S = TypeVar("S")
"""The type of the loop's state."""

State = Any
"""Any pytree (parameters, optimizer state, rng keys, ...); the predefined loops' meet `Trainable` and co."""

Batch = Any
"""One element of a dataset, usually a pytree of arrays."""

LogsLike = Mapping[str, Mapping[str, Any]]
"""Nested mapping `{collection: {entry: value}}`, e.g. `{"metrics": {"loss": 0.3}}`."""

CallbackOutput = tuple[LogsLike, S]
"""What a callback object returns: the logs it adds and the (possibly new) state."""


class Schedule(Protocol):
    """Decides whether its callbacks run at this point of the loop: any `Callable[[Elapsed], bool]`.

    A schedule must fire when the loop *crosses* one of its points, also when
    `elapsed` advances by several steps at once. The built-in ones combine with `&`, `|` and `~`.
    """

    def __call__(self, elapsed: Elapsed, /) -> bool: ...


@runtime_checkable
class StatefulCallback(Protocol):
    """A callback that keeps state across steps, and can hand it out and take it back.

    A backed-up loop saves `state_dict()` (a pytree of arrays, numbers,
    strings and `None`: a snapshot later steps do not change) with the
    training state, under the callback's `state_key` attribute when it has one
    (a non-empty str), else its class's name; a resumed loop hands it back by
    that key with `load_state_dict` before its first step, so the run goes on
    exactly as the uninterrupted one would have. Two stateful callbacks of one
    loop need two keys. ciclo's own: `early_stopping`, `checkpoint` and the loggers.

    Example:
        >>> import ciclo
        >>> class Best:
        ...     best = None
        ...     def __call__(self, state): ...
        ...     def state_dict(self): return {"best": self.best}
        ...     def load_state_dict(self, state): self.best = state["best"]
        >>> isinstance(Best(), ciclo.types.StatefulCallback)
        True
    """

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> None: ...


@runtime_checkable
class Trainable(Protocol):
    """A state that trains: what `ciclo.train_loop` calls at each step.

    `ciclo.types.ModelState`, framework states and any class of your own with a
    `train_step(self, batch)` method returning `(logs, new_state)` satisfy it.

    Example:
        >>> import ciclo
        >>> class Counter:
        ...     def __init__(self, n=0):
        ...         self.n = n
        ...     def train_step(self, batch):
        ...         return ciclo.logs().add_metric("n", self.n + 1), Counter(self.n + 1)
        >>> isinstance(Counter(), ciclo.types.Trainable), ciclo.train_loop(Counter(), range(3))[0].n
        (True, 3)
    """

    def train_step(self, batch: Any, /) -> Any: ...


@runtime_checkable
class Evaluable(Protocol):
    """A state that evaluates: what `ciclo.test_loop` (and `train_loop`'s test loop) calls.

    `reset_step()` returns the state with its running metrics emptied (before
    each evaluation and epoch); `test_step(batch)` returns `(logs, new_state)`.
    """

    def test_step(self, batch: Any, /) -> Any: ...

    def reset_step(self) -> Any: ...


@runtime_checkable
class Predictable(Protocol):
    """A state that predicts: what `ciclo.predict_loop` calls; `predict_step(batch) -> (logs, state)`."""

    def predict_step(self, batch: Any, /) -> Any: ...


class ModelAdapter(Protocol):
    """How a framework's model is initialised and applied: what an adapter package implements.

    `ciclo.create_model_state` builds a training state from any adapter; the
    framework packages are adapters plus a `create_*_state` function. An
    adapter is a static field of the state, so it must be hashable (a frozen
    dataclass with `eq=False`, or a plain class, compares by identity).

    It works on two pytrees of arrays: `params` (what the optimizer trains)
    and `model_state` (what the model updates itself, such as batch-norm
    statistics; `None` when it has none).

    An adapter may also give the trained model back (`ciclo.types.SupportsToModel`).
    """

    def init(self, key: Any, inputs: Any, /) -> tuple[Any, Any]:
        """Creates `(params, model_state)` from a random key and sample inputs.

        Frameworks whose models are built initialised (flax nnx, equinox) hand
        their variables to `ciclo.create_model_state(variables=...)` instead,
        and their `init` raises an error saying so.
        """

    def apply(
        self, params: Any, model_state: Any, inputs: Any, /, *, key: Any, training: bool
    ) -> tuple[Any, Any]:
        """Runs the model on `inputs`: `(outputs, new_model_state)`.

        `key` is a fresh random key for this step (dropout, noise); `training`
        is True in training steps (dropout on, statistics updated).
        """


@runtime_checkable
class SupportsToModel(Protocol):
    """A `ModelAdapter` that gives the trained model back in its framework's own form.

    `to_model`, the one optional method of an adapter, is what
    `ciclo.types.ModelState.model` calls (outside any trace). It returns the
    form the framework's own `init` or constructor gives: ciclo-flax a linen
    module's variables dict (`{"params": ..., "batch_stats": ...}`) or an nnx
    module, ciclo-haiku `params` or `(params, state)`, ciclo-equinox the module
    or `(module, state)`.

    Example:
        >>> import ciclo, jax.numpy as jnp
        >>> class Scale:
        ...     def init(self, key, inputs):
        ...         return jnp.ones(()), None
        ...     def apply(self, params, model_state, inputs, *, key, training):
        ...         return params * inputs, model_state
        ...     def to_model(self, params, model_state):
        ...         return lambda inputs: params * inputs
        >>> isinstance(Scale(), ciclo.types.SupportsToModel)
        True
    """

    def to_model(self, params: Any, model_state: Any, /) -> Any: ...
