from __future__ import annotations

import io
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.array import ArrayImpl
from support.bars import Clock

import ciclo
from ciclo._src.callbacks import _throughput


@pytest.fixture
def host_clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The host clock the throughput callback reads, advanced by the tests' steps."""
    fake = Clock()
    monkeypatch.setattr(_throughput, "perf_counter", fake)
    return fake


def timed_step(clock: Clock, seconds: float) -> Any:
    def train_step(state: int, batch: Any) -> tuple[ciclo.types.Logs, int]:
        clock.now += seconds
        return ciclo.logs().add_metric("loss", 1.0), state + 1

    return train_step


def batches(count: int, size: int = 8) -> list[np.ndarray]:
    return [np.zeros((size, 2), np.float32)] * count


# --- what is logged, and when -----------------------------------------------------------------


def test_logs_steps_and_samples_per_second_once_per_window(host_clock: Clock) -> None:
    meter = ciclo.throughput(window=4)
    _, history, _ = ciclo.loop(0, batches(13), {ciclo.every(1): [timed_step(host_clock, 0.5), meter]})
    steps, steps_per_second, samples_per_second = history.collect(
        "steps", "metrics.steps_per_second", "metrics.samples_per_second"
    )
    # The clock starts at the first call (step 0); windows close at steps 4, 8 and 12.
    assert steps == [4, 8, 12]
    assert steps_per_second == [2.0, 2.0, 2.0]  # 4 steps in 2 s
    assert samples_per_second == [16.0, 16.0, 16.0]  # 4 batches of 8 in 2 s
    assert all(type(value) is float for value in steps_per_second + samples_per_second)


def test_each_window_measures_its_own_steps(host_clock: Clock) -> None:
    seconds = iter([0.1, 0.1, 0.1, 0.1, 0.5, 0.5, 0.5, 0.5, 0.5])

    def step(state: int) -> int:
        host_clock.now += next(seconds)
        return state + 1

    _, history, _ = ciclo.loop(0, batches(9), {ciclo.every(1): [step, ciclo.throughput(window=4)]})
    # Each window is timed from the call that closed the previous one: 4 steps in 0.1 * 3 + 0.5 s,
    # then 4 steps in 4 * 0.5 s.
    assert history.collect("steps", "steps_per_second") == ([4, 8], pytest.approx([5.0, 2.0]))


@pytest.mark.parametrize(
    ("window", "expected_steps"),
    [
        (ciclo.at(time=1.0), [4, 8]),  # 0.25 s per step
        (ciclo.at(samples=24), [3, 6, 9]),  # 8 samples per batch
        (ciclo.at(steps=5), [5]),
        (ciclo.at(steps=100, time=1.5), [6]),  # whichever comes first
    ],
)
def test_window_in_time_samples_or_steps(
    host_clock: Clock, window: ciclo.types.Period, expected_steps: list[int]
) -> None:
    _, history, _ = ciclo.loop(
        0, batches(10), {ciclo.every(1): [timed_step(host_clock, 0.25), ciclo.throughput(window)]}
    )
    assert history.collect("steps", "steps_per_second")[0] == expected_steps
    assert history.collect("steps_per_second") == [4.0] * len(expected_steps)


def test_scheduled_less_often_measures_the_steps_in_between(host_clock: Clock) -> None:
    meter = ciclo.throughput(window=1)
    _, history, _ = ciclo.loop(
        0, batches(12, size=2), {ciclo.every(1): timed_step(host_clock, 0.5), ciclo.every(4): meter}
    )
    assert history.collect("steps", "steps_per_second", "samples_per_second") == (
        [4, 8],
        [2.0, 2.0],
        [4.0, 4.0],
    )


def test_a_stacked_group_counts_all_its_steps(host_clock: Clock) -> None:
    def group_step(state: int, group: ciclo.types.Stacked[Any]) -> int:
        host_clock.now += 1.0  # one dispatch of 4 steps per second
        return state + group.steps

    state, history, _ = ciclo.loop(
        0, ciclo.stacked(batches(16), 4), {ciclo.every(1): [group_step, ciclo.throughput(window=8)]}
    )
    assert state == 16
    assert history.collect("steps", "steps_per_second", "samples_per_second") == ([8], [4.0], [32.0])


def test_no_logs_while_the_host_clock_has_not_moved(host_clock: Clock) -> None:
    _, history, _ = ciclo.loop(0, batches(10), {ciclo.every(1): [lambda: None, ciclo.throughput(window=2)]})
    assert len(history) == 0


# --- train_loop and progress bars -------------------------------------------------------------


class Counter:
    """A `ciclo.types.Trainable` state whose steps advance the fake host clock."""

    def __init__(self, clock: Clock, count: int = 0) -> None:
        self.clock = clock
        self.count = count

    def train_step(self, batch: Any) -> tuple[ciclo.types.Logs, Counter]:
        self.clock.now += 0.25
        return ciclo.logs().add_loss("loss", 1.0 / (self.count + 1)), Counter(self.clock, self.count + 1)


def test_in_train_loop_callbacks_runs_after_the_step_and_before_the_bar(host_clock: Clock) -> None:
    buffer = io.StringIO()
    meter = ciclo.throughput(window=10)
    state, history, _ = ciclo.train_loop(
        Counter(host_clock),
        batches(40),
        callbacks=[ciclo.keras_bar(total=40, file=buffer), meter],
        stop=40,
    )
    assert state.count == 40
    assert history.collect("steps", "steps_per_second", "samples_per_second") == (
        [10, 20, 30],
        [4.0, 4.0, 4.0],
        [32.0, 32.0, 32.0],
    )
    # The bar runs at the end of the step, after the throughput was logged in it.
    assert (
        buffer.getvalue().splitlines()[-1].endswith("steps_per_second: 4.0000 - samples_per_second: 32.0000")
    )
    assert meter.hook == ciclo.on_train_step


def test_not_run_by_the_evaluation_inside_train_loop(host_clock: Clock) -> None:
    class Evaluated(Counter):
        def train_step(self, batch: Any) -> tuple[ciclo.types.Logs, Evaluated]:
            self.clock.now += 0.25
            return ciclo.logs(), Evaluated(self.clock, self.count + 1)

        def test_step(self, batch: Any) -> ciclo.types.Logs:
            self.clock.now += 1.0  # evaluation is wall-clock time of the loop too
            return ciclo.logs().add_metric("count", float(self.count))

    _, history, _ = ciclo.train_loop(
        Evaluated(host_clock),
        batches(12),
        callbacks=[ciclo.throughput(window=4)],
        test_dataset=lambda: batches(2),
        epoch_duration=6,
    )
    assert "steps_per_second_test" not in history.latest().get("metrics", {})
    # Steps 1-4 take 1 s; steps 5-8 take 1 s plus the 2 s evaluation after step 5.
    assert history.collect("steps", "steps_per_second") == ([4, 8], [4.0, pytest.approx(4 / 3)])


def test_in_predict_loop_tasks(host_clock: Clock) -> None:
    def predict_step(state: None, batch: np.ndarray) -> ciclo.types.Logs:
        host_clock.now += 0.5
        return ciclo.logs().add_output("y", batch)

    _, history, _ = ciclo.predict_loop(
        None,
        batches(5),
        {ciclo.hooks.on_predict_step: [predict_step], ciclo.every(1): [ciclo.throughput(window=2)]},
    )
    assert history.collect("steps", "samples_per_second") == ([2, 4], [16.0, 16.0])


def test_each_loop_starts_a_new_window(host_clock: Clock) -> None:
    meter = ciclo.throughput(window=2)
    step = timed_step(host_clock, 1.0)
    ciclo.loop(0, batches(3), {ciclo.every(1): [step, meter]})
    host_clock.now += 1000.0  # time between two loops is not counted
    _, history, _ = ciclo.loop(0, batches(3), {ciclo.every(1): [step, meter]})
    assert history.collect("steps", "steps_per_second") == ([2], [1.0])


def test_by_hand_with_elapse(host_clock: Clock) -> None:
    meter = ciclo.throughput(window=ciclo.at(time=2))
    logged = []
    for elapsed, _ in ciclo.elapse(batches(6, size=4)):
        host_clock.now += 1.0
        logs = meter(elapsed)
        assert isinstance(logs, ciclo.types.Logs)
        logged.append(dict(logs.get("metrics", {})))
    assert logged == [
        {},
        {},
        {"steps_per_second": 1.0, "samples_per_second": 4.0},
        {},
        {"steps_per_second": 1.0, "samples_per_second": 4.0},
        {},
    ]


# --- no device sync ---------------------------------------------------------------------------


def forbid_device_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes every way of reading a `jax.Array`'s value, or waiting for it, fail the test.

    (`jax.transfer_guard` does not guard CPU arrays, which need no transfer.)
    """

    def read(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a device value was read or waited for")

    for name in ("__array__", "__float__", "__int__", "__bool__", "item", "tolist", "block_until_ready"):
        monkeypatch.setattr(ArrayImpl, name, read)
    monkeypatch.setattr(ArrayImpl, "_value", property(read))
    monkeypatch.setattr(jax, "device_get", read)
    monkeypatch.setattr(jax, "block_until_ready", read)


@jax.jit
def jit_step(state: jax.Array, batch: jax.Array) -> tuple[ciclo.types.Logs, jax.Array]:
    state = state + batch.sum()
    return ciclo.logs().add_loss("loss", 1.0 / state), state


def test_never_reads_or_waits_for_a_device_value(host_clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    def tick() -> None:
        host_clock.now += 0.125

    data = [jnp.ones((4,), jnp.float32)] * 12
    state = jnp.float32(0.0)
    jit_step(state, data[0])  # compiled before the device is locked
    forbid_device_reads(monkeypatch)
    _, history, _ = ciclo.loop(state, data, {ciclo.every(1): [jit_step, tick, ciclo.throughput(window=4)]})
    monkeypatch.undo()
    assert history.collect("steps_per_second") == [8.0, 8.0]
    assert history.collect("samples_per_second") == [32.0, 32.0]


# --- the callback itself ----------------------------------------------------------------------


def test_is_a_loop_callback() -> None:
    meter: ciclo.types.LoopCallback[Any] = ciclo.throughput()
    assert isinstance(meter, ciclo.types.LoopCallback) and isinstance(meter, ciclo.types.Throughput)
    assert meter.window == ciclo.at(steps=100)
    assert (
        repr(ciclo.throughput(3))
        == "ciclo.throughput(window=Period(steps=3, samples=None, time=None, date=None))"
    )


@pytest.mark.parametrize(
    ("window", "error", "match"),
    [
        (0, ValueError, "0"),
        (-3, ValueError, "-3"),
        (ciclo.at(time=0), ValueError, "zero"),
        (ciclo.at(date=1e10), ValueError, "date"),
        (None, TypeError, "None"),
        ("10", TypeError, "'10'"),
        (2.5, TypeError, "2.5"),
    ],
)
def test_bad_window_raises_naming_the_value(window: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        ciclo.throughput(window)


# --- FLOPs and MFU ------------------------------------------------------------------------------


def _managed_run(clock: Clock, meter: Any, steps_per_execution: int = 1) -> tuple[Any, Any, Any]:
    import optax

    from ciclo import managed

    @managed.train_step
    def train_step(state: Any, batch: Any) -> Any:
        return ciclo.logs().add_loss("loss", jnp.mean(jnp.tanh(batch @ state.params) ** 2)), state

    # A matmul of some size: XLA's count before and after its optimisations agree within 1%.
    state = managed.ManagedState.create(params=jnp.ones((64, 64)), tx=optax.sgd(0.1))
    data = [np.zeros((8, 64), np.float32)] * 16
    _, history, _ = ciclo.train_loop(
        state,
        data,
        {ciclo.on_train_step: [train_step, lambda: setattr(clock, "now", clock.now + 0.5)]},
        callbacks=[meter],
        steps_per_execution=steps_per_execution,
    )
    compiles = train_step.compiles
    one_step = jax.jit(lambda s, b: train_step(s, b)).lower(state, data[0]).compile()
    return history, one_step.cost_analysis()["flops"], compiles


@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_flops_per_step_is_the_compiled_programs_count(host_clock: Clock, steps_per_execution: int) -> None:
    meter = ciclo.throughput(window=4)
    history, expected, compiles = _managed_run(host_clock, meter, steps_per_execution)
    assert compiles == 1  # reading the count is not a compile of the step the loop runs
    flops, per_second, steps_per_second = history.collect(
        "metrics.flops_per_step", "metrics.flops_per_second", "metrics.steps_per_second"
    )
    assert flops and expected > 0
    assert all(abs(value - expected) <= 0.01 * expected for value in flops)
    assert per_second == [f * s for f, s in zip(flops, steps_per_second, strict=True)]
    assert "mfu" not in history.latest().metrics  # CPU has no peak in the table


def test_mfu_with_a_peak(host_clock: Clock) -> None:
    history, _, _ = _managed_run(host_clock, ciclo.throughput(window=4, peak_flops=1e9))
    per_second, mfu = history.collect("metrics.flops_per_second", "metrics.mfu")
    assert mfu and mfu == [value / 1e9 for value in per_second]  # one device


def test_a_plain_step_logs_no_flops_and_says_so_once(
    host_clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    meter = ciclo.throughput(window=4, peak_flops=1e9)
    with caplog.at_level("INFO", logger="ciclo"):
        _, history, _ = ciclo.loop(0, batches(9), {ciclo.every(1): [timed_step(host_clock, 0.5), meter]})
    steps, _ = history.collect("steps", "steps_per_second")
    assert steps == [4, 8]
    assert set(history.latest().metrics) == {"loss", "steps_per_second", "samples_per_second"}
    said = [record.getMessage() for record in caplog.records if "logs no flops" in record.getMessage()]
    assert len(said) == 1 and "no step of the loop is a managed step" in said[0]


@pytest.mark.parametrize("peak", [0, -1.0, "1e12", True, math.inf, math.nan])
def test_bad_peak_raises_naming_the_value(peak: Any) -> None:
    with pytest.raises(ValueError, match=f"peak_flops must be a positive number.*got {peak!r}"):
        ciclo.throughput(peak_flops=peak)


def test_the_peak_table_is_keyed_by_device_kind() -> None:
    assert _throughput.PEAK_FLOPS["NVIDIA H100 80GB HBM3"] == 989e12
    assert jax.devices()[0].device_kind not in _throughput.PEAK_FLOPS  # CPU: mfu only with peak_flops=
