from __future__ import annotations

import gzip
import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo


@jax.jit
def jit_step(state: jax.Array, batch: jax.Array) -> tuple[ciclo.types.Logs, jax.Array]:
    state = state + batch.sum()
    return ciclo.logs().add_loss("loss", 1.0 / state), state


class Model:
    """A `ciclo.types.Trainable` state around `jit_step`."""

    def __init__(self, value: jax.Array) -> None:
        self.value = value

    def train_step(self, batch: jax.Array) -> tuple[ciclo.types.Logs, Model]:
        logs, value = jit_step(self.value, batch)
        return logs, Model(value)


def data(steps: int) -> list[jax.Array]:
    return [jnp.ones((4,), jnp.float32)] * steps


def trace_files(logdir: pathlib.Path, pattern: str) -> list[pathlib.Path]:
    return sorted(logdir.glob(f"plugins/profile/*/{pattern}"))


def read_trace(logdir: pathlib.Path) -> list[dict[str, Any]]:
    """The events of the one trace written under `logdir`, as TensorBoard's trace viewer reads them."""
    (xplane,) = trace_files(logdir, "*.xplane.pb")
    assert xplane.stat().st_size > 0
    (trace,) = trace_files(logdir, "*.trace.json.gz")
    with gzip.open(trace) as file:
        events: list[dict[str, Any]] = json.load(file)["traceEvents"]
    return events


def traced_steps(events: list[dict[str, Any]]) -> list[int]:
    """The step numbers of the step markers in the trace."""
    return sorted(int(event["args"]["step_num"]) for event in events if event.get("name") == "step")


def dispatches(events: list[dict[str, Any]]) -> int:
    """How many calls of `jit_step` the trace recorded (each call is two nested events)."""
    calls = sorted(
        (event["ts"], event["ts"] + event["dur"])
        for event in events
        if event.get("name") == "PjitFunction(jit_step)"
    )
    outer_end = -1.0
    count = 0
    for start, end in calls:
        if start >= outer_end:
            count += 1
            outer_end = end
    return count


def no_trace_running() -> bool:
    # A trace left running would make this start fail.
    jax.profiler.start_trace(pathlib.Path("unused"))
    jax.profiler.stop_trace()
    return True


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module", autouse=True)
def compiled() -> None:
    # Compiled once, outside the traces: the traces then hold only the steps.
    jit_step(jnp.float32(0.0), data(1)[0])


# --- in ciclo.loop ----------------------------------------------------------------------------


def test_loop_traces_the_chosen_steps(tmp_path: pathlib.Path) -> None:
    profiler = ciclo.profile(tmp_path / "logs", steps=(3, 5))
    assert profiler.status == "waiting"
    state, _, elapsed = ciclo.loop(jnp.float32(0.0), data(10), {ciclo.every(1): [profiler, jit_step]})
    assert elapsed.steps == 10 and float(state) == 40.0
    assert profiler.status == "done"
    events = read_trace(tmp_path / "logs")
    assert traced_steps(events) == [3, 4, 5]
    assert dispatches(events) == 3
    assert no_trace_running()


def test_single_step(tmp_path: pathlib.Path) -> None:
    ciclo.loop(jnp.float32(0.0), data(10), {ciclo.every(1): [ciclo.profile(tmp_path, steps=7), jit_step]})
    events = read_trace(tmp_path)
    assert traced_steps(events) == [7] and dispatches(events) == 1


@pytest.mark.parametrize("stop", [None, 5])
def test_loop_ending_inside_the_window_writes_the_trace(tmp_path: pathlib.Path, stop: int | None) -> None:
    profiler = ciclo.profile(tmp_path, steps=(3, 100))
    ciclo.loop(jnp.float32(0.0), data(6), {ciclo.every(1): [profiler, jit_step]}, stop=stop)
    assert profiler.status == "done"
    assert traced_steps(read_trace(tmp_path)) == ([3, 4] if stop == 5 else [3, 4, 5])
    assert no_trace_running()


def test_callback_stopping_the_loop_inside_the_window(tmp_path: pathlib.Path) -> None:
    def stopper(
        state: Any, batch: Any, elapsed: ciclo.types.Elapsed, loop_state: ciclo.types.LoopState[Any]
    ) -> None:
        if elapsed.steps == 4:
            loop_state.stop()

    profiler = ciclo.profile(tmp_path, steps=(2, 8))
    ciclo.loop(jnp.float32(0.0), data(10), {ciclo.every(1): [profiler, jit_step, stopper]})
    assert traced_steps(read_trace(tmp_path)) == [2, 3, 4]


def test_a_step_raising_inside_the_window_still_stops_the_trace(tmp_path: pathlib.Path) -> None:
    def failing(state: jax.Array, batch: jax.Array, elapsed: ciclo.types.Elapsed) -> None:
        if elapsed.steps == 4:
            raise RuntimeError("boom")

    profiler = ciclo.profile(tmp_path, steps=(3, 8))
    with pytest.raises(RuntimeError, match="boom"):
        ciclo.loop(jnp.float32(0.0), data(10), {ciclo.every(1): [profiler, jit_step, failing]})
    assert profiler.status == "done"
    assert traced_steps(read_trace(tmp_path)) == [3, 4]
    assert no_trace_running()


def test_window_never_reached_writes_nothing(tmp_path: pathlib.Path) -> None:
    profiler = ciclo.profile(tmp_path / "logs", steps=(20, 30))
    ciclo.loop(jnp.float32(0.0), data(10), {ciclo.every(1): [profiler, jit_step]})
    assert profiler.status == "waiting"
    assert not (tmp_path / "logs").exists()
    assert no_trace_running()


def test_a_stacked_group_reaching_into_the_window_is_traced_whole(tmp_path: pathlib.Path) -> None:
    def group_step(state: jax.Array, group: ciclo.types.Stacked[jax.Array]) -> jax.Array:
        for batch in group.batches:
            state = jit_step(state, batch)[1]
        return state

    profiler = ciclo.profile(tmp_path, steps=(5, 6))
    state, _, _ = ciclo.loop(
        jnp.float32(0.0), ciclo.stacked(data(16), 4), {ciclo.every(1): [profiler, group_step]}
    )
    events = read_trace(tmp_path)
    assert float(state) == 64.0
    assert traced_steps(events) == [4]  # the group of steps 4 to 7
    assert dispatches(events) == 4


def test_perfetto_trace(tmp_path: pathlib.Path) -> None:
    ciclo.loop(
        jnp.float32(0.0),
        data(4),
        {ciclo.every(1): [ciclo.profile(tmp_path, steps=1, perfetto=True), jit_step]},
    )
    (perfetto,) = trace_files(tmp_path, "perfetto_trace.json.gz")
    with gzip.open(perfetto) as file:
        assert any(event.get("name") == "step" for event in json.load(file)["traceEvents"])


def test_waits_for_the_last_profiled_step_before_stopping(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Any] = []
    block_until_ready, stop_trace = jax.block_until_ready, jax.profiler.stop_trace

    def waited(tree: Any) -> Any:
        calls.append(("wait", float(tree)))
        return block_until_ready(tree)

    def stopped() -> None:
        calls.append("stop")
        stop_trace()

    monkeypatch.setattr(jax, "block_until_ready", waited)
    monkeypatch.setattr(jax.profiler, "stop_trace", stopped)
    ciclo.loop(
        jnp.float32(0.0), data(10), {ciclo.every(1): [ciclo.profile(tmp_path, steps=(1, 2)), jit_step]}
    )
    # The state after step 2 (3 steps adding 4 each), then the stop: once, and nothing else waited.
    assert calls == [("wait", 12.0), "stop"]


# --- in train_loop ----------------------------------------------------------------------------


def test_train_loop_callbacks_trace_the_chosen_steps(tmp_path: pathlib.Path) -> None:
    profiler = ciclo.profile(tmp_path, steps=(2, 4))
    state, _, _ = ciclo.train_loop(Model(jnp.float32(0.0)), data(8), callbacks=[profiler], stop=8)
    assert float(state.value) == 32.0
    events = read_trace(tmp_path)
    assert traced_steps(events) == [2, 3, 4]
    assert dispatches(events) == 3


def test_train_loop_with_steps_per_execution_and_a_test_loop(tmp_path: pathlib.Path) -> None:
    class Fused(Model):
        def train_step(self, batch: Any) -> tuple[ciclo.types.Logs, Fused]:
            value = self.value
            for single in batch.batches:
                value = jit_step(value, single)[1]
            return ciclo.logs(), Fused(value)

        def test_step(self, batch: Any) -> ciclo.types.Logs:
            return ciclo.logs().add_metric("value", self.value)

    profiler = ciclo.profile(tmp_path, steps=(3, 3))
    ciclo.train_loop(
        Fused(jnp.float32(0.0)),
        data(12),
        callbacks=[profiler],
        test_dataset=lambda: data(2),
        epoch_duration=6,
        steps_per_execution=2,
        stop=12,
    )
    events = read_trace(tmp_path)
    assert traced_steps(events) == [2]  # the group of steps 2 and 3
    assert dispatches(events) == 2


# --- the callback itself ----------------------------------------------------------------------


def test_is_a_loop_callback_with_train_loop_hooks(tmp_path: pathlib.Path) -> None:
    profiler: ciclo.types.LoopCallback[Any] = ciclo.profile(tmp_path, steps=(1, 2))
    assert isinstance(profiler, ciclo.types.LoopCallback) and isinstance(profiler, ciclo.types.Profile)
    assert profiler.steps == (1, 2) and profiler.logdir == str(tmp_path)
    assert profiler.hook == ciclo.on_train_batch_begin  # and its step ends in on_step_end


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"steps": -1}, ValueError, "-1"),
        ({"steps": (5, 2)}, ValueError, r"\(5, 2\)"),
        ({"steps": (1, -2)}, ValueError, r"\(1, -2\)"),
        ({"steps": (1, 2, 3)}, TypeError, r"\(1, 2, 3\)"),
        ({"steps": 2.5}, TypeError, "2.5"),
        ({"steps": True}, TypeError, "True"),
        ({"steps": [1, 2]}, TypeError, r"\[1, 2\]"),
        ({"steps": 1, "logdir": 3}, TypeError, "3"),
    ],
)
def test_bad_arguments_raise_naming_the_value(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    kwargs.setdefault("logdir", "logs")
    with pytest.raises(error, match=match):
        ciclo.profile(**kwargs)


def test_numpy_batches(tmp_path: pathlib.Path) -> None:
    def step(state: int, batch: np.ndarray) -> int:
        return state + int(batch.sum())

    ciclo.loop(0, [np.ones(2)] * 3, {ciclo.every(1): [ciclo.profile(tmp_path, steps=(0, 1)), step]})
    assert traced_steps(read_trace(tmp_path)) == [0, 1]
