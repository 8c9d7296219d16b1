"""What the progress bars share: counting progress, throttling redraws, reading the values to show.

Between redraws a bar only reads a clock and compares two numbers; logged values
are copied to the host only when a line is drawn, so it never waits for the device.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from time import perf_counter
from typing import Any, ClassVar, Literal

import jax
import numpy as np

from ciclo._src.base.elapsed import Elapsed, Period, PeriodLike, check_seconds
from ciclo._src.base.reprs import short
from ciclo._src.callbacks._monitor import population_size
from ciclo._src.engine.callback import Callback
from ciclo._src.engine.loop_state import LoopState
from ciclo._src.logs.logs import Logs, LogsLike
from ciclo._src.logs.monitor import ranked_members, resolve_mode
from ciclo._src.logs.step_output import NO_LOGS

Field = Literal["steps", "samples", "time"]


@dataclasses.dataclass(frozen=True)
class Unit:
    """What a bar counts (`field`), as shown (`label`), and its `total` (the full count, or None)."""

    field: Field
    label: str
    total: float | None


def resolve_total(total: PeriodLike | None) -> Unit:
    """The `Unit` of `total`: an int counts steps; a `Period`, the first of its steps, samples, time."""
    period = Period.of(total, name="total")
    if period is None:
        return Unit("steps", "step", None)
    units: tuple[tuple[Field, str], ...] = (("steps", "step"), ("samples", "sample"), ("time", "s"))
    for field, label in units:
        count = getattr(period, field)
        if count is not None:
            return Unit(field, label, count)
    raise ValueError(
        "total must count steps, samples or time; a progress bar cannot count toward a date, "
        f"got {short(total)}"
    )


def count_after(elapsed: Elapsed, field: Field) -> float:
    """The count once the step `elapsed` describes has run; samples estimated from the average batch."""
    steps = elapsed.steps
    if field == "steps":
        return steps + 1
    if field == "samples":
        return elapsed.samples * (steps + 1) // steps if steps else elapsed.samples
    return elapsed.time


def _is_shown(value: Any, members: int | None) -> bool:
    """Whether `value` is a number, or one number per member of a population of `members`."""
    if isinstance(value, (bool, int, float, np.number)):
        return not isinstance(value, np.complexfloating)
    # `size` and `dtype` are metadata of device arrays: reading them does not wait for the device.
    if getattr(value, "size", None) != 1 and (members is None or getattr(value, "shape", None) != (members,)):
        return False
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    return kind is not None and kind not in "cOSUMm"


def host_floats(entries: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Copies the values of `entries` to the host, in one transfer, as floats; the bars' only read.

    A population's entries (one value per member) come as arrays of floats.
    """
    shown: list[tuple[str, Any]] = []
    for (name, _), value in zip(entries, jax.device_get([value for _, value in entries]), strict=True):
        try:
            array = np.asarray(value, dtype=float)
            shown.append((name, float(array.reshape(())) if array.size == 1 else array))
        except (TypeError, ValueError):
            continue
    return shown


def format_shown(shown: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    """The values `host_floats` read, as text; a population's as its best member's and their spread.

    The best member is the best by the first entry of one value per member (a
    loss: the lowest; an accuracy-like name: the highest); every such entry
    shows that member's value.

    Example:
        >>> import numpy as np
        >>> format_shown([("loss", np.array([0.58, 0.2, 0.12])), ("lr", np.array([0.1, 0.2, 0.3]))])
        [('loss', '0.1200 (best #2, 0.1200-0.5800)'), ('lr', '0.3000 (best #2, 0.1000-0.3000)')]
    """
    ranks = [(name, value) for name, value in shown if not isinstance(value, float)][:1]
    best = next((ranked_members(value, resolve_mode("auto", name))[0] for name, value in ranks), 0)
    texts = []
    for name, value in shown:
        spread = ""
        if not isinstance(value, float):
            known = value[~np.isnan(value)]
            low, high = (known.min(), known.max()) if known.size else (math.nan, math.nan)
            spread, value = f" (best #{best}, {format_value(low)}-{format_value(high)})", float(value[best])
        texts.append((name, format_value(value) + spread))
    return texts


def format_value(value: float) -> str:
    """Formats a shown value with 4 decimals, like Keras; scientific when very small or large.

    Example:
        >>> format_value(0.61482), format_value(2.5e-5), format_value(0.0)
        ('0.6148', '2.5000e-05', '0.0000')
    """
    if not math.isfinite(value):
        return str(value)
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:.4f}"
    return f"{value:.4e}"


class ProgressCallback(Callback, abc.ABC):
    """Base of the bars: draws one run, when the clock passes `_next_time` or the count `_next_count`."""

    # A test or predict loop's bar shows the evaluation's progress.
    hook: ClassVar[str | tuple[str, ...] | None] = (
        "on_train_batch_end",
        "on_test_batch_end",
        "on_predict_batch_end",
    )

    def __init__(self, total: PeriodLike | None, interval: float) -> None:
        self._interval = check_seconds(interval, "interval")
        self.unit = resolve_total(total)
        """What the bar counts (`steps`, `samples` or `time`) and its total."""
        self._next_time = -math.inf  # the first call starts the bar's clock
        self._next_count = math.inf
        self.finished = False
        """Whether the final line was drawn (or the bar closed)."""
        self._start: tuple[float, float] | None = None  # (time, steps) at the first call
        self._elapsed: Elapsed | None = None
        # Or the loop state, whose accumulated logs are derived only when the bar draws.
        self._logs: LogsLike | LoopState[Any] = NO_LOGS
        self._own_logs = Logs()

    def __call__(self, elapsed: Elapsed, logs: LogsLike | None = None) -> None:
        """Updates the bar after the step `elapsed` (from `ciclo.elapse`) describes; shows `logs`."""
        if logs:
            self._own_logs.merge(logs)
        self._update(elapsed, self._own_logs)

    def __loop_callback__(self, loop_state: LoopState[Any]) -> None:
        # Between redraws of a bar counting steps, no `Elapsed` is built (the loop builds none on a
        # step where no scheduled callback is due). `+ 2`: an at_step_end task's elapsed counts its step.
        if (
            self.unit.field != "steps"
            or perf_counter() >= self._next_time
            or loop_state.steps + 2 >= self._next_count
        ):
            self._update(loop_state.elapsed, loop_state)

    def on_end(self, loop_state: LoopState[Any], error: BaseException | None) -> None:
        if not self.finished:
            self._logs = loop_state
            elapsed = loop_state.elapsed  # now counting every step that ran
            self._advance(perf_counter(), getattr(elapsed, self.unit.field), elapsed.steps, final=True)

    def close(self) -> None:
        """Draws the final line (if not drawn yet); by hand only, when the count never reaches the total."""
        elapsed = self._elapsed
        if self.finished:
            return
        if elapsed is None:  # nothing to draw
            self._release()
        else:
            self._advance(
                perf_counter(), count_after(elapsed, self.unit.field), elapsed.steps + 1, final=True
            )

    def _update(self, elapsed: Elapsed, logs: LogsLike | LoopState[Any]) -> None:
        self._elapsed = elapsed
        self._logs = logs
        now = perf_counter()
        count = count_after(elapsed, self.unit.field)
        if now >= self._next_time or count >= self._next_count:
            self._advance(now, count, elapsed.steps + 1, final=False)

    def _advance(self, now: float, count: float, steps: float, *, final: bool) -> None:
        first = self._start is None
        if first:
            self._start = (now, steps)
        total = self.unit.total
        if final or (total is not None and count >= total):
            self._draw(now, count, steps, final=True)
            self._release()
        elif self._schedule(now, count, first):
            self._draw(now, count, steps, final=False)

    def _schedule(self, now: float, count: float, first: bool) -> bool:
        """Sets `_next_time` and `_next_count`; returns whether to draw now."""
        self._next_time = now + self._interval
        self._next_count = math.inf if self.unit.total is None else self.unit.total
        return True

    def _shown_values(self) -> list[tuple[str, str]]:
        """The scalar values of `losses`, `metrics`, `stateful_metrics`, each name once, as shown.

        A population's entries (one value per member) show the best member and the spread.
        """
        members, logs = None, self._logs
        if isinstance(logs, LoopState):
            members, logs = population_size(logs.state), logs.accumulated_logs
        entries: dict[str, Any] = {}
        for collection in ("losses", "metrics", "stateful_metrics"):
            for name, value in (logs.get(collection) or {}).items():
                if name not in entries and _is_shown(value, members):
                    entries[name] = value
        return format_shown(host_floats(list(entries.items())))

    @abc.abstractmethod
    def _draw(self, now: float, count: float, steps: float, *, final: bool) -> None: ...

    def _release(self) -> None:
        self.finished = True
        self._next_time = self._next_count = math.inf
        self._logs = NO_LOGS
        self._own_logs = Logs()
        self._elapsed = None
