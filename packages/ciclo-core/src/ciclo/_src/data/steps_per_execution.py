"""`train_loop(steps_per_execution=)`: the batches grouped into `Stacked` groups, K fixed or `"auto"`.

`"auto"` measures K on the first steps (docs/performance.md); its timers are plain callback
objects (`ciclo.types.LoopCallback`) the loop places around its step.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import statistics
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, Literal, NamedTuple, final

import jax
import numpy as np

from ciclo._src.base.batches import BatchSizeFn, cut, is_stacked, leading_dim, stack, stacked, steps_of
from ciclo._src.base.checks import check_int
from ciclo._src.base.elapsed import Period, only_steps
from ciclo._src.base.reprs import short
from ciclo._src.data.position import iterate_dataset
from ciclo._src.logs.logs import PERFORMANCE, Logs

_log = logging.getLogger("ciclo")

AUTO: Final = "auto"
TARGET_SHARE: Final = 0.05  # the loop's cost per step auto accepts, as a share of a step's device time
MAX_STEPS: Final = 128  # a group's batches are on the device together
CALIBRATION_STEPS: Final = 256  # the most training steps auto measures on
CALIBRATION_SHARE: Final = 4  # and at most 1/4 of the steps before `stop`: each K measured compiles
REPEATS: Final = 3  # timed dispatches per K, after one untimed dispatch that compiles it
ENTRY: Final = "steps_per_execution"  # the chosen K's entry in the history's `performance` collection
REMEMBERED: Final = 32  # the measurements (steps, state and batch shapes) the process remembers

# Read at each use: tests replace them to measure without timing anything.
_clock: Callable[[], float] = time.perf_counter
_block: Callable[[Any], Any] = jax.block_until_ready


class Timing(NamedTuple):
    """What was measured at one number of steps per dispatch, in seconds."""

    host: float  # for the host to return from a dispatch (the step's callbacks and call), not waiting
    device: float  # per step, from the dispatch until its result is ready


def loop_share(steps: int, timing: Timing) -> float:
    """The loop's own cost per step (host seconds per dispatch / `steps`) over a step's device seconds."""
    if timing.device <= 0:
        return math.inf
    return timing.host / steps / timing.device


def dispatch_cost(timings: Mapping[int, Timing]) -> Timing:
    """`fixed + K * step`, the time of a dispatch of K steps, fitted between the smallest and largest K.

    Returned as a `Timing` of K = 1 (`host` the fixed cost, `device` the step);
    from one K measured, that K's (a dispatch's host time does not grow with
    its steps).
    """
    small, large = min(timings), max(timings)
    if small == large:
        return Timing(host=timings[small].host * small, device=timings[small].device)
    small_total, large_total = timings[small].device * small, timings[large].device * large
    step = (large_total - small_total) / (large - small)
    if step <= 0:  # noise larger than the steps' own time: the dispatch is all there is
        return Timing(host=small_total, device=0.0)
    return Timing(host=max(small_total - small * step, 0.0), device=step)


def choose(timings: Mapping[int, Timing], cap: int) -> int:
    """The smallest power of two (at most `cap`) where the loop's share of a step is under `TARGET_SHARE`."""
    fitted = {steps: timing for steps, timing in timings.items() if steps <= cap}
    steps = 1
    while fitted and steps < cap and loop_share(steps, dispatch_cost(fitted)) >= TARGET_SHARE:
        steps *= 2
    return steps


class _Measured(NamedTuple):
    timings: Mapping[int, Timing]
    budget: int  # the steps it measured on


# What the runs of this process measured, by `signature` and the first batch's shapes, oldest first.
# Like jax.jit's cache, it holds the step functions and the static parts of the state's tree.
_remembered: collections.OrderedDict[Hashable, _Measured] = collections.OrderedDict()


def _abstract(tree: Any) -> tuple[Any, ...]:
    """The tree's structure and its leaves' shapes, dtypes and shardings: what a compiled program is for."""
    leaves, treedef = jax.tree.flatten(tree)
    return (
        treedef,
        *(
            (leaf.shape, leaf.dtype, leaf.sharding if isinstance(leaf, jax.Array) else None)
            if isinstance(leaf, (jax.Array, np.ndarray, np.generic))
            else type(leaf)
            for leaf in leaves
        ),
    )


def signature(state: Any, steps: Sequence[Callable[..., Any]]) -> Hashable:
    """The step functions and the state's shapes (a run whose key cannot be hashed is not remembered)."""
    return (tuple(steps), _abstract(state))


def largest_power_of_two(limit: int) -> int:
    """The largest power of two not above `limit` (>= 1)."""
    return 1 << (max(limit, 1).bit_length() - 1)


def _agreed(value: int) -> int:
    """`value` as process 0 has it: under `jax.distributed` all processes must run the same groups."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


_END: Final = object()


def _describe(timings: Mapping[int, Timing]) -> str:
    return ", ".join(
        f"K={steps}: {timing.host * 1e6:.0f} us per dispatch, {timing.device * 1e6:.0f} us per step "
        f"({loop_share(steps, timing):.0%})"
        for steps, timing in sorted(timings.items())
    )


def group_steps(
    dataset: Iterable[Any],
    steps_per_execution: int | Literal["auto"],
    *,
    epoch: Period | None,
    stop: Period | None,
    start: int,
    batch_size_fn: BatchSizeFn | None,
    state: Any,
    steps: Sequence[Callable[..., Any]],
) -> tuple[Iterable[Any], list[Any], list[Any]]:
    """`dataset` in groups of `steps_per_execution` batches that cross no epoch end and not `stop`.

    `start` is the step count of the first batch (a resumed run's); under `"auto"`, the `steps`
    and the `state` name the measurement a later run of this process reuses. Returns the batches,
    and the callbacks the loop places first before its step and right after it.
    """
    if steps_per_execution != AUTO:
        check_int(steps_per_execution, "steps_per_execution", 1, ' or "auto" (measured)')
    if steps_per_execution == 1:
        return dataset, [], []
    dataset = iterate_dataset(dataset)
    for name, period in (("epoch_duration", epoch), ("stop", stop)):
        if period is not None and only_steps(period) is None:
            raise ValueError(
                f"steps_per_execution cuts its groups at the epoch ends and at stop, so {name} must "
                f"be a number of steps, got {short(period)}"
            )
    cuts: dict[str, Any] = {
        "align": None if epoch is None else epoch.steps,
        "start": start,
        "total": None if stop is None or stop.steps is None else max(stop.steps - start, 0),
        "batch_size_fn": batch_size_fn,
    }
    if isinstance(steps_per_execution, int):
        return stacked(dataset, steps_per_execution, **cuts), [], []
    auto = AutoSteps(**cuts, signature=signature(state, steps))
    return auto.groups(dataset), [_BeforeStep(auto)], [auto]


@final
class AutoSteps:
    """`steps_per_execution="auto"` for one `train_loop`: groups the batches, times them, chooses K.

    `groups(dataset)` is the loop's dataset; a `_BeforeStep` before the step
    and this callback after it time the dispatches while it measures. A backup
    keeps the sizes it drew, its timings and its choice: a resumed run draws the
    same groups. `align`, `start` and `total` cut the groups as `ciclo.stacked`
    does; `signature` reuses an earlier measurement.
    """

    state_key = "steps_per_execution='auto'"

    def __init__(
        self,
        *,
        align: int | None,
        start: int,
        total: int | None,
        batch_size_fn: BatchSizeFn | None,
        signature: Hashable,
    ) -> None:
        self._align, self._start, self._total = align, start, total
        self._count = leading_dim if batch_size_fn is None else batch_size_fn
        self._cap = largest_power_of_two(MAX_STEPS if align is None else min(MAX_STEPS, align))
        self._budget = (
            CALIBRATION_STEPS if total is None else min(CALIBRATION_STEPS, total // CALIBRATION_SHARE)
        )
        self._signature = signature
        self._key: Hashable | None = None  # the signature with the first batch's shapes
        self.chosen: int | None = None  # None while measuring
        self._candidate = 1  # the K being measured
        self._timed: dict[int, list[Timing]] = {}
        self._compiled: set[int] = set()  # the Ks dispatched once already, in this process
        self._started: float | None = None  # the clock when the timed dispatch in flight began
        self._calibrated = 0  # the steps drawn while measuring
        self._sizes: list[int] = []  # the K of each group drawn while measuring
        self._replay: collections.deque[int] = collections.deque()  # a resumed run's sizes, drawn again
        self._wanted, self._recording = 1, False  # the K of the group being drawn, and whether to record it
        self._announce = False  # the choice is still to be logged in the history

    def __repr__(self) -> str:
        return f"steps_per_execution={AUTO!r}"

    def groups(self, dataset: Iterable[Any]) -> Iterator[Any]:
        """The batches of `dataset` as the loop runs them: plain at K = 1, else `Stacked` groups."""
        batches = iter(dataset)
        if self._total != 0:
            first = next(batches, _END)
            if first is _END:
                return
            self._reuse((self._signature, _abstract(first)))
            batches = itertools.chain([first], batches)
        for group in cut(batches, self._next_size, align=self._align, start=self._start, total=self._total):
            if self._recording:  # before the group is yielded: a backup after its step must know it
                self._sizes.append(self._wanted)
                self._calibrated += len(group)
            yield group[0] if self._wanted == 1 else stack(group, self._count)

    def _reuse(self, key: Hashable) -> None:
        if self.chosen is not None:  # restored from a backup
            return
        try:
            earlier = _remembered.get(key)
        except (TypeError, ValueError):
            # A static field that cannot be compared (an array, which jax.jit refuses too): neither
            # reused nor remembered.
            earlier = None
        else:
            self._key = key
        if earlier is not None and earlier.budget < self._budget:
            earlier = None  # this run would measure on more steps than it did
        # Under several processes, process 0's memory decides for all.
        chosen = _agreed(0 if earlier is None else choose(earlier.timings, self._cap))
        if not chosen:
            return
        if earlier is not None:
            _remembered.move_to_end(key)
        self.chosen, self._announce = chosen, True
        _log.info(
            "steps_per_execution='auto' runs %d steps per dispatch, measured by an earlier train_loop of "
            "this process on the same steps, state and batch shapes (%s): it measures nothing",
            chosen,
            _describe(earlier.timings) if earlier is not None else "by process 0",
        )

    def _next_size(self, room: int) -> int:
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
            wanted = largest_power_of_two(min(wanted, room))  # a size compiled already
        self._wanted, self._recording = wanted, recording
        return wanted

    def before_step(self, state: Any, batch: Any) -> None:
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

    def __loop_callback__(self, loop_state: Any, /) -> Logs | None:
        """After the step's callbacks: the dispatch's times, and the choice once made."""
        state, batch = loop_state.state, loop_state.batch
        started = self._started
        if started is not None:
            self._started = None
            dispatched = _clock()
            _block(state)
            done = _clock()
            steps = steps_of(batch)
            self._timed.setdefault(steps, []).append(Timing(dispatched - started, (done - started) / steps))
            if self.chosen is None and steps == self._candidate and len(self._timed[steps]) >= REPEATS:
                enough = (  # measuring this K is enough, or the next is past the cap or the budget
                    loop_share(steps, dispatch_cost(self._measured())) < TARGET_SHARE
                    or 2 * steps > self._cap
                    or self._calibrated + (REPEATS + 1) * 2 * steps > self._budget
                )
                if _agreed(int(enough)):
                    self._decide()
                else:
                    self._candidate = 2 * steps
        if self._announce:
            self._announce = False
            return Logs().add_entry(PERFORMANCE, ENTRY, self.chosen)
        return None

    def _measured(self) -> dict[int, Timing]:
        """The median timing of each K timed `REPEATS` times (a K cut short by the budget does not count)."""
        return {
            steps: Timing(
                statistics.median(t.host for t in timings), statistics.median(t.device for t in timings)
            )
            for steps, timings in self._timed.items()
            if len(timings) >= REPEATS and steps == largest_power_of_two(steps)
        }

    def _decide(self) -> None:
        timings = self._measured()
        self.chosen = _agreed(choose(timings, self._cap))
        self._announce = True
        if timings and self._key is not None:
            _remembered[self._key] = _Measured(timings, self._budget)
            _remembered.move_to_end(self._key)
            while len(_remembered) > REMEMBERED:
                _remembered.popitem(last=False)
        if not timings:
            _log.info(
                "steps_per_execution='auto': the run is too short to measure (%d steps to measure on, "
                "1/%d of the steps to stop; a K takes %d): it runs with 1 step per dispatch",
                self._budget,
                CALIBRATION_SHARE,
                REPEATS + 1,
            )
            return
        share = (
            loop_share(self.chosen, dispatch_cost(timings))
            if self.chosen in timings or len(timings) > 1
            else None
        )
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
        return {
            "chosen": self.chosen,
            "candidate": self._candidate,
            "calibrated": self._calibrated,
            "announce": self._announce,
            "sizes": list(self._sizes),
            "timings": [
                [steps, timing.host, timing.device]
                for steps, timings in sorted(self._timed.items())
                for timing in timings
            ],
        }

    def load_state_dict(self, state: Any, /) -> None:
        self.chosen = state["chosen"]
        self._candidate = state["candidate"]
        self._calibrated = state["calibrated"]
        self._announce = state["announce"]
        self._sizes = [int(wanted) for wanted in state["sizes"]]
        self._replay = collections.deque(self._sizes)
        self._timed = {}
        for steps, host, device in state["timings"]:
            self._timed.setdefault(int(steps), []).append(Timing(float(host), float(device)))


@final
class _BeforeStep:
    """Starts `AutoSteps`' clock before the step's first callback (its lifecycle is the `AutoSteps`')."""

    def __init__(self, auto: AutoSteps) -> None:
        self._auto = auto

    def __repr__(self) -> str:
        return repr(self._auto)

    def __loop_callback__(self, loop_state: Any, /) -> None:
        self._auto.before_step(loop_state.state, loop_state.batch)
