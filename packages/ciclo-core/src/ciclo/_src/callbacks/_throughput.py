"""Throughput: steps and samples per second, measured on the host clock over a window."""

from __future__ import annotations

import math
from time import perf_counter
from typing import Any, ClassVar, final

from ciclo._src.base.elapsed import Elapsed, Period, PeriodLike, to_period
from ciclo._src.base.reprs import short
from ciclo._src.base.types import CallbackOutput, S
from ciclo._src.engine.callback import Callback
from ciclo._src.engine.loop_state import LoopState
from ciclo._src.logs.logs import Logs, LogsLike
from ciclo._src.logs.step_output import NO_LOGS

STEPS_PER_SECOND = "steps_per_second"
"""The name of the logged steps per second (in the `metrics` collection)."""

SAMPLES_PER_SECOND = "samples_per_second"
"""The name of the logged samples per second (in the `metrics` collection)."""


def _check_window(window: PeriodLike) -> Period:
    period = to_period(window, name="window")
    if period is None:
        raise TypeError("window must be an int (steps) or a ciclo.types.Period, got None")
    if period.date is not None:
        raise ValueError(
            f"window must count steps, samples or time: a throughput window is a duration, not a date; "
            f"got {short(window)}"
        )
    if not (period.steps or period.samples or period.time):
        raise ValueError(f"window must be longer than zero, got {short(window)}")
    return period


@final
class Throughput(Callback):
    """Logs steps and samples per second, measured over a window; see `ciclo.throughput`.

    Example:
        >>> import numpy as np
        >>> import ciclo
        >>> meter = ciclo.throughput(window=2)
        >>> def train_step(state, batch):
        ...     return ciclo.logs().add_metric("loss", batch.mean()), state
        >>> batches = [np.ones(8)] * 5
        >>> _, history, _ = ciclo.loop(None, batches, {ciclo.every(1): [train_step, meter]})
        >>> steps, rates = history.collect("steps", "steps_per_second")
        >>> steps  # the clock starts at step 0; a window closes every 2 steps
        [2, 4]
    """

    hook: ClassVar[str | None] = "on_train_step"

    def __init__(self, window: PeriodLike = 100) -> None:
        self._window = window = _check_window(window)
        # (steps, samples, seconds) any of which closes a window; inf where the window does not count it.
        self._limits = tuple(
            math.inf if limit is None else limit for limit in (window.steps, window.samples, window.time)
        )
        # (host time, steps, samples) where the current window started; None before the first call.
        self._start: tuple[float, int, int] | None = None

    @property
    def window(self) -> Period:
        """The window over which each rate is measured."""
        return self._window

    def __call__(self, elapsed: Elapsed) -> Logs:
        """Measures after the step `elapsed` (from `ciclo.elapse`) describes: the rates if a window closed."""
        return Logs(self._measure(elapsed))

    def __loop_callback__(self, loop_state: LoopState[S]) -> CallbackOutput[S]:
        return self._measure(loop_state.elapsed), loop_state.state

    def on_end(self, loop_state: LoopState[Any], error: BaseException | None) -> None:
        # The next loop starts a new window: the time between two loops is not throughput.
        self._start = None

    def _measure(self, elapsed: Elapsed) -> LogsLike:
        # The hot path: two ints, one clock read and a comparison until the window closes.
        now, steps, samples = perf_counter(), elapsed.steps, elapsed.samples
        start = self._start
        if start is None:
            # The first call starts the clock: the first step, which compiles, is not counted.
            self._start = (now, steps, samples)
            return NO_LOGS
        start_time, start_steps, start_samples = start
        seconds = now - start_time
        steps_done, samples_done = steps - start_steps, samples - start_samples
        max_steps, max_samples, max_seconds = self._limits
        if seconds <= 0 or (steps_done < max_steps and samples_done < max_samples and seconds < max_seconds):
            return NO_LOGS
        self._start = (now, steps, samples)
        return {
            "metrics": {
                STEPS_PER_SECOND: steps_done / seconds,
                SAMPLES_PER_SECOND: samples_done / seconds,
            }
        }

    def __repr__(self) -> str:
        return f"ciclo.throughput(window={self._window!r})"


def throughput(window: PeriodLike = 100) -> Throughput:
    """Creates a callback that logs the loop's throughput: steps and samples per second.

    Each time `window` has passed since the last measurement, it logs
    `steps_per_second` and `samples_per_second` in the `metrics` collection (so
    progress bars show them and loggers write them): the steps and samples the
    loop's `ciclo.types.Elapsed` advanced by (a `ciclo.stacked` group counts all
    its steps; samples are counted by `batch_size_fn`), over the host seconds
    (`time.perf_counter`) it took. Nothing is read from the device: with
    asynchronous dispatch the host runs at most a few steps ahead, so over many
    steps the host's rate is the device's. The time includes everything the
    loop does between two calls (data, evaluation, checkpoints). The first call
    only starts the clock, so the first step, which usually compiles, is not
    counted; each loop starts a new window.

    Put it after the step in `ciclo.loop`'s callbacks, or in
    `train_loop(callbacks=[...])`, where it runs as the `on_train_step` hook,
    before the progress bars (not in the evaluation loop inside `train_loop`).
    By hand, `meter(elapsed)` returns the logs.

    Args:
        window: how long each measurement lasts: an int (steps) or a
            `ciclo.types.Period` in steps, samples or time (`ciclo.at(time=10)`
            logs about every 10 seconds). A window closes at the first call at
            which it has passed.

    Returns:
        A `Throughput` callback.

    Raises:
        TypeError: if `window` is not an int or a `ciclo.types.Period`.
        ValueError: if `window` is negative or zero, or counts toward a date.

    Example:
        >>> import numpy as np
        >>> import ciclo
        >>> def train_step(state, batch):
        ...     return ciclo.logs().add_metric("loss", batch.mean()), state
        >>> batches = [np.ones(32)] * 30
        >>> _, history, _ = ciclo.train_loop(
        ...     None, batches, {ciclo.on_train_step: [train_step]}, callbacks=[ciclo.throughput(10)]
        ... )
        >>> steps, rates = history.collect("steps", "samples_per_second")
        >>> steps  # the clock starts at step 0; a window closes every 10 steps
        [10, 20]
    """
    return Throughput(window)
