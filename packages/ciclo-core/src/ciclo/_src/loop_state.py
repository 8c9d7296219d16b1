"""`LoopState`: everything a callback object can see and change while a loop runs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from ciclo._src.elapsed import Elapsed
from ciclo._src.logs import History, Logs, LogsLike

S = TypeVar("S")


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
        "_elapsed",
        "_ended",
        "_logs",
        "_now",
        "_owns_logs",
        "_per_step",
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

    def callback_states(self) -> dict[str, Any]:
        """The `callback_state()` of every stateful callback of this loop, by a stable name.

        The names are the callbacks' positions and types in the loop
        (`"0:EarlyStopping"`), so the same loop built again gets the same names.
        See `ciclo.StatefulCallback`.

        Example:
            >>> import ciclo
            >>> stopper = ciclo.early_stopping("loss", patience=2)
            >>> def step(state, batch):
            ...     return ciclo.logs().add_loss("loss", 1.0 / (batch + 1)), state
            >>> def grab(state, batch, elapsed, loop_state):
            ...     return None, loop_state.callback_states()
            >>> state, _, _ = ciclo.loop(None, [0, 1], {ciclo.every(1): [step, stopper, grab]})
            >>> list(state), state["0:EarlyStopping"]["best"]
            (['0:EarlyStopping'], 0.5)
        """
        return {name: obj.callback_state() for name, obj in self._callback_objects.items()}

    def restore_callback_states(self, states: Mapping[str, Any]) -> None:
        """Hands each stateful callback of this loop its snapshot from `callback_states()`.

        Raises:
            KeyError: if `states` names a callback this loop does not have, or
                lacks one it has (the message lists both sets of names).
        """
        if set(states) != set(self._callback_objects):
            raise KeyError(
                f"the callback states name {sorted(states)}, but this loop's stateful callbacks are "
                f"{sorted(self._callback_objects)}: was the loop built with other callbacks?"
            )
        for name, obj in self._callback_objects.items():
            obj.restore_callback_state(states[name])
