"""Early stopping: end the loop when a monitored value stops improving."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar, Generic, final

import numpy as np

from ciclo._src.base.checks import check_int
from ciclo._src.base.elapsed import Elapsed, Period
from ciclo._src.base.reprs import short
from ciclo._src.base.types import CallbackOutput, S
from ciclo._src.callbacks._monitor import (
    population_size,
    select_members,
    snapshot_fields,
    snapshot_float,
    stop_members,
)
from ciclo._src.engine.callback import Callback
from ciclo._src.engine.phases import LoopState
from ciclo._src.logs.logs import LogsLike
from ciclo._src.logs.monitor import ModeLike, monitored_value, resolve_mode
from ciclo._src.logs.step_output import NO_LOGS
from ciclo._src.state.population import Population
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
        # On a population, `best`, `wait`, `stopped` and the best's elapsed are lists, one item per member.
        self.best: Any = self.baseline
        self.best_state: S | None = None
        self.wait: Any = 0
        self.stopped: Any = False
        self._best_elapsed: Any = None
        self._name = name

    @property
    def state_key(self) -> str:
        """What its saved state is found by on resume: `name`, else `"EarlyStopping(monitor, mode)"`."""
        return self._name or f"EarlyStopping({self.monitor}, {self.mode})"

    def __call__(self, elapsed: Elapsed, state: S, logs: LogsLike) -> tuple[bool, S]:
        """Checks the monitored value; returns `(stop, state)`.

        `state` is the best state seen when stopping with `restore_best_weights`.
        On a population, a member that stopped improving is frozen, and `stop`
        says whether every member is.
        """
        members = population_size(state)
        value = monitored_value(logs, self.monitor, members, "early_stopping")
        if members is not None:
            return self._check_members(elapsed, state, value)
        if self._best_elapsed is None:
            self._best_elapsed = elapsed
        self.best, self.wait, self._best_elapsed, improved, exhausted = self._check(
            value, self.best, self.wait, self._best_elapsed, elapsed
        )
        if improved and self.restore_best_weights:
            self.best_state = copied(state)  # a later donating step consumes the originals
        if exhausted:
            self.stopped = True
            if self.restore_best_weights and self.best_state is not None:
                state = self.best_state
        return exhausted, state

    def _check(
        self, value: float, best: float | None, wait: int, best_elapsed: Elapsed, elapsed: Elapsed
    ) -> tuple[float | None, int, Elapsed, bool, bool]:
        """`(best, wait, best_elapsed)` after `value`, whether it improved, whether patience ran out."""
        delta = self.min_delta
        improved = not math.isnan(value) and (
            best is None or (value < best - delta if self.mode == "min" else value > best + delta)
        )
        best, wait, best_elapsed = (value, 0, elapsed) if improved else (best, wait + 1, best_elapsed)
        if isinstance(self.patience, Period):
            exhausted = (elapsed - best_elapsed) >= self.patience and wait > 0
        else:
            exhausted = wait > self.patience
        return best, wait, best_elapsed, improved, exhausted

    def _check_members(self, elapsed: Elapsed, population: Any, values: Any) -> tuple[bool, Any]:
        """`_check` for each member (`best`, `wait`, ... are then lists); freezes the members exhausted."""
        if not isinstance(self.stopped, list):
            size = len(values)
            self.best, self.wait = [self.baseline] * size, [0] * size
            self._best_elapsed, self.stopped = [elapsed] * size, [False] * size
        tracks = zip(values.tolist(), self.best, self.wait, self._best_elapsed, strict=True)
        checked = [self._check(value, best, wait, since, elapsed) for value, best, wait, since in tracks]
        self.best, self.wait, self._best_elapsed, improved, exhausted = map(list, zip(*checked, strict=True))
        if self.restore_best_weights and any(improved):
            best = self.best_state
            self.best_state = (
                copied(population) if best is None else select_members(improved, population, best)
            )
        newly = [now and not was for now, was in zip(exhausted, self.stopped, strict=True)]
        if any(newly):
            self.stopped = [now or was for now, was in zip(exhausted, self.stopped, strict=True)]
            population = stop_members(population, newly)
        return not np.asarray(population.active).any(), population

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
            "best_elapsed": _each(best_elapsed, dataclasses.asdict),
            "stopped": self.stopped,
            # Arrays are immutable and later checks rebind `best_state`, so holding it is a snapshot.
            "best_state": self.best_state,
        }

    def load_state_dict(self, state: Any, /) -> None:
        """Takes back a `state_dict()` snapshot (numbers maybe as 0-d arrays) before the first check."""
        fields = snapshot_fields(state, _STATE_KEYS, "early_stopping")

        def elapsed(snapshot: Any) -> Elapsed:
            counts = snapshot_fields(snapshot, _ELAPSED_KEYS, "early_stopping best_elapsed")
            steps, samples, time, date_start = (snapshot_float(counts[key]) for key in _ELAPSED_KEYS)
            return Elapsed(int(steps), int(samples), time, date_start)

        self.best = _each(fields["best"], snapshot_float)
        self.wait = _each(fields["wait"], int)
        self._best_elapsed = _each(fields["best_elapsed"], elapsed)
        self.stopped = _each(fields["stopped"], bool)
        self.best_state = fields["best_state"]

    def __loop_callback__(self, loop_state: LoopState[S]) -> CallbackOutput[S]:
        """Checks `loop_state.accumulated_logs` and stops the loop when patience runs out."""
        stop, state = self(loop_state.elapsed, loop_state.state, loop_state.accumulated_logs)
        if stop:
            loop_state.stop()
        return NO_LOGS, state

    def on_end(self, loop_state: LoopState[S], error: BaseException | None, /) -> None:
        """With `restore_best_weights`, the loop returns the best state however it ends (Ctrl-C included).

        A population's: each member's best, with the final `active` mask.
        """
        best: Any = self.best_state
        if self.restore_best_weights and best is not None:
            current = loop_state.state
            if isinstance(best, Population) and isinstance(current, Population):
                best = best.replace(active=current.active)
            loop_state.state = best


def _each(value: Any, convert: Callable[[Any], Any]) -> Any:
    """`convert(value)`, or of each item of a population's list; None stays None."""
    if isinstance(value, (list, tuple)):
        return [_each(item, convert) for item in value]
    return None if value is None else convert(value)


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
    of each epoch. See docs/guide.md. On a population (`ciclo.population`)
    each member is watched alone: a member that stopped improving is frozen,
    and the loop stops once every member has (docs/populations.md).

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
