"""Early stopping: end the loop when a monitored value stops improving."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Generic, final

from ciclo._src.base.checks import check_int
from ciclo._src.base.elapsed import Elapsed, Period
from ciclo._src.base.reprs import short
from ciclo._src.base.types import CallbackOutput, S
from ciclo._src.callbacks._monitor import (
    ModeLike,
    monitored_value,
    present_keys,
    resolve_mode,
    snapshot_fields,
    snapshot_float,
)
from ciclo._src.engine.callback import Callback
from ciclo._src.engine.phases import LoopState
from ciclo._src.logs.logs import LogsLike
from ciclo._src.logs.step_output import NO_LOGS
from ciclo._src.strategies._placement import copied

_STATE_KEYS = ("best", "wait", "best_elapsed", "stopped", "best_state")
_ELAPSED_KEYS = tuple(field.name for field in dataclasses.fields(Elapsed))


@final
class EarlyStopping(Callback, Generic[S]):
    """Stops a loop when a monitored entry has not improved for `patience`; see `ciclo.early_stopping`."""

    hook: ClassVar[str | None] = "on_epoch_end"

    def __init__(
        self,
        monitor: str,
        patience: int | Period,
        min_delta: float,
        mode: ModeLike,
        baseline: float | None,
        restore_best_weights: bool,
        name: str | None,
    ) -> None:
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"name must be a non-empty str or None, got {type(name).__name__}")
        if not isinstance(monitor, str) or not monitor:
            raise TypeError(f"monitor must be the name of a logged entry, got {short(monitor)}")
        if not isinstance(patience, Period):
            check_int(patience, "patience", 0, " (checks) or a ciclo.types.Period")
        if min_delta < 0:
            raise ValueError(f"min_delta must be >= 0, got {short(min_delta)}")
        self.monitor = monitor
        self.patience = patience
        self.min_delta = float(min_delta)
        self.mode = resolve_mode(mode, monitor)
        self.baseline = None if baseline is None else float(baseline)
        self.restore_best_weights = restore_best_weights
        self.best: float | None = self.baseline
        self.best_state: S | None = None
        self.wait = 0
        self.stopped = False
        self._best_elapsed: Elapsed | None = None
        self._name = name

    @property
    def state_key(self) -> str:
        """What its saved state is found by on resume: `name`, else `"EarlyStopping(monitor, mode)"`."""
        return self._name or f"EarlyStopping({self.monitor}, {self.mode})"

    def __call__(self, elapsed: Elapsed, state: S, logs: LogsLike) -> tuple[bool, S]:
        """Checks the monitored value; returns `(stop, state)`.

        `state` is the best state seen when stopping with `restore_best_weights`.
        """
        value = monitored_value(logs, self.monitor)
        if value is None:
            raise KeyError(
                f"early_stopping monitors {short(self.monitor)}, which is not in the logs; "
                f"present: {present_keys(logs)}"
            )
        if self._best_elapsed is None:
            self._best_elapsed = elapsed
        best, delta = self.best, self.min_delta
        if not math.isnan(value) and (
            best is None or (value < best - delta if self.mode == "min" else value > best + delta)
        ):
            self.best = value
            self.wait = 0
            self._best_elapsed = elapsed
            if self.restore_best_weights:
                self.best_state = copied(state)  # a later donating step consumes the originals
        else:
            self.wait += 1
        if isinstance(self.patience, Period):
            exhausted = (elapsed - self._best_elapsed) >= self.patience and self.wait > 0
        else:
            exhausted = self.wait > self.patience
        if exhausted:
            self.stopped = True
            if self.restore_best_weights and self.best_state is not None:
                state = self.best_state
        return exhausted, state

    def state_dict(self) -> dict[str, Any]:
        """A snapshot of what decides when to stop, for `load_state_dict`.

        Returns:
            A dict: `best`, `wait` (checks since the best), `best_elapsed` (the
            best check's `Elapsed` fields, or None), `stopped`, and `best_state`
            (with `restore_best_weights`; else None).
        """
        best_elapsed = self._best_elapsed
        return {
            "best": self.best,
            "wait": self.wait,
            "best_elapsed": None if best_elapsed is None else dataclasses.asdict(best_elapsed),
            "stopped": self.stopped,
            # Arrays are immutable and later checks rebind `best_state`, so holding it is a snapshot.
            "best_state": self.best_state,
        }

    def load_state_dict(self, state: Any, /) -> None:
        """Takes back a `state_dict()` snapshot (numbers maybe as 0-d arrays) before the first check."""
        fields = snapshot_fields(state, _STATE_KEYS, "early_stopping")
        best_elapsed = fields["best_elapsed"]
        if best_elapsed is not None:
            counts = snapshot_fields(best_elapsed, _ELAPSED_KEYS, "early_stopping best_elapsed")
            steps, samples, time, date_start = (snapshot_float(counts[key]) for key in _ELAPSED_KEYS)
            best_elapsed = Elapsed(int(steps), int(samples), time, date_start)
        self.best = None if fields["best"] is None else snapshot_float(fields["best"])
        self.wait = int(fields["wait"])
        self._best_elapsed = best_elapsed
        self.stopped = bool(fields["stopped"])
        self.best_state = fields["best_state"]

    def __loop_callback__(self, loop_state: LoopState[S]) -> CallbackOutput[S]:
        """Checks `loop_state.accumulated_logs` and stops the loop when patience runs out."""
        stop, state = self(loop_state.elapsed, loop_state.state, loop_state.accumulated_logs)
        if stop:
            loop_state.stop()
        return NO_LOGS, state

    def on_end(self, loop_state: LoopState[S], error: BaseException | None, /) -> None:
        """With `restore_best_weights`, the loop returns the best state however it ends (Ctrl-C included)."""
        if self.restore_best_weights and self.best_state is not None:
            loop_state.state = self.best_state


def early_stopping(
    monitor: str,
    patience: int | Period = 0,
    *,
    min_delta: float = 0.0,
    mode: ModeLike = "auto",
    baseline: float | None = None,
    restore_best_weights: bool = False,
    name: str | None = None,
) -> EarlyStopping[Any]:
    """Stops the loop when `monitor` has stopped improving.

    A NaN never improves. In `train_loop(callbacks=[...])` it runs at the end
    of each epoch. See docs/guide.md.

    Args:
        monitor: entry name or full path, e.g. `"loss_test"` or `"metrics.accuracy"`.
        patience: checks without improvement to tolerate (int), or a
            `ciclo.types.Period` elapsed since the best value.
        min_delta: by how much a value must beat the best so far to improve.
        mode: `"auto"` (from the name of `monitor`), `"min"` or `"max"`.
        baseline: a value to beat before anything counts as an improvement.
        restore_best_weights: when the loop ends, for any reason, return the
            state of the best check.
        name: the key its state is saved under in a backup (`state_key`), to
            tell two early stoppings on one monitor apart.

    Example:
        >>> import ciclo
        >>> losses = iter([1.0, 0.5, 0.6, 0.7, 0.2])
        >>> def log_loss(state):
        ...     return ciclo.logs().add_metric("loss", next(losses)), state
        >>> stopper = ciclo.early_stopping("loss", patience=1)
        >>> _, _, elapsed = ciclo.loop(0, range(5), {ciclo.every(1): [log_loss, stopper]})
        >>> elapsed.steps, stopper.best
        (4, 0.5)
    """
    return EarlyStopping(monitor, patience, min_delta, mode, baseline, restore_best_weights, name)
