"""`train_loop(..., steps_per_execution="auto")`: the steps per dispatch, measured on the first steps.

A dispatch costs the host about the same time (Python, the loop, the runtime)
however many steps it runs, so running K steps in one `jax.lax.scan` spreads
that cost over K. Auto measures, on the run's first batches (real training
steps, none thrown away), the host time of one dispatch and the device time of
one step at K = 1, 2, 4, ... as far as needed, and runs the rest of the run with
the smallest K at which the loop's own cost is under 5% of a step's device time.

`choose` is the decision alone, a function of given timings; `AutoSteps` groups
the batches, times the groups and keeps what it measured.
"""

from __future__ import annotations

import collections
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, NamedTuple, final

import jax
import numpy as np

from ciclo._src.batches import BatchSizeFn, cut, is_stacked, leading_dim, stack, steps_of
from ciclo._src.logs import Logs

_log = logging.getLogger("ciclo")

AUTO: Final = "auto"
"""The value of `steps_per_execution` that asks for this."""

TARGET_SHARE: Final = 0.05
"""The loop's cost per step that auto accepts, as a share of a step's device time."""

MAX_STEPS: Final = 128
"""The most steps per dispatch auto chooses: a group's batches are on the device together."""

CALIBRATION_STEPS: Final = 256
"""The most training steps auto measures on; at most half the steps before `stop` when it is known."""

REPEATS: Final = 3
"""Timed dispatches per K, after one untimed dispatch that compiles the step for that K."""

COLLECTION: Final = "performance"
"""The history collection of the chosen K (loggers write it; progress bars do not show it)."""

ENTRY: Final = "steps_per_execution"
"""The history entry of the chosen K."""

# The clock and the wait for the device, read at each use: tests replace them to measure
# without timing anything.
_clock: Callable[[], float] = time.perf_counter
_block: Callable[[Any], Any] = jax.block_until_ready


class Timing(NamedTuple):
    """What was measured at one number of steps per dispatch.

    Attributes:
        host: seconds for the host to return from a dispatch, without waiting for
            the device (the loop's callbacks of the step and the step's call).
        device: seconds per step from the dispatch until its result is ready
            (blocked on), the dispatch's steps over its number of steps.
    """

    host: float
    device: float


def loop_share(steps: int, timing: Timing) -> float:
    """The loop's own cost per step (host seconds per dispatch / `steps`) over a step's device seconds.

    Example:
        >>> round(loop_share(4, Timing(host=40e-6, device=1e-3)), 3)
        0.01
    """
    if timing.device <= 0:
        return math.inf
    return timing.host / steps / timing.device


def choose(timings: Mapping[int, Timing], cap: int) -> int:
    """The steps per dispatch to run with, from the timings measured at 1, 2, 4, ... steps per dispatch.

    The smallest measured K at which the loop's share (`loop_share`) is under
    `TARGET_SHARE`. When none is, the power of two at which it would be, from
    the timing at the largest K measured: a dispatch's host time does not grow
    with its steps. Never more than `cap`; 1 without timings.

    Args:
        timings: a `Timing` per steps per dispatch (powers of two).
        cap: the most steps per dispatch, a power of two (`MAX_STEPS`, or the
            largest power of two in an epoch).

    Example:
        >>> tiny = {1: Timing(host=300e-6, device=310e-6), 2: Timing(host=300e-6, device=160e-6)}
        >>> choose(tiny, cap=128), choose(tiny, cap=16)
        (64, 16)
        >>> choose({1: Timing(host=300e-6, device=20e-3)}, cap=128)
        1
    """
    measured = sorted(steps for steps in timings if steps <= cap)
    for steps in measured:
        if loop_share(steps, timings[steps]) < TARGET_SHARE:
            return steps
    if not measured:
        return 1
    largest = measured[-1]
    steps = largest
    while steps < cap and loop_share(steps, timings[largest]) >= TARGET_SHARE:
        steps *= 2
    return min(steps, cap)


def largest_power_of_two(limit: int) -> int:
    """The largest power of two not above `limit` (>= 1).

    Example:
        >>> largest_power_of_two(10), largest_power_of_two(128), largest_power_of_two(1)
        (8, 128, 1)
    """
    return 1 << (max(limit, 1).bit_length() - 1)


def _agreed(value: int) -> int:
    """`value` as process 0 has it: under several processes (`jax.distributed`), all run the same groups.

    Each process measures its own timings, so each would choose on its own;
    the group sizes must agree, or the processes' compiled steps would differ.
    Every process calls this at the same step: the decisions fall at counts of
    steps that the group sizes alone fix.
    """
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


def _median(timings: Sequence[Timing]) -> Timing:
    return Timing(statistics.median(t.host for t in timings), statistics.median(t.device for t in timings))


def _describe(timings: Mapping[int, Timing]) -> str:
    return ", ".join(
        f"K={steps}: {timing.host * 1e6:.0f} us per dispatch, {timing.device * 1e6:.0f} us per step "
        f"({loop_share(steps, timing):.0%})"
        for steps, timing in sorted(timings.items())
    )


@final
class AutoSteps:
    """`steps_per_execution="auto"` for one `train_loop`: groups the batches, times them, chooses K.

    `groups(dataset)` is the loop's dataset: single batches first, then
    `ciclo.types.Stacked` groups of 2, 4, ... batches while it measures, then
    groups of the chosen K, every group cut as `ciclo.stacked` cuts them (at
    the epoch ends and at `stop`). `before_step` (the first callback of each
    step) and `after_dispatch` (the last of the step's phase) time the
    dispatches while it measures: each K's first dispatch compiles and is not
    timed, the next `REPEATS` are. Once it chooses, they return at once.

    It is a stateful callback of the loop: a backup keeps the group sizes it
    drew while measuring, its timings and its choice, so a resumed run draws
    the same groups (and skips those the backed-up run trained on).

    Args:
        align: the epoch's length in steps, if any: no group crosses an epoch's
            end, and K is at most the largest power of two in it.
        start: the step count of the first batch.
        total: how many steps the loop runs (to its `stop`), if known.
        batch_size_fn: counts a batch's samples.

    Example:
        >>> import numpy as np
        >>> auto = AutoSteps(align=None, start=0, total=8, batch_size_fn=None)
        >>> [type(batch).__name__ for batch in auto.groups([np.ones(2)] * 8)]  # too short to measure
        ['ndarray', 'ndarray', 'ndarray', 'ndarray', 'ndarray', 'ndarray', 'ndarray', 'ndarray']
        >>> auto.chosen
        1
    """

    state_key = "steps_per_execution='auto'"
    """The key of its state in a backup."""

    def __init__(
        self, *, align: int | None, start: int, total: int | None, batch_size_fn: BatchSizeFn | None
    ) -> None:
        self._align, self._start, self._total = align, start, total
        self._count = leading_dim if batch_size_fn is None else batch_size_fn
        self._cap = largest_power_of_two(MAX_STEPS if align is None else min(MAX_STEPS, align))
        self._budget = CALIBRATION_STEPS if total is None else min(CALIBRATION_STEPS, total // 2)
        self.chosen: int | None = None
        """The chosen steps per dispatch; None while measuring."""
        self._candidate = 1  # the K being measured
        self._timed: dict[int, list[Timing]] = {}
        self._compiled: set[int] = set()  # the Ks dispatched once already, in this process
        self._started: float | None = None  # the clock when the timed dispatch in flight began
        self._calibrated = 0  # the steps drawn while measuring
        self._sizes: list[list[int]] = []  # the K of each group drawn while measuring, as [K, groups] runs
        self._replay: collections.deque[int] = collections.deque()  # a resumed run's sizes, drawn again
        self._wanted, self._recording = 1, False  # the K of the group being drawn, and whether to record it
        self._announce = False  # the choice is still to be logged in the history

    def __repr__(self) -> str:
        return f"steps_per_execution={AUTO!r}"

    def groups(self, dataset: Iterable[Any]) -> Iterator[Any]:
        """The batches of `dataset` as the loop runs them: plain at K = 1, else `Stacked` groups."""
        for group in cut(dataset, self._next_size, align=self._align, start=self._start, total=self._total):
            if self._recording:  # before the group is yielded: a backup after its step must know it
                self._record(self._wanted, len(group))
            yield group[0] if self._wanted == 1 else stack(group, self._count)

    def _next_size(self) -> int:
        recording = False
        if self._replay:
            wanted = self._replay.popleft()
        else:
            if self.chosen is None and self._calibrated >= self._budget:
                self._decide()
            if self.chosen is None:
                wanted, recording = self._candidate, True
            else:
                wanted = self.chosen
        self._wanted, self._recording = wanted, recording
        return wanted

    def _record(self, wanted: int, steps: int) -> None:
        if self._sizes and self._sizes[-1][0] == wanted:
            self._sizes[-1][1] += 1
        else:
            self._sizes.append([wanted, 1])
        self._calibrated += steps

    def before_step(self, state: Any, batch: Any) -> None:
        """While measuring, the first callback of a step: waits for the device, then starts the clock."""
        if self.chosen is not None:
            return
        steps = steps_of(batch)
        if is_stacked(batch) != (steps > 1):
            return  # a group cut to one batch: neither what K=1 runs nor a group
        if steps not in self._compiled:
            self._compiled.add(steps)  # this dispatch compiles the step for its K: not timed
            return
        _block(state)  # the steps before are done: the device starts this dispatch idle
        self._started = _clock()

    def after_dispatch(self, state: Any, batch: Any) -> Logs | None:
        """The last callback of the step's phase: times the dispatch; logs K in the history once chosen."""
        started = self._started
        if started is not None:
            self._started = None
            dispatched = _clock()
            _block(state)
            done = _clock()
            steps = steps_of(batch)
            self._timed.setdefault(steps, []).append(Timing(dispatched - started, (done - started) / steps))
            if self.chosen is None and steps == self._candidate and len(self._timed[steps]) >= REPEATS:
                self._next_candidate()
        if self._announce:
            self._announce = False
            return Logs().add_entry(COLLECTION, ENTRY, self.chosen)
        return None

    def _next_candidate(self) -> None:
        steps = self._candidate
        done = (
            loop_share(steps, _median(self._timed[steps])) < TARGET_SHARE
            or 2 * steps > self._cap
            or self._calibrated + (REPEATS + 1) * 2 * steps > self._budget
        )
        if _agreed(int(done)):
            self._decide()
        else:
            self._candidate = 2 * steps

    def _measured(self) -> dict[int, Timing]:
        """The median timing of each K timed `REPEATS` times (a K cut short by the budget does not count)."""
        return {
            steps: _median(timings)
            for steps, timings in self._timed.items()
            if len(timings) >= REPEATS and steps == largest_power_of_two(steps)
        }

    def _decide(self) -> None:
        timings = self._measured()
        self.chosen = _agreed(choose(timings, self._cap))
        self._announce = True
        if not timings:
            _log.info(
                "steps_per_execution='auto': the run is too short to measure (%d steps to measure on, "
                "half the steps to stop; a K takes %d): it runs with 1 step per dispatch",
                self._budget,
                REPEATS + 1,
            )
            return
        share = loop_share(self.chosen, timings[self.chosen]) if self.chosen in timings else None
        _log.info(
            "steps_per_execution='auto' runs %d steps per dispatch after %d steps of measuring (%s); "
            "measured host time per dispatch, device time per step and the loop's share: %s",
            self.chosen,
            self._calibrated,
            f"the loop costs {share:.1%} of a step's device time"
            if share is not None and share < TARGET_SHARE
            else f"extrapolated to the {TARGET_SHARE:.0%} target, at most {self._cap}",
            _describe(timings),
        )

    def on_end(self, loop_state: Any, error: BaseException | None) -> None:
        """At the loop's end: says so when it ended before a K was chosen."""
        if self.chosen is None and self._calibrated:
            timings = self._measured()
            _log.info(
                "steps_per_execution='auto': the run ended after %d steps, before it had measured enough to "
                "choose; it ran up to %d steps per dispatch (measured: %s)",
                self._calibrated,
                self._candidate,
                _describe(timings) if timings else "nothing",
            )

    def state_dict(self) -> dict[str, Any]:
        """The sizes of the groups drawn while measuring, the timings and the choice."""
        return {
            "chosen": self.chosen,
            "candidate": self._candidate,
            "calibrated": self._calibrated,
            "announce": self._announce,
            "sizes": [list(run) for run in self._sizes],
            "timings": [
                [steps, timing.host, timing.device]
                for steps, timings in sorted(self._timed.items())
                for timing in timings
            ],
        }

    def load_state_dict(self, state: Any, /) -> None:
        """Takes back a `state_dict()`: the groups it lists are drawn again before any other."""
        self.chosen = state["chosen"]
        self._candidate = state["candidate"]
        self._calibrated = state["calibrated"]
        self._announce = state["announce"]
        self._sizes = [[int(wanted), int(groups)] for wanted, groups in state["sizes"]]
        self._replay = collections.deque(wanted for wanted, groups in self._sizes for _ in range(groups))
        self._timed = {}
        for steps, host, device in state["timings"]:
            self._timed.setdefault(int(steps), []).append(Timing(float(host), float(device)))
