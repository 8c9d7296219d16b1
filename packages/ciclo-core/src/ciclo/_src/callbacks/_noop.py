"""A callback that does nothing."""

from __future__ import annotations

from typing import Any, final

from ciclo._src.engine.callback import Callback
from ciclo._src.engine.phases import LoopState


@final
class NoOp(Callback):
    """Does nothing; a placeholder where a callback is required.

    Example:
        >>> import ciclo
        >>> state, history, elapsed = ciclo.loop(1, range(3), {ciclo.every(1): [ciclo.noop]})
        >>> state, len(history), elapsed.steps
        (1, 0, 3)
    """

    def __loop_callback__(self, loop_state: LoopState[Any]) -> None:
        """Returns None: no logs, the state unchanged."""

    def __repr__(self) -> str:
        return "ciclo.noop"


noop = NoOp()
"""The `NoOp` callback."""
