"""clu's periodic actions as ciclo callbacks: an adapter, so that the engine knows no clu.

A `clu.periodic_actions.PeriodicAction` (`ReportProgress`, `Profile`, ...) is
called with the step number; `as_loop_callback` wraps one in a callback object
that calls it with the steps done. ciclo never imports clu: an object is only
recognised as a periodic action once the user has imported clu.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, final

from ciclo._src.types import CallbackOutput, S

if TYPE_CHECKING:
    from ciclo._src.loop_state import LoopState


@final
class PeriodicActionCallback:
    """Calls a clu `PeriodicAction` with the loop's step count, at each step its schedule fires."""

    def __init__(self, action: Any) -> None:
        self.action = action

    def __loop_callback__(self, loop_state: LoopState[S], /) -> CallbackOutput[S]:
        self.action(loop_state.elapsed.steps)
        return {}, loop_state.state

    def __repr__(self) -> str:
        return f"PeriodicActionCallback({type(self.action).__name__})"


def as_loop_callback(obj: Any) -> PeriodicActionCallback | None:
    """`obj` wrapped as a callback when it is a clu `PeriodicAction`; None otherwise."""
    module = sys.modules.get("clu.periodic_actions")  # looked up only if the user imported clu
    if module is not None and isinstance(obj, module.PeriodicAction):
        return PeriodicActionCallback(obj)
    return None
