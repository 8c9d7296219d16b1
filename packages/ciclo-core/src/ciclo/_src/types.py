"""The protocols at ciclo's extension points and the type aliases shared by the modules."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from ciclo._src.elapsed import BatchSizeFn as BatchSizeFn
from ciclo._src.logs import LogsLike

if TYPE_CHECKING:
    from ciclo._src.elapsed import Elapsed
    from ciclo._src.loop import LoopState

S = TypeVar("S")
"""The type of the loop's state."""

State = Any
"""Any pytree: parameters, optimizer state, rng keys, ... grouped in one value."""

Batch = Any
"""One element of a dataset, usually a pytree of arrays."""

CallbackOutput = tuple[LogsLike, S]
"""What a callback object returns: the logs it adds and the (possibly new) state."""


class Schedule(Protocol):
    """Decides whether its callbacks run at this point of the loop.

    Any `Callable[[Elapsed], bool]` is a schedule. The built-in ones (`every`,
    `after`, `always`, `never`, `piecewise`) also combine with `&`, `|` and `~`.
    A schedule must fire when the loop *crosses* one of its points, also when
    `elapsed` advances by several steps at once.
    """

    def __call__(self, elapsed: Elapsed, /) -> bool:
        """Returns True when the callbacks of this schedule should run."""
        ...


@runtime_checkable
class LoopCallback(Protocol[S]):
    """A callback object: the loop hands it the whole `LoopState`.

    Plain functions are callbacks too: any callable taking 0 to 4 of
    `(state, batch, elapsed, loop_state)` (in that order) and returning
    `(logs, state)`, `logs` (a dict), `state`, or `None`. An object may also
    define `__loop_end__(loop_state)`, which the loop calls once when it ends
    (progress bars use it to draw their last line; checkpointers to finish
    writing).
    """

    def __loop_callback__(self, loop_state: LoopState[S], /) -> CallbackOutput[S]:
        """Runs the callback; returns the logs it adds and the new state."""
        ...


CallbackLike = Callable[..., Any] | LoopCallback[Any]
"""A callback object or a callable taking 0 to 4 of `(state, batch, elapsed, loop_state)`."""

ScheduleLike = Schedule | str
"""A schedule, or the name of a named schedule of the predefined loops."""

Tasks = Mapping[Any, "CallbackLike | list[CallbackLike] | tuple[CallbackLike, ...]"]
"""What `ciclo.loop` runs: schedule -> callback or list of callbacks."""
