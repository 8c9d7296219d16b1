"""`LoopState`: everything a callback object can see and change while a loop runs."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Generic

from ciclo._src.base.elapsed import Elapsed
from ciclo._src.base.reprs import short
from ciclo._src.base.types import S
from ciclo._src.logs.logs import History, Logs, LogsLike

_log = logging.getLogger("ciclo")


class LoopState(Generic[S]):
    """Everything a callback object can see and change while a loop runs.

    Attributes:
        state: the current state.
        batch: the current batch.
        history: the `History` the loop commits to.
        metadata: whatever was passed as `metadata` to the loop.
        stop_iteration: set to True (or call `stop()`) to end the loop after the current callback.

    Example:
        >>> import ciclo
        >>> def peek(state, batch, elapsed, loop_state):
        ...     return ciclo.logs().add_metric("seen", len(loop_state.history))
        >>> _, history, _ = ciclo.loop(None, range(3), {ciclo.every(1): [peek]})
        >>> history.collect("seen")
        [0, 1, 2]
    """

    __slots__ = (
        "_accumulated",
        "_callback_objects",
        "_clock",
        "_elapsed",
        "_logs",
        "_owns_logs",
        "_iterator",
        "_per_step",
        "_step_end",
        "_stop",
        "batch",
        "history",
        "metadata",
        "state",
        "stop_iteration",
    )

    def __init__(
        self,
        state: S,
        batch: Any = None,
        history: History | None = None,
        elapsed: Elapsed | None = None,
        logs: LogsLike | None = None,
        accumulated_logs: Logs | None = None,
        metadata: Any = None,
        stop_iteration: bool = False,
    ) -> None:
        self.state = state
        self.batch = batch
        self.history = History() if history is None else history
        self.metadata = metadata
        self.stop_iteration = stop_iteration
        self._elapsed = elapsed
        self._per_step: Logs | None = None  # a fused group's logs of every step
        self._logs: LogsLike | None = logs
        self._owns_logs = False  # whether `_logs` is the loop's own copy, safe to merge into
        self._accumulated = accumulated_logs
        self._callback_objects: dict[str, Any] = {}  # by state_key
        # What a backup restores and saves through (the `Clock`: None outside the loop).
        self._clock: Any = None
        self._iterator: Any = None
        self._stop: Any = None
        self._step_end: list[Callable[[LoopState[Any]], None]] = []

    @property
    def elapsed(self) -> Elapsed:
        """The counts before the current step (after it in a task scheduled with `ciclo.at_step_end`)."""
        elapsed = self._elapsed
        if elapsed is None:
            if self._clock is None:
                raise RuntimeError("this LoopState has no elapsed yet: the loop has not started")
            elapsed = self._elapsed = self._clock.now()
        return elapsed

    @property
    def logs(self) -> Logs:
        """The logs of the current step so far; changes to it are committed with the step."""
        logs = self._logs
        if not self._owns_logs or type(logs) is not Logs:  # a reader may change it: the loop's own copy
            logs = self._logs = Logs(logs)
            self._owns_logs = True
        return logs

    @property
    def accumulated_logs(self) -> Logs:
        """The latest value of every entry logged so far, this step's logs included."""
        if self._accumulated is not None:
            return self._accumulated
        accumulated = self.history.latest()
        if self._logs:
            accumulated.merge(self._logs)
        return accumulated

    def stop(self) -> None:
        """Ends the loop once the current callback returns."""
        self.stop_iteration = True

    def state_dicts(self) -> dict[str, Any]:
        """The `state_dict()` of every stateful callback of this loop, by its `state_key`.

        Example:
            >>> import ciclo
            >>> stopper = ciclo.early_stopping("loss", patience=2)
            >>> def step(state, batch):
            ...     return ciclo.logs().add_loss("loss", 1.0 / (batch + 1)), state
            >>> def grab(state, batch, elapsed, loop_state):
            ...     return None, loop_state.state_dicts()
            >>> state, _, _ = ciclo.loop(None, [0, 1], {ciclo.every(1): [step, stopper, grab]})
            >>> list(state), state["EarlyStopping(loss, min)"]["best"]
            (['EarlyStopping(loss, min)'], 0.5)
        """
        return {key: obj.state_dict() for key, obj in self._callback_objects.items()}

    def load_state_dicts(self, states: Mapping[str, Any]) -> None:
        """Hands each stateful callback its snapshot from `state_dicts()`; warns of those missing."""
        for key in sorted(set(states) - set(self._callback_objects)):
            _log.warning("dropping the saved state of callback %s: no callback here has that key", short(key))
        for key, obj in self._callback_objects.items():
            if key in states:
                obj.load_state_dict(states[key])
            else:
                _log.warning("callback %s has no saved state: it starts afresh", short(key))
