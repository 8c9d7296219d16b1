"""The strategy protocols: `Strategy` (placement, compilation) and `DeviceReductions` (in-step reductions)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

from ciclo._src.logs.logs import Logs

T = TypeVar("T")
M = TypeVar("M")

StepFn = Callable[[Any, Any], tuple[Logs, Any]]


@runtime_checkable
class Strategy(Protocol):
    """Where a managed step's state and batches live, and how the step is compiled (docs/strategies.md).

    A hashable value whose five methods all run outside the step.

    Example:
        >>> import ciclo
        >>> isinstance(ciclo.strategies.get_strategy("fsdp"), ciclo.strategies.Strategy)
        True
    """

    def create(self, init: Callable[..., T], /, *args: Any) -> T:
        """Runs `init(*args)` and returns its result placed (a sharding strategy builds it sharded)."""

    def place(self, state: T, /) -> T:
        """Puts a state in its own shapes, wherever its arrays are now, where the step expects it."""

    def unplace(self, state: T, /) -> T:
        """Undoes what `place` added to the state's shapes (`pmap`'s device axis), for another `place`."""

    def lift_batch(self, batch: T, /) -> T:
        """Places one batch (this process's part of it) for the compiled step."""

    def compile(self, step: StepFn, /, *, donate: bool = False) -> StepFn:
        """Transforms `step(state, batch) -> (logs, state)`; `donate`: it may consume the state passed in."""


@runtime_checkable
class DeviceReductions(Protocol):
    """In-step reductions of a strategy that runs one program per device, such as `pmap`.

    Example:
        >>> import ciclo
        >>> from ciclo.strategies import DeviceReductions
        >>> names = ("pmap", "data_parallel")
        >>> [isinstance(ciclo.strategies.get_strategy(name), DeviceReductions) for name in names]
        [True, False]
    """

    def reduce_grads(self, grads: T, /) -> T:
        """Inside the step: combines the gradients of all devices."""

    def reduce_model_state(self, model_state: T, /) -> T:
        """Inside the step: synchronises model state such as batch statistics."""

    def reduce_logs(self, logs: Logs, /) -> Logs:
        """Inside the step: averages losses and metrics over devices; leaves outputs per device."""

    def reduce_metric(self, metric: M, /) -> M:
        """Inside the step: merges the per-device copies of a stateful metric."""
