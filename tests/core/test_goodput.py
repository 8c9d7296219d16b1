"""`ciclo.goodput`: a backed-up run's wall time in buckets, one row per start (the kills: tests/faults)."""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import pytest

import ciclo
from ciclo._src.resume.goodput import BUCKETS


def _run(directory, stop, *, loop=ciclo.loop):
    step = jax.jit(lambda state, batch: state + batch)

    def train_step(state, batch):
        time.sleep(0.02)  # the step's own time
        return None, step(state, batch)

    def batches():
        for index in range(100):
            time.sleep(0.01)  # waiting for data
            yield jnp.int32(index)

    task = ciclo.on_train_step if loop is ciclo.train_loop else ciclo.every(1)
    return loop(
        jnp.int32(0), batches(), {task: train_step}, stop=stop, backup=ciclo.backup(directory, every=4)
    )


def _check_sums(row):
    attributed = sum(row[name] for name in BUCKETS)
    assert abs(attributed - row["wall"]) <= 0.02 * row["wall"], row


def test_a_run_and_its_resumption_each_write_a_row_whose_buckets_sum_to_its_wall_time(tmp_path):
    _run(tmp_path, 10)
    first = ciclo.goodput(tmp_path)
    assert len(first.rows) == 1
    row = first.rows[0]
    assert (row["resumed"], row["steps"], row["lost"]) == (0, 10, 0)
    _check_sums(row)
    assert row["step"] >= 10 * 0.02 * 0.9 and row["data"] >= 10 * 0.01 * 0.9
    assert row["save"] > 0 and row["compile"] >= 0
    _run(tmp_path, 15)
    report = ciclo.goodput(tmp_path)
    assert [(r["resumed"], r["steps"], r["lost"]) for r in report.rows] == [(0, 10, 0), (10, 15, 0)]
    for row in report.rows:
        _check_sums(row)
    totals = report.to_dict()
    assert totals["restarts"] == 1 and totals["lost"] == 0
    assert totals["wall"] == pytest.approx(sum(r["wall"] for r in report.rows))
    assert totals["goodput"] == pytest.approx(totals["step"] / totals["wall"])
    assert str(report).startswith("goodput ") and "over 1 restart (0 steps redone): wall" in str(report)


def test_a_resumed_train_loop_prints_its_goodput_in_one_line(tmp_path, capsys):
    _run(tmp_path, 6, loop=ciclo.train_loop)
    assert "goodput" not in capsys.readouterr().err  # not resumed: nothing to say
    _run(tmp_path, 9, loop=ciclo.train_loop)
    lines = [line for line in capsys.readouterr().err.splitlines() if "goodput" in line]
    assert lines == [f"ciclo: {ciclo.goodput(tmp_path)}"]


def test_a_finished_run_run_again_adds_no_row(tmp_path):
    _run(tmp_path, 5)
    _run(tmp_path, 5)
    assert len(ciclo.goodput(tmp_path).rows) == 1


def test_a_directory_without_a_record_or_with_a_damaged_row_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no goodput record"):
        ciclo.goodput(tmp_path)
    _run(tmp_path, 3)
    row = tmp_path / "goodput" / "start-0.json"
    document = json.loads(row.read_text())
    row.write_text(json.dumps({**document, "wall": "a while"}))
    with pytest.raises(ValueError, match=r"start-0.json: wall is a str, not seconds") as caught:
        ciclo.goodput(tmp_path)
    assert "remove it" in str(caught.value)


def test_a_start_killed_before_its_first_step_leaves_a_row_of_no_steps(tmp_path):
    from ciclo._src.resume.goodput import Recorder

    _run(tmp_path, 4)
    Recorder(str(tmp_path), 4, time.monotonic())  # never closed: killed before its first step ended
    (tmp_path / "goodput" / "start-2.json").write_text("")  # killed between creating its row and writing it
    _run(tmp_path, 6)
    rows = ciclo.goodput(tmp_path).rows
    assert [(r["resumed"], r["steps"], r["lost"]) for r in rows] == [(0, 4, 0), (4, 4, 0), (4, 6, 0)]
