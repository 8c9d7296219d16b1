"""`LoopState`: everything a callback object can see and change while a loop runs."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from ciclo._src.base.elapsed import Elapsed
from ciclo._src.base.reprs import short
from ciclo._src.logs.logs import History, Logs, LogsLike

S = TypeVar("S")

_log = logging.getLogger("ciclo")


def keyed_callbacks(callbacks: Iterable[Any]) -> dict[str, Any]:
    """Stateful `callbacks` by `state_key`; two with one key are refused, before any step runs."""
    keyed: dict[str, Any] = {}
    for callback in callbacks:
        key = callback.state_key
        if not isinstance(key, str) or not key:
            raise TypeError(f"the state_key of {short(callback)} must be a non-empty str, got {short(key)}")
        if key in keyed:
            raise ValueError(
                f"two stateful callbacks of this loop save their state under the key {short(key)}: "
                f"{short(keyed[key])} and {short(callback)}; give one of them "
                "another name= (or, for your own callback, a state_key attribute)"
            )
        keyed[key] = callback
    return keyed


class LoopState(Generic[S]):
    """Everything a callback object can see and change while a loop runs.

    Attributes:
        state: the current state.
        batch: the current batch.
        history: the `History` the loop commits to.
        elapsed: the `Elapsed` of the current step (the counts *before* it); in a
            task scheduled with `ciclo.at_step_end`, the counts after it.
        logs: the logs of the current step so far.
        accumulated_logs: the latest value of every entry logged so far, this
            step's included (monitors such as early stopping read test metrics
            here). Derived from the history when read, so keeping it costs the
            loop nothing per step.
        metadata: whatever was passed as `metadata` to the loop.
        stop_iteration: set to True (or call `stop()`) to end the loop after the
            current callback.

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
        "_dataset",
        "_drawn",
        "_elapsed",
        "_ended",
        "_logs",
        "_now",
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
        self._now: Callable[[], Elapsed] | None = None
        self._per_step: Logs | None = None  # a fused group's per-step logs, committed as one entry per step
        self._logs: LogsLike | None = logs
        self._owns_logs = False  # whether `_logs` is the loop's own copy, safe to merge into
        self._accumulated = accumulated_logs
        self._callback_objects: dict[str, Any] = {}
        self._ended = False  # the steps are over: on_end callbacks and end hooks run
        # What the engine hands the run's lifecycle (a backup restores and saves through them):
        self._clock: Any = None  # the step, sample and time counters (`ciclo._src.base.elapsed.Clock`)
        self._dataset: Any = None  # the dataset as the loop was given it
        self._iterator: Any = None  # what the loop draws batches from; on_start may replace it
        self._drawn = 0  # batches drawn from the dataset by this run and the runs it resumes
        self._stop: Any = None  # the loop's `stop`, as a `Period` or None
        # The hooks run after each step. One added here (a signal handler may add one) runs from
        # the end of the step in flight on: a callback pays for step ends only once it needs them.
        self._step_end: list[Callable[[LoopState[Any]], None]] = []

    @property
    def elapsed(self) -> Elapsed:
        """The `Elapsed` of the current step, built on first use in each step."""
        elapsed = self._elapsed
        if elapsed is None:
            if self._now is None:
                raise RuntimeError("this LoopState has no elapsed yet: the loop has not started")
            elapsed = self._elapsed = self._now()
        return elapsed

    @elapsed.setter
    def elapsed(self, value: Elapsed) -> None:
        self._elapsed = value

    @property
    def logs(self) -> Logs:
        """The logs of the current step so far; changes to it are committed with the step."""
        logs = self._logs
        if not self._owns_logs or type(logs) is not Logs:
            # The loop holds the first callback's logs as they came: a reader may change
            # what it gets, so it gets the loop's own copy.
            logs = self._logs = Logs(logs) if logs else Logs()
            self._owns_logs = True
        return logs

    @logs.setter
    def logs(self, value: LogsLike) -> None:
        self._logs = value
        self._owns_logs = False

    @property
    def accumulated_logs(self) -> Logs:
        """The latest value of every entry logged so far, this step's logs included."""
        if self._accumulated is not None:
            return self._accumulated
        accumulated = self.history.latest()
        if self._logs:
            accumulated.merge(self._logs)
        return accumulated

    @accumulated_logs.setter
    def accumulated_logs(self, value: Logs) -> None:
        self._accumulated = value

    def stop(self) -> None:
        """Ends the loop once the current callback returns."""
        self.stop_iteration = True

    def state_dicts(self) -> dict[str, Any]:
        """The `state_dict()` of every stateful callback of this loop, by its `state_key`.

        A callback's key is its `state_key` attribute when it has one (ciclo's
        callbacks derive it from their class and configuration, or take
        `name=`), else its class's name; see `ciclo.types.StatefulCallback`. So the
        snapshot of an early stopping outlives a logger added before it, or
        two callbacks swapped, between a run and its resume.

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
        """Hands each stateful callback of this loop its snapshot from `state_dicts()`, by key.

        A callback with no snapshot in `states` (one added since) keeps its fresh
        state, and a snapshot no callback here claims (one removed since) is
        dropped; each with a warning on the `ciclo` logger.
        """
        for key in sorted(set(states) - set(self._callback_objects)):
            _log.warning("dropping the saved state of callback %s: no callback here has that key", short(key))
        for key, obj in self._callback_objects.items():
            if key in states:
                obj.load_state_dict(states[key])
            else:
                _log.warning("callback %s has no saved state: it starts afresh", short(key))
