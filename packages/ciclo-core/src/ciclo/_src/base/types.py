"""The protocols at ciclo's extension points and the type aliases shared by the modules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from ciclo._src.base.elapsed import Elapsed

S = TypeVar("S")

State = Any
"""Any pytree (parameters, optimizer state, rng keys, ...); the predefined loops' meet `Trainable` and co."""

Batch = Any
"""One element of a dataset, usually a pytree of arrays."""

LogsLike = Mapping[str, Mapping[str, Any]]
"""Nested mapping `{collection: {entry: value}}`, e.g. `{"metrics": {"loss": 0.3}}`."""

CallbackOutput = tuple[LogsLike, S]
"""What a callback object returns: the logs it adds and the (possibly new) state."""


class Schedule(Protocol):
    """Decides whether callbacks run: a `Callable[[Elapsed], bool]` that fires when a point is *crossed*."""

    def __call__(self, elapsed: Elapsed, /) -> bool: ...


@runtime_checkable
class StatefulCallback(Protocol):
    """A callback whose state a backup saves (`state_dict()`) and a resume hands back; see docs/guide.md.

    Saved under its `state_key` attribute when it has one, else its class's name.

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
    """A state that trains: `train_step(batch) -> (logs, new_state)`, what `ciclo.train_loop` calls.

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
    """A state that evaluates (`ciclo.test_loop`); `reset_step()` returns it with its metrics emptied."""

    def test_step(self, batch: Any, /) -> Any: ...

    def reset_step(self) -> Any: ...


@runtime_checkable
class Predictable(Protocol):
    """A state that predicts: what `ciclo.predict_loop` calls; `predict_step(batch) -> (logs, state)`."""

    def predict_step(self, batch: Any, /) -> Any: ...


@runtime_checkable
class Placed(Protocol):
    """A state that says where it lives: `train_loop(prefetch=...)` places its batches by its `strategy`."""

    @property
    def strategy(self) -> Any: ...


@runtime_checkable
class CarriesOptimizer(Protocol):
    """A state that carries its optimizer and training options (a managed state), as `ciclo.lr_find` needs."""

    @property
    def tx(self) -> Any: ...

    @property
    def opt_state(self) -> Any: ...

    @property
    def options(self) -> Any: ...

    def replace(self, **changes: Any) -> Any: ...


class ModelAdapter(Protocol):
    """How a framework's model is initialised and applied: what an adapter implements (docs/adapter.md).

    It must be hashable (a static field of the state), and works on `params` (what the optimizer
    trains) and `model_state` (what the model updates itself, or `None`).
    """

    def init(self, key: Any, inputs: Any, /) -> tuple[Any, Any]:
        """Creates `(params, model_state)` from a random key and sample inputs."""

    def apply(
        self, params: Any, model_state: Any, inputs: Any, /, *, key: Any, training: bool
    ) -> tuple[Any, Any]:
        """Runs the model on `inputs` with a fresh `key`: `(outputs, new_model_state)`."""


@runtime_checkable
class SupportsToModel(Protocol):
    """A `ModelAdapter` whose `to_model` gives the trained model back in its framework's form.

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
