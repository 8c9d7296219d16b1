"""`ciclo.Callback`, the one callback type the engine calls, and the `LoopCallback` protocol it implements.

Every other form of callback becomes a `Callback` in the one door
(`ciclo._src.engine.door`), when the loop is built.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol, runtime_checkable

from ciclo._src.base.types import CallbackOutput, S

if TYPE_CHECKING:
    from ciclo._src.engine.loop_state import LoopState


@runtime_checkable
class LoopCallback(Protocol[S]):
    """A callback object: the loop hands it the whole `LoopState`.

    `ciclo.Callback` implements it; an object that satisfies it without
    subclassing `ciclo.Callback` is adapted when the loop is built, with the
    lifecycle methods and `state_dict` it has. Plain functions are callbacks
    too (see the guide's "Callbacks").
    """

    def __loop_callback__(self, loop_state: LoopState[S], /) -> CallbackOutput[S]:
        """Runs the callback; returns the logs it adds and the new state."""
        ...


CallbackLike = Callable[..., Any] | LoopCallback[Any]
"""A callback object or a callable taking 0 to 4 of `(state, batch, elapsed, loop_state)`."""


Tasks = Mapping[Any, "CallbackLike | list[CallbackLike] | tuple[CallbackLike, ...]"]
"""What `ciclo.loop` runs: schedule -> callback or list of callbacks."""


class Callback:
    """The one callback type: a scheduled call and the moments of a run's life, all no-ops by default.

    Subclass it and override what you need: a method that a class does not
    override is never called, so it costs nothing per step. A backup saves and
    restores `state_dict()` under `state_key`. `hook` places the callback in a
    predefined loop's `callbacks=[...]`.

    Example:
        >>> import ciclo
        >>> class CountSteps(ciclo.Callback):
        ...     def __init__(self):
        ...         self.steps = 0
        ...     def __loop_callback__(self, loop_state):
        ...         self.steps += 1
        ...     def state_dict(self):
        ...         return {"steps": self.steps}
        ...     def load_state_dict(self, state):
        ...         self.steps = state["steps"]
        >>> counter = CountSteps()
        >>> _ = ciclo.loop(None, range(3), {ciclo.every(1): counter})
        >>> counter.state_dict()
        {'steps': 3}
    """

    __slots__ = ()

    hook: ClassVar[str | tuple[str, ...] | Mapping[str, Callable[..., Any]] | None] = None
    """Where a predefined loop's `callbacks=[...]` places it: a hook, the first of several the loop runs,
    or a dict hook -> its method run there (None: the hooks its methods are named after)."""

    def __loop_callback__(self, loop_state: LoopState[Any], /) -> Any:
        """Runs at each step its schedule fires; returns `(logs, state)`, `logs`, `state` or None."""
        return None

    def on_start(self, loop_state: LoopState[Any], /) -> None:
        """Runs once before the first step (after a resumed run handed back the callbacks' states)."""

    def on_step_end(self, loop_state: LoopState[Any], /) -> None:
        """Runs after each committed step (backups, signals), seeing the counts after it."""

    def on_end(self, loop_state: LoopState[Any], error: BaseException | None, /) -> None:
        """Runs once when the loop ends; `error` is what ended it (raised on after), else None."""

    def state_dict(self) -> Any:
        """A snapshot of the state kept across steps (see `ciclo.types.StatefulCallback`)."""
        return None

    def load_state_dict(self, state: Any, /) -> None:
        """Takes back a snapshot made by `state_dict`."""

    @property
    def state_key(self) -> str:
        """The key a backup saves `state_dict()` under: the class's name unless a subclass says."""
        return type(self).__qualname__


LIFECYCLE: Final = ("on_start", "on_step_end", "on_end")


def vars_lookup(cls: type, name: str) -> Any:
    """`name` as `cls` or a class it inherits from defines it (no descriptor run), else None."""
    return inspect.getattr_static(cls, name, None)
