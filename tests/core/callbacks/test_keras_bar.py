from __future__ import annotations

import datetime
import io
import sys
import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.bars import Clock, OutStream, Tripwire, in_notebook, loop_state, rendered, spy_on_host_copies

import ciclo
from ciclo._src.callbacks._keras_bar import is_notebook_stream
from ciclo._src.engine.phases import LoopState


class Terminal(io.StringIO):
    """A text buffer that claims to be a terminal, so bars redraw in place."""

    def isatty(self) -> bool:
        return True


def run(
    bar: ciclo.types.KerasBar, clock: Clock, steps: int, seconds_per_step: float = 0.5, start: int = 0
) -> None:
    """Calls `bar` by hand as the seeds do, after each of `steps` steps taking `seconds_per_step`."""
    for elapsed, batch in ciclo.elapse(range(start, start + steps)):
        clock.now += seconds_per_step
        logs = ciclo.logs().add_metric("accuracy", batch / 100).add_loss("loss", 1.0 / (batch + 1))
        bar(elapsed, logs)


@jax.jit
def jit_step(state: jax.Array, batch: jax.Array) -> tuple[ciclo.types.Logs, jax.Array]:
    state = state + batch
    logs = ciclo.logs().add_loss("loss", 1.0 / state, add_metric=True).add_metric("total", state)
    return logs, state


# --- total and unit -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "field", "label", "expected_total"),
    [
        (100, "steps", "step", 100),
        (ciclo.at(steps=100), "steps", "step", 100),
        (ciclo.at(samples=640), "samples", "sample", 640),
        (ciclo.at(time=2.5), "time", "s", 2.5),
        (ciclo.at(time=datetime.timedelta(minutes=1)), "time", "s", 60.0),
        (ciclo.at(samples=640, time=10), "samples", "sample", 640),
        (None, "steps", "step", None),
    ],
)
def test_total_sets_unit(total: Any, field: str, label: str, expected_total: float | None) -> None:
    bar = ciclo.keras_bar(total, file=io.StringIO())
    assert (bar.unit.field, bar.unit.label, bar.unit.total) == (field, label, expected_total)


def test_total_in_samples_counts_samples(clock: Clock) -> None:
    buffer = io.StringIO()
    bar = ciclo.keras_bar(ciclo.at(samples=64), file=buffer)
    batches = [np.zeros((8, 2))] * 20
    for elapsed, _ in ciclo.elapse(batches, stop=ciclo.at(samples=64)):
        clock.now += 0.25
        bar(elapsed, {"metrics": {"loss": 0.5}})
    lines = buffer.getvalue().splitlines()
    # The bar finished on its own at the last batch: 8 steps of 8 samples, 0.25 s per 8 samples.
    assert lines[-1] == "64/64 [==============================] - 2s 31ms/sample - loss: 0.5000"
    assert lines[0].startswith("16/64 [======>")
    assert bar.finished


def test_total_in_time_counts_seconds(clock: Clock) -> None:
    buffer = Terminal()
    bar = ciclo.keras_bar(ciclo.at(time=10), file=buffer, interval=0)
    for step in range(12):
        clock.now = step
        bar(ciclo.types.Elapsed(steps=step, samples=step, time=float(step), date_start=0.0))
    draws = buffer.getvalue().split("\r")[1:]
    # A time bar's remaining count is its remaining time.
    assert draws[4].rstrip() == " 4/10 [===========>..................] - ETA: 6s"
    assert draws[-1] == "10/10 [==============================] - 10s 1s/step\n"
    assert bar.finished


# --- output on a terminal ---------------------------------------------------------------------


def test_terminal_output_redraws_in_place_and_ends_with_the_final_line(clock: Clock) -> None:
    buffer = Terminal()
    bar = ciclo.keras_bar(total=100, file=buffer, interval=0)
    run(bar, clock, 100, seconds_per_step=0.53)
    output = buffer.getvalue()
    draws = output.split("\r")[1:]
    assert output.startswith("\r") and output.endswith("\n") and output.count("\n") == 1
    assert len(draws) == 100  # interval=0: every call redraws
    assert draws[0].rstrip() == "  1/100 [..............................] - loss: 1.0000 - accuracy: 0.0000"
    assert draws[79].rstrip() == (
        " 80/100 [=======================>......] - ETA: 11s - loss: 0.0125 - accuracy: 0.7900"
    )
    assert (
        draws[-1]
        == "100/100 [==============================] - 52s 530ms/step - loss: 0.0100 - accuracy: 0.9900\n"
    )


def test_terminal_pads_a_shorter_line_over_a_longer_one(clock: Clock) -> None:
    buffer = Terminal()
    bar = ciclo.keras_bar(total=10, file=buffer, interval=0)
    for step, loss in enumerate([1.0, 12345.0, 1.0]):
        bar(ciclo.types.Elapsed.create(steps=step), {"metrics": {"loss": loss}})
    _, longer, shorter = buffer.getvalue().split("\r")[1:]
    assert longer.endswith("loss: 12345.0000")
    assert shorter.rstrip().endswith("loss: 1.0000")
    assert len(shorter) == len(longer) and shorter.endswith("    ")


def test_unknown_total(clock: Clock) -> None:
    buffer = Terminal()
    bar = ciclo.keras_bar(file=buffer, interval=0)
    run(bar, clock, 80, seconds_per_step=0.05)
    assert (
        buffer.getvalue().split("\r")[-1]
        == "     80/Unknown - 4s 50ms/step - loss: 0.0125 - accuracy: 0.7900"
    )
    assert not bar.finished
    bar.close()
    assert (
        buffer.getvalue().split("\r")[-1]
        == "     80/Unknown - 4s 50ms/step - loss: 0.0125 - accuracy: 0.7900\n"
    )
    assert bar.finished


def test_values_formatting_and_selection() -> None:
    buffer = io.StringIO()
    bar = ciclo.keras_bar(total=1, file=buffer)
    logs = (
        ciclo.logs()
        .add_loss("loss", jnp.float32(0.25), add_metric=True)  # shown once
        .add_metric("tiny", 2.5e-5)
        .add_metric("huge", 3.0e7)
        .add_metric("vector", jnp.ones(3))  # not a scalar: not shown
        .add_metric("single", np.array([7.0]))  # size 1: shown
        .add_output("pred", 1.0)  # not a shown collection
        .add_entry("stateful_metrics", "count", jnp.int32(12))
    )
    bar(ciclo.types.Elapsed.create(), logs)
    assert buffer.getvalue().split(" - ", 2)[2] == (
        "loss: 0.2500 - tiny: 2.5000e-05 - huge: 3.0000e+07 - single: 7.0000 - count: 12.0000\n"
    )


# --- output without a terminal ----------------------------------------------------------------


def test_log_output_writes_a_line_per_tenth_and_no_carriage_returns(clock: Clock) -> None:
    buffer = io.StringIO()
    bar = ciclo.keras_bar(total=100, file=buffer, interval=0)
    run(bar, clock, 100)
    output = buffer.getvalue()
    lines = output.splitlines()
    assert "\r" not in output
    assert [line.split("/")[0].strip() for line in lines] == [str(n) for n in range(10, 101, 10)]
    assert lines[4].startswith(" 50/100 [==============>...............] - ETA: 25s - loss: 0.0200")
    assert lines[-1].startswith("100/100 [==============================] - 50s 500ms/step - loss:")


def test_log_output_with_unknown_total_writes_every_30_seconds(clock: Clock) -> None:
    buffer = io.StringIO()
    bar = ciclo.keras_bar(file=buffer)
    run(bar, clock, 100, seconds_per_step=1.0)
    bar.close()
    lines = buffer.getvalue().splitlines()
    assert "\r" not in buffer.getvalue()
    assert [line.split("/")[0].strip() for line in lines] == ["31", "61", "91", "100"]
    assert lines[-1].startswith("    100/Unknown - 1:39 1s/step - loss:")


def test_writes_through_file_write_and_flush(clock: Clock) -> None:
    calls: list[str] = []

    class Recorder:
        def write(self, text: str) -> int:
            calls.append("write")
            return len(text)

        def flush(self) -> None:
            calls.append("flush")

    bar = ciclo.keras_bar(total=2, file=Recorder())  # type: ignore[arg-type]
    run(bar, clock, 2)
    assert calls == ["write", "flush"]  # no terminal: only the final line


def test_file_defaults_to_stdout_at_creation(clock: Clock, capsys: pytest.CaptureFixture[str]) -> None:
    bar = ciclo.keras_bar(total=3)
    run(bar, clock, 3)
    assert capsys.readouterr().out.splitlines()[-1].startswith("3/3 [=====")


# --- throttling and device transfers ---------------------------------------------------------


def test_redraws_at_most_once_per_interval(clock: Clock) -> None:
    buffer = Terminal()
    bar = ciclo.keras_bar(total=100, file=buffer, interval=1.0)
    run(bar, clock, 40, seconds_per_step=0.25)
    # Drawn at t=0.25 (the first call), then every 4 calls (1 s): t=1.25, 2.25, ..., 9.25.
    assert [draw.split("/")[0].strip() for draw in buffer.getvalue().split("\r")[1:]] == [
        str(n) for n in range(1, 41, 4)
    ]


def test_large_interval_draws_only_first_and_final_lines(clock: Clock) -> None:
    buffer = Terminal()
    bar = ciclo.keras_bar(total=50, file=buffer, interval=1e9)
    run(bar, clock, 50)
    draws = buffer.getvalue().split("\r")[1:]
    assert [draw.split("/")[0].strip() for draw in draws] == ["1", "50"]
    assert draws[-1].endswith("\n")


@pytest.mark.parametrize("terminal", [True, False])
def test_no_value_is_read_between_redraws(clock: Clock, terminal: bool) -> None:
    bar = ciclo.keras_bar(total=100, file=Terminal() if terminal else io.StringIO(), interval=1e9)
    loss = Tripwire(0.5)
    logs = ciclo.logs().add_metric("loss", loss)
    accumulated = ciclo.logs().add_metric("loss", loss)
    bar(ciclo.types.Elapsed.create(), logs)
    first_reads = loss.reads
    assert first_reads == (1 if terminal else 0)  # a terminal shows the first step at once
    for step in range(1, 9):  # below the first tenth, so no log line either
        clock.now += 1.0
        bar(ciclo.types.Elapsed.create(steps=step), logs)
        bar.__loop_callback__(loop_state(ciclo.types.Elapsed.create(steps=step), accumulated))
    assert loss.reads == first_reads
    bar.close()
    assert loss.reads == first_reads + 1


def test_jit_loop_does_not_copy_from_device_between_redraws(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetched = spy_on_host_copies(monkeypatch)
    buffer = Terminal()
    bar = ciclo.keras_bar(total=30, file=buffer, interval=1e9)
    batches = [jnp.float32(i + 1) for i in range(30)]
    with jax.transfer_guard_device_to_host("disallow_explicit"):
        state, _, elapsed = ciclo.loop(jnp.float32(0.0), batches, {ciclo.every(1): [jit_step, bar]}, stop=20)
    assert elapsed.steps == 20
    assert fetched == [["loss", "total"]] * 2  # the first draw and the final one, at loop end
    assert buffer.getvalue().split("\r")[-1] == (
        "20/30 [===================>..........] - 0s 0s/step - loss: 0.0048 - total: 210.0000\n"
    )


def test_loop_builds_no_elapsed_between_redraws(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[int] = []
    elapsed_property = LoopState.elapsed

    def counted(loop_state: LoopState[Any]) -> ciclo.types.Elapsed:
        if loop_state._elapsed is None:  # built now, from the loop's counters
            built.append(loop_state._clock.steps)
        return elapsed_property.fget(loop_state)  # type: ignore[misc]

    monkeypatch.setattr(LoopState, "elapsed", property(counted, elapsed_property.fset))
    bar = ciclo.keras_bar(total=30, file=Terminal(), interval=1e9)
    ciclo.loop(jnp.float32(0.0), [jnp.float32(1.0)] * 30, {ciclo.every(1): [jit_step, bar]}, stop=20)
    assert built == [0]  # the first draw; the final one is drawn with the loop's end counts


# --- use in loops and by hand ----------------------------------------------------------------


@pytest.mark.parametrize("stop", [20, ciclo.at(20)])
def test_manual_iteration_as_in_the_seeds(clock: Clock, stop: Any) -> None:
    buffer = io.StringIO()
    keras_bar = ciclo.keras_bar(total=20, file=buffer)
    state = jnp.float32(0.0)
    for elapsed, batch in ciclo.elapse([jnp.float32(1.0)] * 50, stop=stop):
        clock.now += 0.1
        logs = ciclo.logs()
        logs.updates, state = jit_step(state, batch)
        keras_bar(elapsed, logs)
    # The bar finishes by itself once the step completing its total ran: no close needed.
    assert keras_bar.finished
    assert buffer.getvalue().splitlines()[-1] == (
        "20/20 [==============================] - 2s 100ms/step - loss: 0.0500 - total: 20.0000"
    )


def test_calls_after_the_final_line_do_nothing(clock: Clock) -> None:
    buffer = io.StringIO()
    bar = ciclo.keras_bar(total=5, file=buffer)
    run(bar, clock, 8)  # as in the seed that checks the period after the step
    bar.close()
    assert len(buffer.getvalue().splitlines()) == 4 and buffer.getvalue().count("5/5") == 1


def test_in_loop_with_jit_step_shows_latest_values(clock: Clock) -> None:
    buffer = Terminal()
    bar = ciclo.keras_bar(total=10, file=buffer)
    state, history, elapsed = ciclo.loop(
        jnp.float32(0.0), [jnp.float32(2.0)] * 20, {ciclo.every(1): [jit_step, bar]}, stop=10
    )
    assert float(state) == 20.0
    assert buffer.getvalue().count("\n") == 1
    assert buffer.getvalue().split("\r")[-1] == (
        "10/10 [==============================] - 0s 0s/step - loss: 0.0500 - total: 20.0000\n"
    )


@pytest.mark.parametrize(
    ("dataset", "stop", "expected"),
    [
        (range(100), 30, " 30/100 [========>....................."),
        (range(25), None, " 25/100 [======>......................."),
    ],
)
def test_loop_end_draws_the_final_line_when_the_loop_stops_early(
    clock: Clock, dataset: Any, stop: Any, expected: str
) -> None:
    buffer = Terminal()
    bar = ciclo.keras_bar(total=100, file=buffer)

    def step(state: int, batch: int) -> tuple[ciclo.types.Logs, int]:
        clock.now += 0.5
        return ciclo.logs().add_metric("batch", batch), state + 1

    ciclo.loop(0, dataset, {ciclo.every(1): [step, bar]}, stop=stop)
    final = buffer.getvalue().split("\r")[-1]
    assert final.startswith(expected) and final.endswith("\n") and "/step" in final and "ETA" not in final
    assert bar.finished


def test_loop_end_after_a_callback_stops_the_loop(clock: Clock) -> None:
    buffer = io.StringIO()
    bar = ciclo.keras_bar(total=100, file=buffer)

    def tick() -> None:
        clock.now += 1.0

    def stopper(state: Any, batch: Any, elapsed: ciclo.types.Elapsed, loop_state: LoopState[Any]) -> None:
        if elapsed.steps == 9:
            loop_state.stop()

    ciclo.loop(0, range(100), {ciclo.every(1): [tick, bar, stopper]})
    assert buffer.getvalue().splitlines() == [
        " 10/100 [==>...........................] - ETA: 1:30",
        " 10/100 [==>...........................] - 9s 1s/step",
    ]


def test_runs_under_on_train_batch_end(clock: Clock) -> None:
    buffer = io.StringIO()
    bar = ciclo.keras_bar(total=4, file=buffer)
    accumulated = ciclo.logs().add_metric("loss", 0.125)
    for step in range(4):
        clock.now += 1
        bar.__loop_callback__(loop_state(ciclo.types.Elapsed.create(steps=step), accumulated))
    assert (
        buffer.getvalue().splitlines()[-1]
        == "4/4 [==============================] - 3s 1s/step - loss: 0.1250"
    )
    # train_loop places it under its first hook only: it must not also run inside the inner test loop.
    assert bar.hook == (
        ciclo.on_train_batch_end,
        ciclo.on_test_batch_end,
        ciclo.hooks.on_predict_batch_end,
    )


def test_train_loop_runs_the_bar_for_the_training_steps_only(clock: Clock) -> None:
    buffer = io.StringIO()
    bar = ciclo.keras_bar(total=4, file=buffer)
    tasks = {ciclo.on_train_step: lambda state: state, ciclo.on_test_step: lambda: {"metrics": {"t": 1.0}}}
    ciclo.train_loop(0, range(4), tasks, test_dataset=lambda: range(3), epoch_duration=2, callbacks=[bar])
    # The training steps' counts: a bar also run by the test loop would count its 3 steps per epoch.
    assert [line.split(" [")[0] for line in buffer.getvalue().splitlines()] == ["2/4", "3/4", "4/4"]


def _evaluate(state: Any, batch: Any) -> ciclo.types.Logs:
    return ciclo.logs().add_metric("x", float(batch))


@pytest.mark.parametrize(
    ("loop", "hook"),
    [(ciclo.test_loop, ciclo.on_test_step), (ciclo.predict_loop, ciclo.hooks.on_predict_step)],
    ids=["test_loop", "predict_loop"],
)
def test_shows_the_progress_of_a_test_or_predict_loop(clock: Clock, loop: Any, hook: str) -> None:
    buffer = io.StringIO()
    bar = ciclo.keras_bar(total=3, file=buffer)
    loop(None, [1, 2, 3], {hook: _evaluate}, callbacks=[bar])
    assert buffer.getvalue().splitlines() == [
        "2/3 [===================>..........] - ETA: 0s - x: 2.0000",
        "3/3 [==============================] - 0s 0s/step - x: 3.0000",
    ]


def test_in_a_loop_draws_at_loop_end(clock: Clock) -> None:
    buffer = io.StringIO()
    bar = ciclo.keras_bar(total=100, file=buffer)
    ciclo.loop(0, range(5), {ciclo.every(1): [lambda: {"metrics": {"x": 1.0}}, bar]})
    assert buffer.getvalue().splitlines() == [
        "  5/100 [>.............................] - 0s 0s/step - x: 1.0000"
    ]


def test_loop_callback_returns_none_no_logs_and_the_state_unchanged() -> None:
    bar = ciclo.keras_bar(total=10, file=io.StringIO())
    assert bar.__loop_callback__(loop_state(ciclo.types.Elapsed.create(), ciclo.logs())) is None


def test_is_a_loop_callback() -> None:
    bar: ciclo.types.LoopCallback[Any] = ciclo.keras_bar(file=io.StringIO())
    assert isinstance(bar, ciclo.types.LoopCallback) and isinstance(bar, ciclo.types.KerasBar)


def test_close_without_any_update_writes_nothing() -> None:
    buffer = Terminal()
    bar = ciclo.keras_bar(total=10, file=buffer)
    bar.close()
    bar.close()
    assert buffer.getvalue() == "" and bar.finished


# --- arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"interval": -1}, ValueError, "-1"),
        ({"interval": float("nan")}, ValueError, "nan"),
        ({"interval": "fast"}, TypeError, "'fast'"),
        ({"width": 0}, ValueError, "0"),
        ({"width": 2.5}, TypeError, "2.5"),
        ({"width": True}, TypeError, "True"),
        ({"total": -5}, ValueError, "-5"),
        ({"total": 0}, ValueError, r"total must be > 0 \(a bar full at once\), got 0"),
        ({"total": ciclo.at(samples=0)}, ValueError, r"total must be > 0 .*samples=0"),
        ({"total": "100"}, TypeError, "'100'"),
        ({"total": 1.5}, TypeError, "1.5"),
        ({"total": ciclo.at(date=1e10)}, ValueError, "date"),
        ({"file": object()}, TypeError, "object"),
    ],
)
def test_bad_arguments_raise_naming_the_value(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    kwargs.setdefault("file", io.StringIO())
    with pytest.raises(error, match=match):
        ciclo.keras_bar(**kwargs)


def test_not_a_terminal_when_isatty_fails() -> None:
    class Closed(io.StringIO):
        def isatty(self) -> bool:
            raise ValueError("I/O operation on closed file")

    buffer = Closed()
    bar = ciclo.keras_bar(total=1, file=buffer)
    bar(ciclo.types.Elapsed.create())
    assert "\r" not in buffer.getvalue()


# --- notebooks --------------------------------------------------------------------------------


def test_notebook_stream_redraws_in_place_and_shows_one_line(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_notebook(monkeypatch)
    stream = OutStream()
    bar = ciclo.keras_bar(total=100, file=stream, interval=0)
    run(bar, clock, 100, seconds_per_step=0.53)
    output = stream.getvalue()
    assert output.count("\r") == 100 and output.count("\n") == 1  # every call redrew, in place
    # What the notebook shows: the final line alone, no line per redraw or per tenth.
    assert [line.rstrip() for line in rendered(output)] == [
        "100/100 [==============================] - 52s 530ms/step - loss: 0.0100 - accuracy: 0.9900"
    ]


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_kernel_stdout_and_stderr_redraw_in_place(
    clock: Clock, monkeypatch: pytest.MonkeyPatch, stream: str
) -> None:
    in_notebook(monkeypatch)
    # The kernel's streams are recognised as such even when not ipykernel's class (another kernel).
    buffer = io.StringIO()
    monkeypatch.setattr(sys, stream, buffer)
    bar = ciclo.keras_bar(total=10, file=None if stream == "stdout" else sys.stderr, interval=0)
    run(bar, clock, 10)
    assert buffer.getvalue().count("\r") == 10
    assert len(rendered(buffer.getvalue())) == 1


def test_stdout_in_a_notebook_cell(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    in_notebook(monkeypatch)
    stdout = OutStream()
    monkeypatch.setattr(sys, "stdout", stdout)
    bar = ciclo.keras_bar(total=20, interval=0)  # sys.stdout by default
    ciclo.loop(0, range(20), {ciclo.every(1): [lambda: {"metrics": {"x": 1.0}}, bar]})
    assert stdout.getvalue().count("\r") == 20
    lines = rendered(stdout.getvalue())
    assert len(lines) == 1 and lines[0].startswith("20/20 [==============================] - ")


def test_terminal_ipython_with_a_log_stream_writes_lines(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_notebook(monkeypatch, kernel=False)
    stdout = io.StringIO()  # e.g. IPython's output piped to a file
    monkeypatch.setattr(sys, "stdout", stdout)
    bar = ciclo.keras_bar(total=100, interval=0)
    run(bar, clock, 100)
    assert "\r" not in stdout.getvalue() and len(rendered(stdout.getvalue())) == 10


def test_another_file_in_a_kernel_writes_lines(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    in_notebook(monkeypatch)
    log = io.StringIO()  # a log file opened in a notebook is not shown by the notebook
    bar = ciclo.keras_bar(total=100, file=log, interval=0)
    run(bar, clock, 100)
    assert "\r" not in log.getvalue() and len(log.getvalue().splitlines()) == 10


def test_ipykernel_imported_without_a_kernel_is_not_a_notebook(monkeypatch: pytest.MonkeyPatch) -> None:
    # A script that imported ipykernel (or IPython) but runs outside a kernel.
    stdout = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    bar = ciclo.keras_bar(total=10)
    bar(ciclo.types.Elapsed.create())
    bar.close()
    assert "\r" not in stdout.getvalue()


def test_unusable_ipython_is_not_a_notebook(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise RuntimeError("torn down")

    ipython = types.ModuleType("IPython")
    ipython.get_ipython = broken  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert not is_notebook_stream(sys.stdout)
