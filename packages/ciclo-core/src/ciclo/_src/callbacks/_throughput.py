"""Throughput: steps and samples per second, measured on the host clock over a window; FLOPs and MFU."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from time import perf_counter
from typing import Any, ClassVar, Final, final

import jax

from ciclo._src.base.checks import check_positive
from ciclo._src.base.elapsed import Elapsed, Period, PeriodLike
from ciclo._src.base.reprs import short
from ciclo._src.base.types import CallbackOutput, S
from ciclo._src.engine.callback import Callback
from ciclo._src.engine.loop_state import LoopState
from ciclo._src.logs.logs import Logs, LogsLike
from ciclo._src.logs.step_output import NO_LOGS
from ciclo._src.state.managed import ManagedStep

_log = logging.getLogger("ciclo")

PEAK_FLOPS: Final[Mapping[str, float]] = {
    # NVIDIA datasheets (H100 and H200: SXM; A100: SXM and PCIe), bf16 tensor cores without sparsity.
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA H200": 989e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-PCIE-40GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12,
    "NVIDIA L4": 121e12,
    # Google Cloud TPU documentation, bf16 per chip.
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5": 459e12,
    "TPU v6 lite": 918e12,
}
"""The dense bf16 peak FLOP/s of one chip by `jax.Device.device_kind`, for `throughput`'s `mfu`."""


@final
class Throughput(Callback):
    """Logs steps and samples per second, measured over a window; see `ciclo.throughput`."""

    hook: ClassVar[str | None] = "on_train_step"

    def __init__(self, window: PeriodLike = 100, *, peak_flops: float | None = None) -> None:
        if peak_flops is not None and (
            isinstance(peak_flops, bool)
            or not isinstance(peak_flops, (int, float))
            or not 0 < peak_flops < math.inf
        ):
            raise ValueError(
                f"peak_flops must be a positive number, finite (a chip's peak FLOP/s, e.g. 989e12 for an "
                f"H100's bf16), or None for ciclo's table; got {short(peak_flops)}"
            )
        period = Period.of(window, name="window")
        if period is None:
            raise TypeError("window must be an int (steps) or a ciclo.types.Period, got None")
        if period.date is not None:
            raise ValueError(
                f"window must count steps, samples or time: a throughput window is a duration, not a date; "
                f"got {short(window)}"
            )
        check_positive(period, "window", "pass a window of at least one step, sample or second")
        self._peak = None if peak_flops is None else float(peak_flops)
        self._steps: tuple[ManagedStep[Any], ...] | None = None  # the loop's steps, when a loop said
        self._flops: tuple[float, float | None] | None = None  # (per step, peak of all devices), once read
        self._read = False  # whether the steps' FLOPs were read in this loop
        self.window: Period = period
        """The window over which each rate is measured."""
        # (steps, samples, seconds) any of which closes a window; inf where the window does not count it.
        self._limits = tuple(
            math.inf if limit is None else limit for limit in (period.steps, period.samples, period.time)
        )
        # (host time, steps, samples) where the current window started; None before the first call.
        self._start: tuple[float, int, int] | None = None

    def watch(self, steps: Iterable[Any]) -> None:
        """Takes the steps run before it (`watch_steps` calls it): their FLOPs are read at its first call."""
        self._steps = tuple(step for step in steps if isinstance(step, ManagedStep))
        if not self._steps:
            names = ", ".join(short(step) for step in steps) or "none"
            _log.info(
                "ciclo.throughput logs no flops: no step of the loop is a managed step (%s), whose compiled "
                "program ciclo can analyse (see docs/logging.md, Throughput)",
                names,
            )

    def __call__(self, elapsed: Elapsed) -> Logs:
        """Measures after the step `elapsed` (from `ciclo.elapse`) describes: the rates if a window closed."""
        return Logs(self._measure(elapsed))

    def __loop_callback__(self, loop_state: LoopState[S]) -> CallbackOutput[S]:
        if not self._read:
            self._read = True
            self._flops = self._read_flops(loop_state.state, loop_state.batch)
        return self._measure(loop_state.elapsed), loop_state.state

    def on_end(self, loop_state: LoopState[Any], error: BaseException | None) -> None:
        # The next loop starts a new window: the time between two loops is not throughput.
        self._start = None
        self._read = False

    def _read_flops(self, state: Any, batch: Any) -> tuple[float, float | None] | None:
        """The FLOPs of one step (of all the managed steps) and the peak of the devices, once per loop."""
        if not self._steps:
            return None
        counts = [step_flops(step, state, batch) for step in self._steps]
        analysed = [count for count in counts if count is not None]
        if not analysed:
            _log.info(
                "ciclo.throughput logs no flops: XLA gave no cost analysis for %s (a strategy that runs one "
                "program per device, such as pmap, is not analysed)",
                ", ".join(repr(step) for step in self._steps),
            )
            return None
        kind = jax.devices()[0].device_kind
        peak = self._peak if self._peak is not None else PEAK_FLOPS.get(kind)
        if peak is None:
            _log.info(
                "ciclo.throughput logs no mfu: no peak FLOP/s is known for device kind %r; pass "
                "ciclo.throughput(peak_flops=...) (one device's peak)",
                kind,
            )
            return sum(analysed), None
        # The devices the state's arrays are on: those the step runs on.
        arrays = (leaf for leaf in jax.tree.leaves(state) if isinstance(leaf, jax.Array))
        return sum(analysed), peak * next((len(leaf.sharding.device_set) for leaf in arrays), 1)

    def _measure(self, elapsed: Elapsed) -> LogsLike:
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
        metrics = {"steps_per_second": steps_done / seconds, "samples_per_second": samples_done / seconds}
        if self._flops is not None:
            per_step, peak = self._flops
            metrics["flops_per_step"] = per_step
            metrics["flops_per_second"] = per_step * steps_done / seconds
            if peak is not None:
                metrics["mfu"] = metrics["flops_per_second"] / peak
        return {"metrics": metrics}

    def __repr__(self) -> str:
        peak = "" if self._peak is None else f", peak_flops={self._peak!r}"
        return f"ciclo.throughput(window={self.window!r}{peak})"


def step_flops(step: ManagedStep[Any], state: Any, batch: Any) -> float | None:
    """The floating-point operations of one step on `state` and `batch`, from XLA's cost analysis.

    The step is lowered (traced), not compiled, and counted over all devices; for a `Stacked` group,
    one of its steps. None under `pmap`, or when XLA gives no count.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> @managed.step
        ... def test_step(state, batch):
        ...     return ciclo.logs().add_metric("y", (batch @ state.params).sum()), state
        >>> state = managed.ManagedState.create(params=jnp.ones((8, 4)), tx=optax.sgd(0.1))
        >>> ciclo.step_flops(test_step, state, jnp.ones((32, 8))) > 2 * 32 * 8 * 4 - 1
        True
    """
    lowered = step.lower(state, batch)
    cost = None if lowered is None else lowered.cost_analysis()
    flops = None if cost is None else cost.get("flops")
    return None if flops is None or flops <= 0 else float(flops)


def watch_steps(callbacks: Any) -> None:
    """Tells each `ciclo.throughput` in a list of `callbacks` the steps before it, whose FLOPs it reads."""
    if not isinstance(callbacks, (list, tuple)):
        return
    for index, callback in enumerate(callbacks):
        if isinstance(callback, Throughput):
            callback.watch(callbacks[:index])


def throughput(window: PeriodLike = 100, *, peak_flops: float | None = None) -> Throughput:
    """Creates a callback that logs the loop's throughput: steps and samples per second, FLOPs and MFU.

    Each time `window` has passed, it logs `steps_per_second` and
    `samples_per_second` in `metrics`, from the loop's counts over the host's
    clock (it never waits for the device); the first call only starts the
    clock. With a managed step it also logs XLA's `flops_per_step`,
    `flops_per_second` and, with a peak, `mfu`. Put it after the step, or in
    `train_loop(callbacks=[...])`; by hand `meter(elapsed)` returns the logs.
    See docs/logging.md, "Throughput".

    Args:
        window: how long each measurement lasts: an int (steps) or a
            `ciclo.types.Period` in steps, samples or time.
        peak_flops: one device's peak FLOP/s (positive, finite), for `mfu`; None: ciclo's table
            (no `mfu` for a device kind it lacks, as CPUs).

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
    return Throughput(window, peak_flops=peak_flops)
