"""`LoopState`: everything a callback object can see and change while a loop runs."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic

from ciclo._src.base.batches import count
from ciclo._src.base.elapsed import Clock, Elapsed, Period
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

    A callback that steers the run (a backup, Ctrl-C's guard) does so through
    the public methods below; the slots are the engine's.

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
        "_in_step",
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
        self._clock: Any = None  # the engine's counters (None before the loop)
        self._iterator: Any = None
        self._stop: Period | None = None
        self._step_end: list[Callable[[LoopState[Any]], None]] = []
        self._in_step = False  # tasks of a step run; the clock has not counted it yet

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

    def request_stop(self) -> None:
        """Ends the loop after the step in flight, once its hooks ran (safe in a signal handler).

        Example:
            >>> import ciclo
            >>> def halt_at_2(state, elapsed, loop_state):
            ...     if elapsed.steps == 2:
            ...         loop_state.request_stop()
            ...     return state + 1
            >>> ciclo.loop(0, range(10), {ciclo.every(1): halt_at_2})[0]
            3
        """
        self._step_end.append(LoopState.stop)  # a hook only once asked: no cost per step before

    @property
    def steps(self) -> int:
        """The steps the loop has counted, without building an `Elapsed`: in a step, those before it."""
        clock = self._clock
        return self.elapsed.steps if clock is None else clock.steps

    @property
    def in_step(self) -> bool:
        """Whether a step's tasks run (`steps` does not count it yet); False in `on_*` lifecycle methods."""
        return self._in_step

    @property
    def stop_at(self) -> Period | None:
        """The `Period` the loop stops at; None: at the dataset's end."""
        return self._stop

    @property
    def step_logs(self) -> Mapping[str, Any]:
        """The logs of the current step so far, to read only: no copy is made (see `logs`)."""
        return self._logs or {}

    @property
    def iterator(self) -> Iterator[Any]:
        """The iterator the loop draws its batches from; an `on_start` may replace it (to wrap it)."""
        return self._iterator  # type: ignore[no-any-return]

    @iterator.setter
    def iterator(self, iterator: Iterator[Any]) -> None:
        self._iterator = iterator

    def restore(self, state: Any, elapsed: Elapsed) -> None:
        """Goes on from `state` and the counts `elapsed` (in `on_start`: a backup resumes so)."""
        self.state = state
        self._clock, self._elapsed = Clock(elapsed, self._clock.batch_size_fn), None

    def count_samples(self, batch: Any) -> int:
        """The samples `batch` counts for (the loop's `batch_size_fn`)."""
        return count(batch, self._clock.batch_size_fn)[1]

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
