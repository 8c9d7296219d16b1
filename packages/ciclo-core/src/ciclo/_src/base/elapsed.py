"""Time tracking: how far a loop has run (`Elapsed`) and how far it should run (`Period`)."""

from __future__ import annotations

import dataclasses
import datetime
import operator
import time as _time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import jax

from ciclo._src.base.batches import BatchSizeFn, GlobalRows, Stacked, leading_dim
from ciclo._src.base.checks import check_int
from ciclo._src.base.reprs import short

B = TypeVar("B")


def check_seconds(value: object, name: str) -> float:
    """`value`, a number of seconds >= 0 or a `timedelta`, as a float; a TypeError or ValueError (NaN too).

    Example:
        >>> check_seconds(float("nan"), "interval")
        Traceback (most recent call last):
        ValueError: interval must be >= 0, got nan
    """
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or a timedelta, got {short(value)}")
    if not value >= 0:  # also refuses NaN
        raise ValueError(f"{name} must be >= 0, got {short(value)}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class Period:
    """A duration in steps, samples, seconds or a date, reached when *any* field is; see `ciclo.at`.

    Example:
        >>> import ciclo
        >>> period = ciclo.at(steps=100)
        >>> ciclo.types.Elapsed.create(steps=99) >= period, ciclo.types.Elapsed.create(steps=100) >= period
        (False, True)
    """

    steps: int | None = None
    samples: int | None = None
    time: float | None = None
    date: float | None = None

    def __post_init__(self) -> None:
        if self.steps is None and self.samples is None and self.time is None and self.date is None:
            raise ValueError("a Period needs at least one of steps, samples, time or date")
        if self.steps is not None:
            check_int(self.steps, "steps", 0)
        if self.samples is not None:
            check_int(self.samples, "samples", 0)
        if self.time is not None:
            object.__setattr__(self, "time", check_seconds(self.time, "time"))
        if self.date is not None:
            date = self.date.timestamp() if isinstance(self.date, datetime.datetime) else self.date
            object.__setattr__(self, "date", check_seconds(date, "date"))

    @classmethod
    def of(cls, value: PeriodLike | None, *, name: str = "period") -> Period | None:
        """`value` as a `Period`: an int counts steps; a `Period` or None is returned as is.

        Example:
            >>> import ciclo
            >>> ciclo.types.Period.of(10)
            Period(steps=10, samples=None, time=None, date=None)
        """
        if value is None or isinstance(value, Period):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0:
                raise ValueError(
                    f"{name} must be >= 0 steps, got {short(value)}: pass a count of steps or a Period"
                )
            return cls(steps=value)
        hint = "pass a count of steps such as 100, or a period such as ciclo.at(samples=...)"
        if isinstance(value, str) and value.strip().isdigit():
            hint = f"pass the int {name}={int(value)}, not the string {short(value)}"
        elif isinstance(value, float) and float.is_integer(value):  # a float despite the annotation
            hint = f"pass the int {name}={int(value)}"
        raise TypeError(f"{name} must be an int (steps) or a ciclo.types.Period, got {short(value)}; {hint}")

    @classmethod
    def create(
        cls,
        steps: int | None = None,
        samples: int | None = None,
        time: float | datetime.timedelta | None = None,
        date: float | datetime.datetime | None = None,
    ) -> Period:
        """Same as `ciclo.at`; kept for compatibility with ciclo 0.1."""
        return at(steps, samples=samples, time=time, date=date)


def only_steps(period: Period) -> int | None:
    """The steps of a period that counts steps alone (`ciclo.at(steps=10)`), else None."""
    return period.steps if (period.samples, period.time, period.date) == (None, None, None) else None


PeriodLike = Period | int
"""A `Period`, or an int meaning that many steps."""


def at(
    steps: int | None = None,
    *,
    samples: int | None = None,
    time: float | datetime.timedelta | None = None,
    date: float | datetime.datetime | None = None,
) -> Period:
    """Creates a `Period`; `time` in seconds (or a `timedelta`), `date` a timestamp or `datetime`.

    Example:
        >>> import ciclo
        >>> ciclo.at(1000)
        Period(steps=1000, samples=None, time=None, date=None)
    """
    return Period(steps, samples, time, date)  # type: ignore[arg-type]  # normalised in __post_init__


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Elapsed:
    """How far a loop has run; a pytree, compared with a `Period` (`elapsed >= ciclo.at(steps=10)`).

    Attributes:
        steps: steps completed before the current one.
        samples: samples seen before the current step.
        time: seconds since the loop (or the first of resumed loops) started.
        date_start: unix timestamp of the start.

    Example:
        >>> import ciclo
        >>> elapsed = ciclo.types.Elapsed.create(steps=10, samples=320)
        >>> elapsed.steps, elapsed >= ciclo.at(samples=300)
        (10, True)
    """

    steps: int = 0
    samples: int = 0
    time: float = 0.0
    date_start: float = 0.0

    @classmethod
    def create(cls, steps: int = 0, samples: int = 0) -> Elapsed:
        """An `Elapsed` starting now, at the given step and sample counts."""
        check_int(steps, "steps", 0)
        check_int(samples, "samples", 0)
        return cls(steps, samples, 0.0, _time.time())

    @property
    def date(self) -> float:
        """The current wall-clock time as a unix timestamp."""
        return self.date_start + self.time

    def to_dict(self) -> dict[str, Any]:
        """The public fields as a dict: steps, samples and time."""
        return {"steps": self.steps, "samples": self.samples, "time": self.time}

    def __sub__(self, other: Elapsed) -> Elapsed:
        return Elapsed(
            self.steps - other.steps,
            self.samples - other.samples,
            self.time - other.time,
            self.date_start,
        )

    def _reached(self, period: Period, beyond: Callable[[float, float], bool]) -> bool:
        if not isinstance(period, Period):
            raise TypeError(f"Elapsed can only be compared with a ciclo.types.Period, got {short(period)}")
        return (
            (period.steps is not None and beyond(self.steps, period.steps))
            or (period.samples is not None and beyond(self.samples, period.samples))
            or (period.time is not None and beyond(self.time, period.time))
            or (period.date is not None and beyond(self.date, period.date))
        )

    def __ge__(self, period: Period) -> bool:
        return self._reached(period, operator.ge)

    def __gt__(self, period: Period) -> bool:
        return self._reached(period, operator.gt)

    def __lt__(self, period: Period) -> bool:
        return not self._reached(period, operator.ge)

    def __le__(self, period: Period) -> bool:
        return not self._reached(period, operator.gt)


def make_elapsed(steps: int, samples: int, time: float, date_start: float) -> Elapsed:
    # Half the cost of `Elapsed(...)`: no `object.__setattr__` per field.
    elapsed = _new(Elapsed)
    fields = elapsed.__dict__
    fields["steps"] = steps
    fields["samples"] = samples
    fields["time"] = time
    fields["date_start"] = date_start
    return elapsed


_new = object.__new__


class Clock:
    """Mutable counters behind `elapse` and `ciclo.loop`: an `Elapsed` only when asked."""

    __slots__ = ("batch_size_fn", "date_start", "origin", "samples", "steps")

    def __init__(self, initial: Elapsed | None, batch_size_fn: BatchSizeFn | None) -> None:
        if initial is None:
            initial = Elapsed.create()
        elif not isinstance(initial, Elapsed):
            raise TypeError(f"elapsed must be a ciclo.types.Elapsed, got {short(initial)}")
        self.steps = int(initial.steps)
        self.samples = int(initial.samples)
        self.date_start = float(initial.date_start)
        # `perf_counter()` at time 0: a resumed loop's time goes on from `initial`'s.
        self.origin = _time.perf_counter() - float(initial.time)
        self.batch_size_fn = leading_dim if batch_size_fn is None else batch_size_fn

    def now(self) -> Elapsed:
        return make_elapsed(self.steps, self.samples, _time.perf_counter() - self.origin, self.date_start)

    def advance(self, batch: Any) -> None:
        # `batches.count` without its call and tuple: this runs at every step of every loop.
        size = self.batch_size_fn
        if type(batch) is Stacked:
            self.steps += batch.steps
            self.samples += size(batch) if type(size) is GlobalRows else batch.samples
        else:
            self.steps += 1
            self.samples += size(batch)


def elapse(
    dataset: Iterable[B],
    *,
    stop: PeriodLike | None = None,
    initial: Elapsed | None = None,
    batch_size_fn: BatchSizeFn | None = None,
) -> Iterator[tuple[Elapsed, B]]:
    """Iterates a dataset, yielding `(elapsed, batch)`: `elapsed` counts what ran *before* the batch.

    Args:
        dataset: any iterable of batches.
        stop: stop, reading no further, where this `Period` (or number of steps) is reached.
        initial: resume counting from this `Elapsed`.
        batch_size_fn: a batch's sample count; by default its first array leaf's leading dimension.

    Example:
        >>> import ciclo
        >>> [(e.steps, e.samples, b) for e, b in ciclo.elapse(["a", "b", "c"], stop=2)]
        [(0, 0, 'a'), (1, 1, 'b')]
    """
    stop_period = Period.of(stop, name="stop")
    clock = Clock(initial, batch_size_fn)
    iterator = iter(dataset)
    while True:
        elapsed = clock.now()
        if stop_period is not None and elapsed >= stop_period:
            return
        try:
            batch = next(iterator)
        except StopIteration:
            return
        yield elapsed, batch
        clock.advance(batch)
