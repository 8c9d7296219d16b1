"""Schedules: predicates over `Elapsed` that decide when callbacks run."""

from __future__ import annotations

import abc
import dataclasses
import datetime
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, final

from ciclo._src.base.elapsed import Elapsed, Period, PeriodLike, check_seconds, only_steps
from ciclo._src.base.reprs import short

if TYPE_CHECKING:
    from ciclo._src.base.types import Schedule


class ScheduleBase(abc.ABC):
    """Gives schedules the combinators `&`, `|` and `~`; both sides always run, so stateful ones stay in step.

    Example:
        >>> import ciclo
        >>> schedule = ciclo.every(2) & ~ciclo.every(3)
        >>> [s for s in range(8) if schedule(ciclo.types.Elapsed.create(steps=s))]
        [2, 4]
    """

    @abc.abstractmethod
    def __call__(self, elapsed: Elapsed) -> bool:
        """Returns True when the schedule fires at `elapsed`."""

    def __and__(self, other: Schedule) -> ScheduleBase:
        return _Combined(all, (self, _check_schedule(other)))

    def __rand__(self, other: Schedule) -> ScheduleBase:
        return _Combined(all, (_check_schedule(other), self))

    def __or__(self, other: Schedule) -> ScheduleBase:
        return _Combined(any, (self, _check_schedule(other)))

    def __ror__(self, other: Schedule) -> ScheduleBase:
        return _Combined(any, (_check_schedule(other), self))

    def __invert__(self) -> ScheduleBase:
        return _Not(self)


def _check_schedule(value: object) -> Schedule:
    if not callable(value):
        raise TypeError(f"a schedule must be callable as schedule(elapsed) -> bool, got {short(value)}")
    return value


@final
@dataclasses.dataclass(frozen=True, eq=False)
class _Combined(ScheduleBase):
    combine: Callable[[list[bool]], bool]
    parts: tuple[Schedule, ...]

    def __call__(self, elapsed: Elapsed) -> bool:
        return self.combine([bool(part(elapsed)) for part in self.parts])

    def __repr__(self) -> str:
        if self.parts:
            return f"{self.combine.__name__}{self.parts!r}"
        return "always()" if self.combine is all else "never()"


@final
@dataclasses.dataclass(frozen=True, eq=False)
class _Not(ScheduleBase):
    inner: Schedule

    def __call__(self, elapsed: Elapsed) -> bool:
        return not self.inner(elapsed)


def _boundaries_upto(value: float, offset: float, interval: float) -> int:
    if value < offset:
        return 0
    return int((value - offset) // interval) + 1


def next_boundary(value: int, interval: int, offset: int = 0) -> int:
    """The first boundary `offset + k * interval` (k >= 0) past `value`.

    Example:
        >>> [next_boundary(steps, 4) for steps in (-1, 0, 3, 4)], next_boundary(4, 4, offset=1)
        ([0, 4, 4, 8], 5)
    """
    return offset + _boundaries_upto(value, offset, interval) * interval


def crossed(before: float, after: float, interval: float, offset: float = 0) -> bool:
    """Whether a boundary `offset + k * interval` (k >= 0) lies in `(before, after]`: `Every`'s one rule.

    Example:
        >>> crossed(7, 8, 4), crossed(8, 9, 4), crossed(3, 12, 4, offset=1)
        (True, False, True)
    """
    return _boundaries_upto(after, offset, interval) > _boundaries_upto(before, offset, interval)


@final
@dataclasses.dataclass(eq=False)
class Every(ScheduleBase):
    """Fires once each time a boundary `offset + k * interval` is reached or jumped over; see `ciclo.every`.

    The same `Elapsed` again gets the same answer; a lower one (an inner loop's new run) starts over.
    """

    period: Period
    offset: Period | None = None
    _last: tuple[float, ...] | None = dataclasses.field(default=None, init=False, repr=False)
    _last_result: bool = dataclasses.field(default=False, init=False, repr=False)

    def __call__(self, elapsed: Elapsed) -> bool:
        period, offset, last = self.period, self.offset, self._last
        if period.steps == 1 and offset is None:
            return True  # the common every(1): no bookkeeping
        current = (elapsed.steps, elapsed.samples, elapsed.time)
        if current == last:
            return self._last_result
        if last is None or any(c < p for c, p in zip(current, last, strict=True)):
            # A (re)start: a count fires on a boundary, time (which starts at one) once past the offset.
            last = (current[0] - 1, current[1] - 1, -math.inf)
        starts = (0, 0, 0) if offset is None else (offset.steps, offset.samples, offset.time)
        intervals = (period.steps, period.samples, period.time)
        fired = any(
            interval is not None and crossed(before, now, interval, start or 0)
            for before, now, interval, start in zip(last, current, intervals, starts, strict=True)
        )
        self._last, self._last_result = current, fired
        return fired

    def step_boundary(self) -> tuple[int, int] | None:
        """`(interval, offset)` in steps when this schedule counts steps alone (a fast path), else None."""
        interval, offset = only_steps(self.period), 0 if self.offset is None else only_steps(self.offset)
        return None if interval is None or offset is None else (interval, offset)


def every(
    steps: int | None = None,
    *,
    samples: int | None = None,
    time: float | datetime.timedelta | None = None,
) -> Every:
    """Fires every `steps` steps, `samples` samples or `time` seconds (when any does), starting at 0.

    A count fires at the first step and at each that reaches or crosses the next multiple.

    Example:
        >>> import ciclo
        >>> schedule = ciclo.every(2)
        >>> [s for s in range(7) if schedule(ciclo.types.Elapsed.create(steps=s))]
        [0, 2, 4, 6]
    """
    if steps is None and samples is None and time is None:
        raise ValueError("every() needs one of steps=, samples= or time=")
    for label, value in (("steps", steps), ("samples", samples)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(
                f"every({label}={short(value)}): the interval must be a positive int number of {label}, "
                f"such as every({label}=10) (an interval in seconds is every(time=...))"
            )
        if value is not None and value <= 0:
            raise ValueError(
                f"every({label}={short(value)}): the interval must be a positive int, such as "
                f"every({label}=1) to fire at every one"
            )
    if time is not None and check_seconds(time, "time") <= 0:
        raise ValueError(f"every(time={short(time)}): the interval must be positive, such as every(time=60)")
    return Every(Period(steps=steps, samples=samples, time=time))  # type: ignore[arg-type]


@final
@dataclasses.dataclass(frozen=True, eq=False)
class After(ScheduleBase):
    """Fires at every step once a `Period` is reached; see `ciclo.after`."""

    period: Period

    def __call__(self, elapsed: Elapsed) -> bool:
        return elapsed >= self.period

    def every(self, *args: Any, **kwargs: Any) -> Every:
        """Fires at the `after` point and every interval from there (`ciclo.every`'s arguments).

        Example:
            >>> import ciclo
            >>> schedule = ciclo.after(steps=3).every(steps=5)
            >>> [s for s in range(15) if schedule(ciclo.types.Elapsed.create(steps=s))]
            [3, 8, 13]
        """
        return Every(every(*args, **kwargs).period, offset=self.period)


def after(
    steps: int | None = None,
    *,
    samples: int | None = None,
    time: float | datetime.timedelta | None = None,
) -> After:
    """Fires at every step from the moment a period is reached; `.every(...)` fires periodically from there.

    Example:
        >>> import ciclo
        >>> schedule = ciclo.after(3)
        >>> schedule(ciclo.types.Elapsed.create(steps=2)), schedule(ciclo.types.Elapsed.create(steps=3))
        (False, True)
    """
    return After(Period(steps=steps, samples=samples, time=time))  # type: ignore[arg-type]


def always() -> ScheduleBase:
    """Fires at every step.

    Example:
        >>> import ciclo
        >>> ciclo.always()(ciclo.types.Elapsed.create(steps=7))
        True
    """
    return _Combined(all, ())


def never() -> ScheduleBase:
    """Never fires.

    Example:
        >>> import ciclo
        >>> ciclo.never()(ciclo.types.Elapsed.create())
        False
    """
    return _Combined(any, ())


@final
@dataclasses.dataclass(frozen=True, eq=False)
class Piecewise(ScheduleBase):
    """Switches between schedules at given periods; see `ciclo.piecewise`."""

    initial: Schedule
    pieces: tuple[tuple[Period, Schedule], ...]

    def __call__(self, elapsed: Elapsed) -> bool:
        current = self.initial
        for period, schedule in self.pieces:
            if elapsed >= period:
                current = schedule
        return bool(current(elapsed))


def piecewise(initial: Schedule, pieces: Mapping[PeriodLike, Schedule]) -> Piecewise:
    """Uses `initial`, then from each period in `pieces` (a `Period` or steps) on, its schedule.

    Example:
        >>> import ciclo
        >>> schedule = ciclo.piecewise(ciclo.every(1), {ciclo.at(4): ciclo.every(3)})
        >>> [s for s in range(10) if schedule(ciclo.types.Elapsed.create(steps=s))]
        [0, 1, 2, 3, 6, 9]
    """
    _check_schedule(initial)
    converted: list[tuple[Period, Schedule]] = []
    for key, schedule in pieces.items():
        period = Period.of(key, name="piecewise key")
        if period is None:
            raise TypeError("a piecewise key must be an int (steps) or a ciclo.types.Period, got None")
        converted.append((period, _check_schedule(schedule)))
    return Piecewise(initial, tuple(converted))


@final
@dataclasses.dataclass(frozen=True, eq=False)
class AtStepEnd(ScheduleBase):
    """A schedule checked after the step, on the counts that include it; see `ciclo.at_step_end`."""

    schedule: Schedule

    def __call__(self, elapsed: Elapsed) -> bool:
        return bool(self.schedule(elapsed))


def at_step_end(schedule: Schedule) -> AtStepEnd:
    """Checks `schedule` after the step, on the counts that include the step's batch.

    A plain schedule sees the `Elapsed` from before the step; epoch-end work is
    `at_step_end(ciclo.every(steps_per_epoch))`, placed after the phase that runs the step.

    Example:
        >>> import ciclo
        >>> schedule = ciclo.at_step_end(ciclo.every(3))
        >>> [s for s in range(1, 8) if schedule(ciclo.types.Elapsed.create(steps=s))]
        [3, 6]
    """
    return AtStepEnd(_check_schedule(schedule))
