"""What the progress bars share: counting progress, throttling redraws, reading the values to show.

The bars are called at every step of a loop whose step is usually an
asynchronously dispatched `jax.jit` function. Reading a logged value waits for
the device to compute it, so between redraws a bar only reads a clock and
compares two numbers; logged values are read (and copied to the host) only when
a line is drawn.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable
from time import perf_counter
from types import MappingProxyType
from typing import Any, ClassVar, Literal

import jax
import numpy as np

from ciclo._src.base.elapsed import Elapsed, PeriodLike, to_period
from ciclo._src.base.reprs import short
from ciclo._src.base.types import CallbackOutput, S
from ciclo._src.engine.callback import Callback
from ciclo._src.engine.loop_state import LoopState
from ciclo._src.logs.logs import Logs, LogsLike

Field = Literal["steps", "samples", "time"]
"""The `Elapsed` field a bar counts."""

SHOWN_COLLECTIONS = ("losses", "metrics", "stateful_metrics")
"""The log collections whose scalar entries the bars show, in this order."""

_NO_LOGS: LogsLike = MappingProxyType({})


@dataclasses.dataclass(frozen=True)
class Unit:
    """What a bar counts and up to where.

    Attributes:
        field: the `Elapsed` field counted: `"steps"`, `"samples"` or `"time"`.
        label: the unit as shown: `"step"`, `"sample"` or `"s"`.
        total: the count at which the bar is full, or None if unknown.
    """

    field: Field
    label: str
    total: float | None


def resolve_total(total: PeriodLike | None, *, name: str = "total") -> Unit:
    """Turns a bar's `total` into the unit it counts and the count at which it is full.

    An int counts steps. A `Period` counts the first of its fields that is set,
    in the order steps, samples, time; a `Period` with only a date is refused
    because a bar counts from the start of its loop, not toward a wall-clock date.

    Example:
        >>> import ciclo
        >>> resolve_total(ciclo.at(samples=640))
        Unit(field='samples', label='sample', total=640)
        >>> resolve_total(None)
        Unit(field='steps', label='step', total=None)
    """
    period = to_period(total, name=name)
    if period is None:
        return Unit("steps", "step", None)
    if period.steps is not None:
        return Unit("steps", "step", period.steps)
    if period.samples is not None:
        return Unit("samples", "sample", period.samples)
    if period.time is not None:
        return Unit("time", "s", period.time)
    raise ValueError(
        f"{name} must count steps, samples or time; a progress bar cannot count toward a date, got "
        f"{short(total)}"
    )


def _steps_done(elapsed: Elapsed) -> float:
    return elapsed.steps + 1


def _samples_done(elapsed: Elapsed) -> float:
    # The bar does not see the batch, so the step that just ran is assumed to
    # have been as large as the average batch so far.
    steps = elapsed.steps
    return elapsed.samples * (steps + 1) // steps if steps else elapsed.samples


def _time_done(elapsed: Elapsed) -> float:
    return elapsed.time


def step_counter(field: Field) -> Callable[[Elapsed], float]:
    """The count after the step that `elapsed` describes has run.

    `Elapsed` counts what ran *before* the current step, and a bar is called
    after the step's work: one step more than `elapsed.steps` is done. Samples
    are estimated from the average batch; time is the time at which the step
    started.

    Example:
        >>> import ciclo
        >>> step_counter("steps")(ciclo.types.Elapsed.create(steps=9, samples=288))
        10
        >>> step_counter("samples")(ciclo.types.Elapsed.create(steps=9, samples=288))
        320
    """
    if field == "steps":
        return _steps_done
    if field == "samples":
        return _samples_done
    return _time_done


def end_count(elapsed: Elapsed, field: Field) -> float:
    """The count when a loop has ended: `elapsed` then includes every step that ran."""
    count: float = getattr(elapsed, field)  # an int for steps and samples, as tqdm shows it
    return count


def _is_scalar(value: Any) -> bool:
    if isinstance(value, (bool, int, float, np.number)):
        return not isinstance(value, np.complexfloating)
    # `size` and `dtype` are metadata of device arrays: reading them does not wait for the device.
    if getattr(value, "size", None) != 1:
        return False
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    return kind is not None and kind not in "cOSUMm"


def scalar_entries(logs: LogsLike) -> list[tuple[str, Any]]:
    """The entries a bar shows: scalar values of the shown collections, each name once.

    Values are returned as they are (possibly device arrays still being
    computed); nothing here reads them.

    Example:
        >>> import ciclo
        >>> logs = ciclo.logs().add_loss("loss", 0.5, add_metric=True).add_metric("acc", 0.9)
        >>> scalar_entries(logs.add_output("pred", [1, 2]))
        [('loss', 0.5), ('acc', 0.9)]
    """
    entries: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for collection in SHOWN_COLLECTIONS:
        values = logs.get(collection)
        if not values:
            continue
        for name, value in values.items():
            if name not in seen and _is_scalar(value):
                seen.add(name)
                entries.append((name, value))
    return entries


def host_floats(entries: list[tuple[str, Any]]) -> list[tuple[str, float]]:
    """Copies the values of `entries` to the host, all in one transfer, as floats.

    This is the only place where the bars read logged values. Values that are
    not real numbers are left out.

    Example:
        >>> import jax.numpy as jnp
        >>> host_floats([("loss", jnp.float32(0.5)), ("n", 3)])
        [('loss', 0.5), ('n', 3.0)]
    """
    if not entries:
        return []
    fetched = jax.device_get([value for _, value in entries])
    shown: list[tuple[str, float]] = []
    for (name, _), value in zip(entries, fetched, strict=True):
        try:
            shown.append((name, float(np.asarray(value).reshape(()))))
        except (TypeError, ValueError):
            continue
    return shown


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


def format_duration(seconds: float) -> str:
    """Formats a duration like Keras: `42s`, `3:05` or `1:02:03`.

    Example:
        >>> format_duration(42.4), format_duration(185), format_duration(3723)
        ('42s', '3:05', '1:02:03')
    """
    seconds = max(seconds, 0.0)
    if seconds >= 3600:
        return f"{int(seconds // 3600)}:{int(seconds % 3600 // 60):02d}:{int(seconds % 60):02d}"
    if seconds >= 60:
        return f"{int(seconds // 60)}:{int(seconds % 60):02d}"
    return f"{seconds:.0f}s"


def format_rate(seconds_per_unit: float, label: str) -> str:
    """Formats the time per unit like Keras: `2s/step`, `530ms/step`, `12us/sample`.

    Example:
        >>> format_rate(0.53, "step"), format_rate(1.2e-5, "sample")
        ('530ms/step', '12us/sample')
    """
    if seconds_per_unit >= 1 or seconds_per_unit == 0:
        return f"{seconds_per_unit:.0f}s/{label}"
    if seconds_per_unit >= 1e-3:
        return f"{seconds_per_unit * 1e3:.0f}ms/{label}"
    return f"{seconds_per_unit * 1e6:.0f}us/{label}"


def check_interval(interval: object) -> float:
    """Validates a redraw interval in seconds, naming the value if it is wrong."""
    if isinstance(interval, bool) or not isinstance(interval, (int, float)):
        raise TypeError(f"interval must be a number of seconds, got {short(interval)}")
    if not interval >= 0:  # also refuses NaN
        raise ValueError(f"interval must be >= 0 seconds, got {short(interval)}")
    return float(interval)


class ProgressCallback(Callback, abc.ABC):
    """Base of the progress bars: follows the loop's progress and decides when to redraw.

    A bar is called once per step. Between redraws the call stores two
    references, reads a clock and compares two numbers; the subclass draws
    (`_refresh`, `_finish`) only when the clock passes `_next_time` or the count
    reaches `_next_count`, which the subclass sets after each redraw. A bar
    draws one run: once its final line is drawn, further calls do nothing.
    """

    hook: ClassVar[str | None] = "on_train_batch_end"  # where train_loop(callbacks=[...]) places it

    __slots__ = (
        "_count",
        "_elapsed",
        "_field",
        "_finished",
        "_logs",
        "_next_count",
        "_next_time",
        "_own_logs",
        "_start",
        "_total",
        "_unit",
    )

    def __init__(self, total: PeriodLike | None) -> None:
        self._unit = resolve_total(total)
        self._field: Field = self._unit.field
        self._total = self._unit.total
        self._count = step_counter(self._field)
        # The first call always redraws: it starts the bar's clock.
        self._next_time = -math.inf
        self._next_count = math.inf
        self._finished = False
        self._start: tuple[float, float] | None = None  # (time, steps) at the first call
        self._elapsed: Elapsed | None = None
        # The logs to show, or the loop state whose accumulated logs to show: those are
        # derived from the history, so they are read only when the bar draws.
        self._logs: LogsLike | LoopState[Any] = _NO_LOGS
        self._own_logs = Logs()

    @property
    def unit(self) -> Unit:
        """What the bar counts (`steps`, `samples` or `time`) and its total."""
        return self._unit

    @property
    def finished(self) -> bool:
        """Whether the final line was drawn (or the bar closed)."""
        return self._finished

    def __call__(self, elapsed: Elapsed, logs: LogsLike | None = None) -> None:
        """Updates the bar after a step, when iterating by hand.

        Args:
            elapsed: the `Elapsed` of the step that just ran, as yielded by
                `ciclo.elapse`.
            logs: the step's logs; merged into the bar's own logs, whose latest
                value of each entry is shown.
        """
        if logs:
            self._own_logs.merge(logs)
        self._update(elapsed, self._own_logs)

    def __loop_callback__(self, loop_state: LoopState[S]) -> CallbackOutput[S]:
        self._update(loop_state.elapsed, loop_state)
        return _NO_LOGS, loop_state.state

    def on_end(self, loop_state: LoopState[Any], error: BaseException | None) -> None:
        if self._finished:
            return
        self._logs = loop_state.accumulated_logs
        elapsed = loop_state.elapsed
        self._advance(perf_counter(), end_count(elapsed, self._field), elapsed.steps, final=True)

    def close(self) -> None:
        """Draws the final line (if not drawn yet) and releases the bar.

        Needed only when iterating by hand and the count never reaches the
        total (or the total is unknown); loops close their bars when they end.
        """
        if self._finished:
            return
        elapsed = self._elapsed
        if elapsed is None:
            self._finished = True
            self._next_time = self._next_count = math.inf
            self._release()
            return
        self._advance(perf_counter(), self._count(elapsed), elapsed.steps + 1, final=True)

    def _update(self, elapsed: Elapsed, logs: LogsLike | LoopState[Any]) -> None:
        # The hot path: runs at every step, so it must not read logged values.
        self._elapsed = elapsed
        self._logs = logs
        now = perf_counter()
        count = self._count(elapsed)
        if now >= self._next_time or count >= self._next_count:
            self._advance(now, count, elapsed.steps + 1, final=False)

    def _advance(self, now: float, count: float, steps: float, *, final: bool) -> None:
        if self._finished:
            return
        first = self._start is None
        if first:
            self._start = (now, steps)
        if final or (self._total is not None and count >= self._total):
            self._finished = True
            self._next_time = self._next_count = math.inf
            self._finish(now, count, steps)
            self._release()
        else:
            self._refresh(now, count, steps, first)

    def _shown_values(self) -> list[tuple[str, float]]:
        logs = self._logs
        return host_floats(scalar_entries(logs.accumulated_logs if isinstance(logs, LoopState) else logs))

    def _timing(self, now: float, count: float, steps: float) -> tuple[float, float | None]:
        """Seconds since the first call, and seconds per unit counted (per step for time bars).

        The time per unit is measured over the steps since the first call, and is
        None until there is one. Samples are converted with the average batch, as
        the count of samples at the first call lacks that call's batch.
        """
        start_time, start_steps = self._start if self._start is not None else (now, steps)
        seconds = now - start_time
        if steps <= start_steps:
            return seconds, None
        per_step = seconds / (steps - start_steps)
        if self._field == "samples":
            return seconds, (per_step * steps / count if count > 0 else None)
        return seconds, per_step

    @abc.abstractmethod
    def _refresh(self, now: float, count: float, steps: float, first: bool) -> None:
        """Redraws if due, and sets `_next_time` and `_next_count`."""

    @abc.abstractmethod
    def _finish(self, now: float, count: float, steps: float) -> None:
        """Draws the final state."""

    def _release(self) -> None:
        """Frees what the bar holds once it is finished."""
        self._logs = _NO_LOGS
        self._own_logs = Logs()
        self._elapsed = None
