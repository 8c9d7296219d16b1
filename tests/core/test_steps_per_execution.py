"""`train_loop(..., steps_per_execution=k)`: fused managed steps, seen one by one by epochs and history.

`steps_per_execution="auto"` is tested without timing anything: its decision
(`auto_steps.choose`) on given timings, and its runs on a `FakeDevice` clock
whose dispatches cost what the test says.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support import training

import ciclo
from ciclo._src.data import steps_per_execution as auto_steps
from ciclo._src.data.steps_per_execution import Timing, choose, dispatch_cost

FEATURES, CLASSES = 4, 3


class Linear:
    """A plain-JAX `ciclo.types.ModelAdapter`: logits of a linear layer."""

    def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Any, None]:
        return {"w": 0.1 * jax.random.normal(key, (FEATURES, CLASSES)), "b": jnp.zeros(CLASSES)}, None

    def apply(
        self, params: Any, model_state: Any, inputs: Any, *, key: Any, training: bool
    ) -> tuple[Any, Any]:
        return inputs @ params["w"] + params["b"][None, :], model_state


def model_state(strategy: str) -> ciclo.types.ModelState:
    return ciclo.create_model_state(
        Linear(),
        inputs=jnp.ones((1, FEATURES)),
        tx=optax.adam(0.05),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": lambda preds, target: preds.argmax(-1) == target},
        strategy=strategy,
    )


def data(steps: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(size=(8, FEATURES)).astype(np.float32), rng.integers(0, CLASSES, 8).astype(np.int32))
        for _ in range(steps)
    ]


def run(
    strategy: str, steps_per_execution: int | Literal["auto"], **kwargs: Any
) -> tuple[Any, ciclo.types.History, ciclo.types.Elapsed]:
    test = data(3, seed=1)
    return ciclo.train_loop(
        model_state(strategy),
        data(40),
        test_dataset=lambda: test,
        epoch_duration=10,
        stop=35,
        steps_per_execution=steps_per_execution,
        **kwargs,
    )


@pytest.mark.parametrize("strategy", ["jit", "data_parallel"])
def test_fused_training_equals_single_steps_and_sees_every_step(strategy: str) -> None:
    single_state, single, single_elapsed = run(strategy, 1)
    fused_state, fused, fused_elapsed = run(strategy, 4)
    training.assert_trees_close(fused_state.params, single_state.params)
    assert fused_elapsed.steps == single_elapsed.steps == 35
    # One history entry per step, the same losses and running metrics at each.
    assert fused.collect("steps") == single.collect("steps") == list(range(35))
    np.testing.assert_allclose(fused.collect("loss"), single.collect("loss"), rtol=1e-5)
    np.testing.assert_allclose(fused.collect("accuracy"), single.collect("accuracy"), rtol=1e-5)
    # Epochs end exactly: the test loop ran after steps 10, 20, 30, on the same states.
    assert fused.collect("steps", "loss_test")[0] == [9, 19, 29]
    np.testing.assert_allclose(fused.collect("loss_test"), single.collect("loss_test"), rtol=1e-5)


def test_groups_are_cut_at_epoch_ends_and_at_stop() -> None:
    sizes: list[int] = []

    def record(state: Any, batch: Any) -> None:
        sizes.append(batch.steps)

    run("jit", 4, tasks={ciclo.on_train_batch_begin: [record]})
    # Epochs of 10 steps, stop at 35: 4 + 4 + 2 per epoch, then 4 + 1.
    assert sizes == [4, 4, 2] * 3 + [4, 1]


def test_a_resumed_loop_keeps_its_groups_on_the_epochs() -> None:
    sizes: list[int] = []
    ciclo.train_loop(
        model_state("jit"),
        data(20),
        {ciclo.on_train_batch_begin: [lambda state, batch: sizes.append(batch.steps)]},
        epoch_duration=10,
        stop=20,
        elapsed=ciclo.types.Elapsed.create(steps=7),
        steps_per_execution=4,
    )
    assert sizes == [3, 4, 4, 2]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps_per_execution": 0}, "steps_per_execution must be an int >= 1"),
        (
            {"steps_per_execution": 4, "epoch_duration": ciclo.at(samples=80)},
            "epoch_duration must be a number of steps",
        ),
        ({"steps_per_execution": 4, "stop": ciclo.at(time=10.0)}, "stop must be a number of steps"),
        ({"steps_per_execution": "auto", "stop": ciclo.at(time=10.0)}, "stop must be a number of steps"),
    ]
    + [
        ({"steps_per_execution": bad}, r'steps_per_execution must be an int >= 1 or "auto"')
        for bad in ("Auto", "", 0, -1, 2.5, 1.0, True, None)
    ],
)
def test_groups_need_steps(kwargs: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {"epoch_duration": 10, "stop": 20, **kwargs}
    ran: list[Any] = []
    with pytest.raises(ValueError, match=message):
        ciclo.train_loop(
            model_state("jit"), data(20), {ciclo.on_train_batch_begin: [ran.append]}, **arguments
        )
    assert ran == []  # refused before the first step


# `steps_per_execution="auto"`: the decision on given timings.

US, MS = 1e-6, 1e-3
TINY = Timing(host=300 * US, device=305 * US)  # a dispatch's host time is the whole step
MEDIUM = Timing(host=300 * US, device=20 * MS)  # the device's time dwarfs the dispatch


def test_choose_groups_the_steps_when_the_host_dominates() -> None:
    # 305 us for one step, 310 us for two: 300 us a dispatch, 5 us a step; under 5% needs K > 1200.
    timings = {1: TINY, 2: Timing(host=300 * US, device=155 * US)}
    assert choose(timings, cap=128) == 128
    assert choose({1: TINY}, cap=128) == 32  # from one timing: 300 us / 32 is under 5% of 305 us
    assert choose({}, cap=128) == 1  # nothing measured


def test_choose_runs_single_steps_when_the_device_dominates() -> None:
    assert choose({1: MEDIUM}, cap=128) == 1
    # 300 us per dispatch over 2 ms steps: 15% at K=1, 7.5% at 2, 3.75% at 4.
    assert choose({1: Timing(300 * US, 2 * MS)}, cap=128) == 4


def test_choose_keeps_the_smallest_k_under_the_target() -> None:
    # A dispatch of K steps takes 300 us + K ms until its result is ready.
    timings = {k: Timing(host=300 * US, device=300 * US / k + 1 * MS) for k in (1, 2, 4, 8, 16)}
    assert choose(timings, cap=128) == 8  # 3.75% at 8; 16 is under 5% too, but more than needed
    assert choose(timings, cap=4) == 4  # never more than the cap


def test_choose_fits_the_dispatch_cost_where_a_dispatch_holds_the_compute() -> None:
    # On CPU a small step runs inside its dispatch: the host time is the whole step at every K,
    # and only the times at two K tell the loop's fixed cost from the step's.
    medium = {k: Timing(host=300 * US + k * 20 * MS, device=300 * US / k + 20 * MS) for k in (1, 2)}
    tiny = {k: Timing(host=300 * US + k * 5 * US, device=300 * US / k + 5 * US) for k in (1, 2, 4)}
    assert choose(medium, cap=128) == 1
    assert choose(tiny, cap=128) == 128
    cost = dispatch_cost(tiny)
    assert cost is not None and round(cost.host / US) == 300 and round(cost.device / US) == 5


@pytest.mark.parametrize("cap", [1, 2, 8, 64, 128])
@pytest.mark.parametrize("host", [1 * US, 100 * US, 10 * MS])
@pytest.mark.parametrize("device", [0.0, 1 * US, 1 * MS, 1.0])
def test_choose_gives_a_power_of_two_at_most_the_cap(cap: int, host: float, device: float) -> None:
    for measured in ({1: Timing(host, device)}, {1: Timing(host, device), 2: Timing(host, device / 2)}):
        k = choose(measured, cap=cap)
        assert 1 <= k <= cap and k & (k - 1) == 0


def test_the_cap_is_the_largest_power_of_two_in_an_epoch() -> None:
    assert [auto_steps.largest_power_of_two(n) for n in (1, 2, 3, 10, 100, 128, 1000)] == [
        1,
        2,
        2,
        8,
        64,
        128,
        512,
    ]


# `steps_per_execution="auto"` in train_loop, on a fake clock.


class FakeDevice:
    """The clock auto measures with: each dispatch costs `host` seconds, each step `device` seconds.

    `dispatch` is an `on_train_step` callback: it runs between auto's clock
    readings, as the step's call does, and queues the steps' device time, which
    `block` (waiting for the device) adds to the clock.
    """

    def __init__(self, host: float, device: float) -> None:
        self.host, self.device = host, device
        self.now = self.queued = 0.0

    def clock(self) -> float:
        return self.now

    def block(self, tree: Any) -> Any:
        self.now += self.queued
        self.queued = 0.0
        return tree

    def dispatch(self, state: Any, batch: Any) -> None:
        self.now += self.host
        self.queued += self.device * (batch.steps if isinstance(batch, ciclo.types.Stacked) else 1)


@pytest.fixture(autouse=True)
def forget_measurements() -> None:
    """Each test starts in a process that has measured nothing: auto remembers its measurements."""
    auto_steps._remembered.clear()


@pytest.fixture
def fake_device(monkeypatch: pytest.MonkeyPatch) -> Callable[[Timing], FakeDevice]:
    def install(costs: Timing) -> FakeDevice:
        device = FakeDevice(costs.host, costs.device)
        monkeypatch.setattr(auto_steps, "_clock", device.clock)
        monkeypatch.setattr(auto_steps, "_block", device.block)
        return device

    return install


def run_auto(
    steps_per_execution: int | Literal["auto"],
    device: FakeDevice | None = None,
    *,
    stop: int = 32,
    epoch: int = 8,
    state: Any = None,
    **kwargs: Any,
) -> tuple[Any, ciclo.types.History, list[int]]:
    """`train_loop` with epochs of `epoch` steps (a fresh state by default), and each dispatch's steps."""
    sizes: list[int] = []
    tasks: dict[Any, Any] = {
        ciclo.on_train_batch_begin: [
            lambda state, batch: sizes.append(batch.steps if isinstance(batch, ciclo.types.Stacked) else 1)
        ]
    }
    if device is not None:
        tasks[ciclo.on_train_step] = [device.dispatch]
    state, history, elapsed = ciclo.train_loop(
        model_state("jit") if state is None else state,
        data(max(stop, 32)),
        tasks,
        epoch_duration=epoch,
        stop=stop,
        steps_per_execution=steps_per_execution,
        **kwargs,
    )
    assert elapsed.steps == stop
    return state, history, sizes


@pytest.fixture(scope="module")
def single_steps() -> tuple[Any, ciclo.types.History, list[int]]:
    return run_auto(1)


def assert_same_training(
    auto: tuple[Any, ciclo.types.History, list[int]], single: tuple[Any, ciclo.types.History, list[int]]
) -> None:
    np.testing.assert_allclose(auto[0].params["w"], single[0].params["w"], rtol=1e-6)
    np.testing.assert_allclose(auto[0].params["b"], single[0].params["b"], rtol=1e-6, atol=1e-7)
    steps = single[1].collect("steps")
    assert steps == list(range(len(steps))) and auto[1].collect("steps") == steps
    np.testing.assert_allclose(auto[1].collect("loss"), single[1].collect("loss"), rtol=1e-5)


def test_auto_groups_tiny_steps_and_trains_as_single_steps(
    fake_device: Callable[[Timing], FakeDevice],
    single_steps: tuple[Any, ciclo.types.History, list[int]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="ciclo"):
        auto = run_auto("auto", fake_device(Timing(host=300 * US, device=5 * US)))
    # Measured on real steps (a quarter of the run at most: 8 steps): 1 compiling and 3 timed at
    # K=1; K=2 would not fit, so K is extrapolated to the epoch's 8 steps. The first group of 8 is
    # cut at the epoch's end, as with steps_per_execution=8.
    assert auto[2] == [1] * 4 + [4, 8, 8, 8]
    assert auto[1].collect("steps", "steps_per_execution") == ([3], [8])  # logged when chosen
    (message,) = [record.getMessage() for record in caplog.records if "auto" in record.getMessage()]
    assert "runs 8 steps per dispatch after 4 steps of measuring" in message
    assert_same_training(auto, single_steps)


def test_auto_runs_single_steps_when_the_device_dominates(
    fake_device: Callable[[Timing], FakeDevice], single_steps: tuple[Any, ciclo.types.History, list[int]]
) -> None:
    auto = run_auto("auto", fake_device(Timing(host=300 * US, device=20 * MS)))
    assert auto[2] == [1] * 32  # plain batches, as steps_per_execution=1 runs them
    assert auto[1].collect("steps", "steps_per_execution") == ([3], [1])  # chosen after 3 timed steps
    assert_same_training(auto, single_steps)


def test_auto_follows_process_0_under_several_processes(
    fake_device: Callable[[Timing], FakeDevice], monkeypatch: pytest.MonkeyPatch
) -> None:
    # This process alone would keep single steps; process 0 remembered nothing, measured on: go on
    # after K=1, stop after K=2, and run 4. Every decision goes through `_agreed`, process 0's
    # broadcast.
    answers = iter([0, 0, 1, 4])
    asked: list[int] = []
    monkeypatch.setattr(auto_steps, "_agreed", lambda value: asked.append(value) or next(answers))
    auto = run_auto("auto", fake_device(Timing(host=300 * US, device=20 * MS)), stop=64)
    # This process's own answers: nothing remembered, done at K=1, done at K=2, choose K=1.
    assert asked == [0, 1, 1, 1]
    assert auto[2] == [1] * 4 + [2] * 4 + [4] * 13
    assert auto[1].collect("steps_per_execution") == [4]
    assert_same_training(auto, run_auto(1, stop=64))


def test_auto_on_the_real_clock_trains_as_single_steps(
    single_steps: tuple[Any, ciclo.types.History, list[int]],
) -> None:
    auto = run_auto("auto")
    (k,) = auto[1].collect("steps_per_execution")
    assert 1 <= k <= 8 and k & (k - 1) == 0  # whatever this machine measured
    assert_same_training(auto, single_steps)


def test_auto_on_a_run_too_short_to_measure_runs_single_steps(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ciclo"):
        _, history, sizes = run_auto("auto", stop=6)
    assert sizes == [1] * 6 and history.collect("steps_per_execution") == [1]
    assert any("too short to measure" in record.getMessage() for record in caplog.records)


def test_auto_resumes_from_a_backup_on_the_groups_it_drew(
    fake_device: Callable[[Timing], FakeDevice],
    single_steps: tuple[Any, ciclo.types.History, list[int]],
    tmp_path: pathlib.Path,
) -> None:
    device = fake_device(Timing(host=300 * US, device=5 * US))
    # 16 steps: 4 to measure on, enough for K=1 alone; then the epoch's 8, cut at its end.
    _, _, first = run_auto("auto", device, stop=16, backup=tmp_path)
    assert first == [1] * 4 + [4, 8]
    # A longer run resumes at step 16: the backup's groups are skipped as they were drawn.
    resumed = run_auto("auto", device, backup=tmp_path)
    assert resumed[2] == [8, 8]
    assert resumed[1].collect("steps", "steps_per_execution") == ([3], [8])  # from the backed-up run
    assert_same_training(resumed, single_steps)


def test_auto_cuts_its_groups_to_powers_of_two(
    fake_device: Callable[[Timing], FakeDevice],
) -> None:
    auto = run_auto("auto", fake_device(Timing(host=300 * US, device=5 * US)), stop=45, epoch=15)
    # K=8 after 4 steps at K=1; each epoch's 15 steps (11 in the first) run as 8 + 4 + 2 + 1, not
    # 8 + 7: the sizes of the programs compiled are powers of two whatever K is chosen.
    assert auto[2] == [1] * 4 + [8, 2, 1] + [8, 4, 2, 1] * 2
    assert_same_training(auto, run_auto(1, stop=45, epoch=15))


def test_a_second_auto_run_reuses_the_measurement_and_compiles_nothing(
    single_steps: tuple[Any, ciclo.types.History, list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    first = run_auto("auto")  # on the real clock
    (k,) = first[1].collect("steps_per_execution")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="jax"), caplog.at_level(logging.INFO, logger="ciclo"):
        with jax.log_compiles():
            second = run_auto("auto", state=first[0])  # the same step, state and batch shapes
    assert second[2] == [k] * (32 // k)  # measures nothing: K from the first step
    assert second[1].collect("steps", "steps_per_execution") == ([k - 1], [k])
    messages = [record.getMessage() for record in caplog.records]
    assert [message for message in messages if "ompil" in message] == []
    assert any(f"runs {k} steps per dispatch, measured by an earlier train_loop" in m for m in messages)
    # Trained on from the first run's state, as 64 single steps would.
    twice = ciclo.train_loop(single_steps[0], data(32), epoch_duration=8, stop=32)
    np.testing.assert_allclose(second[0].params["w"], twice[0].params["w"], rtol=1e-5)


def test_auto_reuses_a_measurement_on_as_many_steps_as_it_would_take(
    fake_device: Callable[[Timing], FakeDevice],
) -> None:
    device = fake_device(Timing(host=300 * US, device=5 * US))
    short = run_auto("auto", device, stop=16)  # 4 steps to measure on
    assert short[2] == [1] * 4 + [4, 8]
    # 8 steps to measure on: more than the remembered measurement had, so it measures again...
    longer = run_auto("auto", device, state=short[0])
    assert longer[2] == [1] * 4 + [4, 8, 8, 8]
    # ...and a run that would measure on as many or fewer reuses it: K=8 from its first step.
    again = run_auto("auto", device, state=longer[0], stop=16)
    assert again[2] == [8, 8]
    # Another state's shapes (a fresh state's optimizer is another static part of the state too).
    assert run_auto("auto", device, stop=16)[2] == [1] * 4 + [4, 8]


def test_auto_follows_process_0_s_memory(
    fake_device: Callable[[Timing], FakeDevice],
    single_steps: tuple[Any, ciclo.types.History, list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # This process measured nothing yet; process 0 remembers a measurement that chooses 4.
    asked: list[int] = []
    monkeypatch.setattr(auto_steps, "_agreed", lambda value: asked.append(value) or 4)
    auto = run_auto("auto", fake_device(Timing(host=300 * US, device=20 * MS)))
    assert asked == [0] and auto[2] == [4] * 8
    assert_same_training(auto, single_steps)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Tagged:
    """A state whose static field cannot be compared: no jitted step takes it, a plain one does."""

    w: Any
    tags: Any = dataclasses.field(metadata={"static": True})


def test_a_run_that_cannot_be_told_from_another_is_not_remembered(
    fake_device: Callable[[Timing], FakeDevice],
) -> None:
    @dataclasses.dataclass
    class Step:  # not frozen: unhashable
        def __call__(self, state: Any, batch: Any) -> tuple[ciclo.types.Logs, Any]:
            return ciclo.logs(), state

    def step(state: Any, batch: Any) -> tuple[ciclo.types.Logs, Any]:
        return ciclo.logs(), state

    device = fake_device(Timing(host=300 * US, device=5 * US))
    runs: list[list[int]] = []
    # Two such states cannot be compared, nor two runs of a step that cannot be hashed: each run measures.
    for state, train_step in [(lambda w: Tagged(w, np.zeros(2)), step)] * 2 + [(np.float32, Step())] * 2:
        runs.append([])
        ciclo.train_loop(
            state(0.0),
            data(32),
            {
                ciclo.on_train_batch_begin: [
                    lambda state, batch: runs[-1].append(
                        batch.steps if isinstance(batch, ciclo.types.Stacked) else 1
                    )
                ],
                ciclo.on_train_step: [train_step, device.dispatch],
            },
            epoch_duration=8,
            stop=32,
            steps_per_execution="auto",
        )
    assert runs == [[1] * 4 + [4, 8, 8, 8]] * 4
