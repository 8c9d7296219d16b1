"""Signals: SIGTERM and Ctrl-C turned into a request to stop after the step in flight."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, final

from ciclo._src.engine.callback import Callback

if TYPE_CHECKING:
    from ciclo._src.engine.loop_state import LoopState

_log = logging.getLogger("ciclo")


class ForcedInterrupt(KeyboardInterrupt):
    """A second Ctrl-C: the user insists, and no loop catches it."""


class SignalGuard:
    """Records the first of `signals` (in the main thread); a second SIGINT raises `ForcedInterrupt`.

    `take_over`: catch them whatever handler they have (else only where Python's
    default handler is). `sync_point`: also stop at JAX's preemption sync point.
    """

    def __init__(
        self,
        signals: tuple[int, ...],
        *,
        take_over: bool = False,
        sync_point: bool = False,
        on_signal: Callable[[], None] | None = None,
    ) -> None:
        self.signum: int | None = None
        self._on_signal = on_signal
        self.forced = False  # a second Ctrl-C raised
        self.sync_point = sync_point
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread can handle signals
        for signum in signals:
            current = signal.getsignal(signum)
            if current is None:  # installed outside Python: it could not be put back
                continue
            default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
            if take_over or current is default:
                self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            self.forced = True
            raise ForcedInterrupt  # a second Ctrl-C stops at once
        first = self.signum is None
        self.signum = signum
        if first and self._on_signal is not None:
            self._on_signal()

    def requested(self, steps: int) -> bool:
        """Whether to stop after the step that ended at `steps`."""
        if self.signum is None and self.sync_point:
            from jax.experimental import multihost_utils

            if multihost_utils.reached_preemption_sync_point(steps):
                self.signum = signal.SIGTERM
        return self.signum is not None

    def release(self) -> None:
        """Gives the signals back to the handlers they had."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}


@final
class CatchInterrupt(Callback):
    """`catch_keyboard_interrupt=True`: Ctrl-C stops the loop after the step in flight, which returns.

    A second Ctrl-C is never caught; a backup with `sigint=True` takes Ctrl-C first.
    """

    def on_start(self, loop_state: LoopState[Any], /) -> None:
        self._guard = SignalGuard((signal.SIGINT,), on_signal=loop_state.request_stop)

    def on_end(self, loop_state: LoopState[Any], error: BaseException | None, /) -> None:
        """Gives Ctrl-C back; says where a Ctrl-C stopped the loop."""
        self._guard.release()  # on_end follows a successful on_start only
        if self._guard.signum is not None and error is None:
            _log.warning("KeyboardInterrupt: loop stopped at step %d", loop_state.elapsed.steps)


@contextlib.contextmanager
def held_interrupts() -> Iterator[None]:
    """Holds Ctrl-C back for the block (orbax starting, finishing or deleting a save), then delivers it.

    A second Ctrl-C inside raises at once (the next run removes the unfinished save).
    """
    guard = SignalGuard((signal.SIGINT,), take_over=True)
    try:
        yield
    finally:
        guard.release()
        if guard.signum is not None and not guard.forced:
            signal.raise_signal(signal.SIGINT)
