"""The strategy protocols: `Strategy` (placement, compilation) and `DeviceReductions` (in-step reductions)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

from ciclo._src.logs.logs import Logs

T = TypeVar("T")
"""Any pytree handed through a strategy unchanged in structure."""

M = TypeVar("M")
"""A stateful metric (see `ciclo.metrics.Metric`)."""


StepFn = Callable[[Any, Any], tuple[Logs, Any]]
"""A step as a strategy compiles it: `(state, batch) -> (logs, state)`."""


@runtime_checkable
class Strategy(Protocol):
    """Where a managed step's state and batches live, and how the step is compiled.

    A strategy is a hashable value (the built-ins are frozen dataclasses), so a
    managed step compiles once per strategy. Its five methods all run outside
    the step. A strategy that runs one program per device and must combine the
    devices' values inside the step (`pmap`) also implements
    `ciclo.strategies.DeviceReductions`; the others let the compiler insert
    whatever collectives the global computation needs.

    Register a new strategy by name with `ciclo.strategies.register_strategy`.

    Example:
        >>> import ciclo
        >>> isinstance(ciclo.strategies.get_strategy("fsdp"), ciclo.strategies.Strategy)
        True
    """

    def create(self, init: Callable[..., T], /, *args: Any) -> T:
        """Runs `init(*args)` and returns its result placed for this strategy.

        A strategy that shards the state builds it sharded (under `jax.jit`
        with output shardings), so no device ever holds it whole.
        """
        ...

    def place(self, state: T, /) -> T:
        """Puts a state in its own shapes, wherever its arrays are now, where the step expects it.

        The arrays may be on the host, on one device, or laid out by another
        strategy (`unplace` output): a mesh strategy reshards them device to
        device, a one-device strategy brings them whole to one device.
        """
        ...

    def unplace(self, state: T, /) -> T:
        """Undoes what `place` added to the state's shapes (`pmap`'s device axis), for another `place`."""
        ...

    def lift_batch(self, batch: T, /) -> T:
        """Places one batch (this process's part of it) for the compiled step."""
        ...

    def compile(self, step: StepFn, /, *, donate: bool = False) -> StepFn:
        """Transforms `step(state, batch) -> (logs, state)` to run under this strategy.

        The compiled step returns the logs this process reports (e.g. its own
        rows of the outputs) and never waits on the device to do so.

        Args:
            step: the step to compile.
            donate: whether the compiled step may consume the buffers of the
                state passed in. Managed training steps pass True; evaluation
                steps pass False, so the state a test pass reads stays valid. A
                strategy that donates (`jit_donate`, `donate=True`) donates only
                when this is True; one that never donates ignores it.
        """
        ...


@runtime_checkable
class DeviceReductions(Protocol):
    """In-step reductions of a strategy that runs one program per device, such as `pmap`.

    Managed steps look for these methods once, when they compile a step under
    a strategy, and call them inside the step to combine the devices' values.
    A strategy without them (every built-in but `pmap`) combines nothing.

    Example:
        >>> import ciclo
        >>> from ciclo.strategies import DeviceReductions
        >>> names = ("pmap", "data_parallel")
        >>> [isinstance(ciclo.strategies.get_strategy(name), DeviceReductions) for name in names]
        [True, False]
    """

    def reduce_grads(self, grads: T, /) -> T:
        """Inside the step: combines the gradients of all devices."""
        ...

    def reduce_model_state(self, model_state: T, /) -> T:
        """Inside the step: synchronises model state such as batch statistics."""
        ...

    def reduce_logs(self, logs: Logs, /) -> Logs:
        """Inside the step: averages losses and metrics over devices; leaves outputs per device."""
        ...

    def reduce_metric(self, metric: M, /) -> M:
        """Inside the step: merges the per-device copies of a stateful metric."""
        ...
