from __future__ import annotations

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


def quiet_bar(total: Any = None, **kwargs: Any) -> ciclo.types.TqdmBar:
    kwargs.setdefault("file", io.StringIO())
    return ciclo.tqdm_bar(total, **kwargs)


@jax.jit
def jit_step(state: jax.Array, batch: jax.Array) -> tuple[ciclo.types.Logs, jax.Array]:
    state = state + batch
    return ciclo.logs().add_loss("loss", 1.0 / state, add_metric=True), state


@pytest.mark.parametrize(
    ("total", "tqdm_total", "unit"),
    [
        (100, 100, "step"),
        (ciclo.at(steps=100), 100, "step"),
        (ciclo.at(samples=640), 640, "sample"),
        (ciclo.at(time=30), 30, "s"),
        (ciclo.at(time=2.5), 2.5, "s"),
        (None, None, "step"),
    ],
)
def test_total_sets_tqdm_total_and_unit(total: Any, tqdm_total: float | None, unit: str) -> None:
    bar = quiet_bar(total)
    assert (bar.tqdm.total, bar.tqdm.unit) == (tqdm_total, unit)
    assert type(bar.tqdm.total) is type(tqdm_total)
    bar.close()


def test_tqdm_kwargs_are_passed_through() -> None:
    bar = quiet_bar(10, desc="train", unit="batch", leave=False)
    assert (bar.tqdm.desc, bar.tqdm.unit, bar.tqdm.leave) == ("train", "batch", False)
    bar.close()


def test_updates_count_and_postfix(clock: Clock) -> None:
    bar = quiet_bar(10, interval=0)
    for elapsed, batch in ciclo.elapse([0.5, 0.25, 0.125]):
        clock.now += 1
        bar(elapsed, ciclo.logs().add_metric("loss", batch).add_metric("vector", np.ones(2)))
        assert bar.tqdm.n == elapsed.steps + 1
        assert bar.tqdm.postfix == f"loss={batch:.4f}"
    assert not bar.finished and not bar.tqdm.disable
    bar.close()
    assert bar.finished and bar.tqdm.disable  # tqdm disables a bar it closed


def test_finishes_and_closes_at_total_when_iterating_by_hand(clock: Clock) -> None:
    buffer = io.StringIO()
    bar = ciclo.tqdm_bar(total=5, file=buffer, bar_format="{n}/{total}{postfix}")
    state = jnp.float32(0.0)
    for elapsed, batch in ciclo.elapse([jnp.float32(1.0)] * 10, stop=5):
        clock.now += 1
        logs = ciclo.logs()
        logs.updates, state = jit_step(state, batch)
        bar(elapsed, logs)
    assert bar.finished and bar.tqdm.n == 5
    assert buffer.getvalue().endswith("5/5, loss=0.2000\n")


def test_updates_at_most_once_per_interval(clock: Clock) -> None:
    bar = quiet_bar(100, interval=1.0)
    seen = []
    for elapsed, batch in ciclo.elapse(range(12)):
        clock.now += 0.25
        bar(elapsed, {"metrics": {"batch": batch}})
        seen.append((bar.tqdm.n, bar.tqdm.postfix))
    # Updated at t=0.25 (first call), then every 4 calls: t=1.25 and t=2.25.
    assert seen == [(1, "batch=0.0000")] * 4 + [(5, "batch=4.0000")] * 4 + [(9, "batch=8.0000")] * 4
    bar.close()
    assert (bar.tqdm.n, bar.tqdm.postfix) == (12, "batch=11.0000")


def test_no_value_is_read_between_updates(clock: Clock) -> None:
    bar = quiet_bar(100, interval=1e9)
    loss = Tripwire(0.5)
    logs = ciclo.logs().add_metric("loss", loss)
    bar(ciclo.types.Elapsed.create(), logs)
    assert loss.reads == 1
    for step in range(1, 50):
        clock.now += 1.0
        bar(ciclo.types.Elapsed.create(steps=step), logs)
        bar.__loop_callback__(loop_state(ciclo.types.Elapsed.create(steps=step), logs))
    assert loss.reads == 1 and bar.tqdm.n == 1
    bar.close()
    assert loss.reads == 2 and bar.tqdm.n == 50


def test_in_jit_loop_without_device_copies_between_updates(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetched = spy_on_host_copies(monkeypatch)
    bar = quiet_bar(100, interval=1e9)
    with jax.transfer_guard_device_to_host("disallow_explicit"):
        _, _, elapsed = ciclo.loop(
            jnp.float32(0.0), [jnp.float32(1.0)] * 20, {ciclo.every(1): [jit_step, bar]}
        )
    assert elapsed.steps == 20
    assert fetched == [["loss"]] * 2  # the first update and the final one, at loop end
    assert bar.finished and bar.tqdm.n == 20 and bar.tqdm.postfix == "loss=0.0500"


def test_time_total_counts_whole_seconds(clock: Clock) -> None:
    bar = quiet_bar(ciclo.at(time=10), interval=0)
    for step, seconds in enumerate([0.4, 1.7, 3.2, 3.9]):
        bar(ciclo.types.Elapsed(steps=step, samples=step, time=seconds, date_start=0.0))
    assert bar.tqdm.n == 3
    bar(ciclo.types.Elapsed(steps=4, samples=4, time=10.2, date_start=0.0))
    assert bar.finished and bar.tqdm.n == 10


def test_samples_total_counts_samples(clock: Clock) -> None:
    bar = quiet_bar(ciclo.at(samples=32))
    for elapsed, _ in ciclo.elapse([np.zeros((8, 1))] * 10, stop=ciclo.at(samples=32)):
        bar(elapsed)
    assert bar.finished and bar.tqdm.n == 32


def test_loop_end_closes_when_the_loop_stops_early(clock: Clock) -> None:
    bar = quiet_bar(100)
    ciclo.loop(0, range(100), {ciclo.every(1): [bar]}, stop=7)
    assert bar.finished and bar.tqdm.disable and bar.tqdm.n == 7 and type(bar.tqdm.n) is int


def test_in_a_loop(clock: Clock) -> None:
    bar = quiet_bar(100, interval=0)
    ciclo.loop(0, range(4), {ciclo.every(1): [lambda: {"metrics": {"x": 2.0}}, bar]})
    assert bar.finished and bar.tqdm.n == 4 and bar.tqdm.postfix == "x=2.0000"
    assert bar.hook[0] == ciclo.on_train_batch_end  # train_loop's; test_loop's and predict_loop's follow


@pytest.mark.parametrize(
    ("loop", "hook"),
    [(ciclo.test_loop, ciclo.on_test_step), (ciclo.predict_loop, ciclo.hooks.on_predict_step)],
    ids=["test_loop", "predict_loop"],
)
def test_shows_the_progress_of_a_test_or_predict_loop(clock: Clock, loop: Any, hook: str) -> None:
    bar = quiet_bar(interval=0)
    loop(None, [1, 2, 3], {hook: lambda batch: {"metrics": {"x": float(batch)}}}, callbacks=[bar])
    assert bar.finished and bar.tqdm.n == 3 and bar.tqdm.postfix == "x=3.0000"


def test_is_a_loop_callback() -> None:
    bar: ciclo.types.LoopCallback[Any] = quiet_bar()
    assert isinstance(bar, ciclo.types.LoopCallback) and isinstance(bar, ciclo.types.TqdmBar)
    assert bar.__loop_callback__(loop_state(ciclo.types.Elapsed.create(), ciclo.logs())) is None
    bar.close()


def test_close_without_updates_closes_tqdm() -> None:
    bar = quiet_bar(10)
    bar.close()
    bar.close()
    assert bar.finished and bar.tqdm.disable and bar.tqdm.n == 0


# --- notebooks --------------------------------------------------------------------------------


def test_draws_with_tqdm_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    created: list[dict[str, Any]] = []

    class NotebookTqdm:
        """Stands in for the widget bar `tqdm.auto` picks in a notebook."""

        def __init__(self, **kwargs: Any) -> None:
            created.append(kwargs)
            self.n = 0

        def update(self, n: float) -> None:
            self.n += n

        def set_postfix(self, postfix: dict[str, str], refresh: bool) -> None:
            self.postfix = postfix

        def close(self) -> None:
            self.closed = True

    auto = types.ModuleType("tqdm.auto")
    auto.tqdm = NotebookTqdm  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tqdm.auto", auto)
    bar = ciclo.tqdm_bar(3, interval=0, desc="train")
    for elapsed, batch in ciclo.elapse([0.5, 0.25, 0.125]):
        bar(elapsed, ciclo.logs().add_metric("loss", batch))
    assert type(bar.tqdm) is NotebookTqdm and created == [{"total": 3, "desc": "train", "unit": "step"}]
    assert bar.tqdm.n == 3 and bar.tqdm.postfix == {"loss": "0.1250"} and bar.tqdm.closed


def test_outside_a_notebook_the_bar_is_tqdm_auto_text_bar() -> None:
    import tqdm.auto
    import tqdm.std

    bar = quiet_bar(3)
    assert isinstance(bar.tqdm, tqdm.auto.tqdm) and isinstance(bar.tqdm, tqdm.std.tqdm)
    bar.close()


def test_text_bar_on_a_notebook_stream_shows_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # In a kernel without ipywidgets, tqdm.auto falls back to the text bar, which redraws in place.
    in_notebook(monkeypatch)
    stream = OutStream("stderr")
    monkeypatch.setattr(sys, "stderr", stream)  # where tqdm writes by default
    # position=0: a bar another test left open would push this one a line down (tqdm's nesting).
    bar = ciclo.tqdm_bar(50, interval=0, mininterval=0, position=0, bar_format="{n}/{total}{postfix}")
    ciclo.loop(
        0, range(50), {ciclo.every(1): [lambda state, batch: ciclo.logs().add_metric("x", batch / 10), bar]}
    )
    output = stream.getvalue()
    assert output.count("\r") > 10 and output.count("\n") == 1
    assert [line.rstrip() for line in rendered(output)] == ["50/50, x=4.9000"]


def test_missing_tqdm_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.raises(ImportError, match=r'pip install "ciclo-core\[tqdm\]"'):
        ciclo.tqdm_bar(10)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"interval": -0.5}, ValueError, "-0.5"),
        ({"interval": None}, TypeError, "None"),
        ({"total": -1}, ValueError, "-1"),
        ({"total": [10]}, TypeError, r"\[10\]"),
        ({"total": ciclo.at(date=1e10)}, ValueError, "date"),
    ],
)
def test_bad_arguments_raise_naming_the_value(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        quiet_bar(**kwargs)
