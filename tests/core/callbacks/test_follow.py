"""`ciclo.follow_checkpoints`: each complete checkpoint once, in order, with progress that survives."""

import json
import logging
import os
import shutil

import jax.numpy as jnp
import pytest

import ciclo
from ciclo._src.base.files import LinkError
from ciclo._src.callbacks._checkpoint import SETTINGS_FILE


def add_batch(state, batch):
    return None, {"w": state["w"] + batch}


def zero():
    return {"w": jnp.float32(0)}


def train(directory, steps=6, **checkpoint):
    """A finished `train_loop` whose checkpoint callback saves at each epoch's end (every 2 steps)."""
    ciclo.train_loop(
        zero(),
        range(steps),
        {ciclo.on_train_step: [add_batch]},
        callbacks=[ciclo.checkpoint(directory, keep=None, **checkpoint)],
        epoch_duration=2,
    )


def followed(directory, **options):
    followers = ciclo.follow_checkpoints(directory, zero(), **options)
    return [(step, float(state["w"])) for step, state in followers]


def progress(directory, name="default"):
    return json.loads((directory / f"ciclo_follow_{name}.json").read_text())


def test_a_finished_run_s_checkpoints_are_followed_once_in_order_then_it_ends(tmp_path):
    train(tmp_path)
    # The run ended by itself: its checkpoint callback marked the newest step final, so no timeout.
    assert json.loads((tmp_path / SETTINGS_FILE).read_text())["final"] == 6
    assert followed(tmp_path) == [(2, 1.0), (4, 6.0), (6, 15.0)]
    assert progress(tmp_path) == {"done": 6}
    assert followed(tmp_path) == []  # all done: a rerun evaluates nothing again
    assert followed(tmp_path, name="other") == [(2, 1.0), (4, 6.0), (6, 15.0)]  # its own progress


def test_a_step_is_done_only_once_the_body_finished_with_it(tmp_path):
    train(tmp_path)
    seen = []
    with pytest.raises(RuntimeError, match="evaluation failed"):
        for step, _ in ciclo.follow_checkpoints(tmp_path, zero()):
            seen.append(step)
            assert not step == 4 or progress(tmp_path) == {"done": 2}
            if step == 4:
                raise RuntimeError("evaluation failed")
    assert seen == [2, 4] and progress(tmp_path) == {"done": 2}
    # Started again, it goes on with the first step it had not finished.
    assert [step for step, _ in followed(tmp_path)] == [4, 6]


def test_steps_written_while_following_are_followed_and_a_timeout_ends_it(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, keep=None)  # saved by hand: no loop marks the run final
    ckpt.save(1, {"w": jnp.float32(1)})
    ckpt.wait()
    seen = []
    for step, state in ciclo.follow_checkpoints(tmp_path, zero(), poll=0.01, timeout=0):
        seen.append((step, float(state["w"])))
        if step < 3:  # the training goes on as the follower evaluates
            ckpt.save(step + 1, {"w": jnp.float32(step + 1)})
            ckpt.wait()
    ckpt.close()
    assert seen == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert "final" not in json.loads((tmp_path / SETTINGS_FILE).read_text())
    assert followed(tmp_path, timeout=0.05, poll=0.01) == []


def test_a_half_written_step_is_not_followed_and_an_empty_one_is_skipped(tmp_path, caplog):
    train(tmp_path)
    # What orbax writes before its commit renames the directory: a step under a temporary name.
    shutil.copytree(tmp_path / "6", tmp_path / "8.orbax-checkpoint-tmp-1234")
    (tmp_path / "5").mkdir()  # a save cut before it wrote anything
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        assert [step for step, _ in followed(tmp_path)] == [2, 4, 6]
    assert any("skipping the checkpoint of step 5" in record.getMessage() for record in caplog.records)


def test_the_final_mark_is_for_a_run_that_ended_by_itself_and_a_resumed_run_clears_it(tmp_path):
    def failing(state, batch):
        if batch == 3:
            raise RuntimeError("killed")
        return add_batch(state, batch)

    with pytest.raises(RuntimeError, match="killed"):
        ciclo.train_loop(
            zero(),
            range(6),
            {ciclo.on_train_step: [failing]},
            callbacks=[ciclo.checkpoint(tmp_path, keep=None)],
            epoch_duration=2,
        )
    assert "final" not in json.loads((tmp_path / SETTINGS_FILE).read_text())
    assert [step for step, _ in followed(tmp_path, timeout=0)] == [2]
    train(tmp_path / "done")
    ciclo.checkpoint(tmp_path / "done", keep=None, resume=True).close()  # the run goes on
    assert "final" not in json.loads((tmp_path / "done" / SETTINGS_FILE).read_text())
    # One checkpoint in two loops (two stages of a run): the mark of the first goes as the second starts.
    ckpt = ciclo.checkpoint(tmp_path / "stages", keep=None)
    settings = tmp_path / "stages" / SETTINGS_FILE

    def look(state, batch, elapsed):
        assert "final" not in json.loads(settings.read_text())
        return add_batch(state, batch)

    tasks = {ciclo.every(1): [add_batch], ciclo.at_step_end(ciclo.every(1)): [ckpt]}
    state, _, elapsed = ciclo.loop(zero(), range(2), tasks)
    assert json.loads(settings.read_text())["final"] == 2
    tasks = {ciclo.every(1): [look], ciclo.at_step_end(ciclo.every(1)): [ckpt]}
    ciclo.loop(state, range(2), tasks, elapsed=elapsed)
    assert json.loads(settings.read_text())["final"] == 4


def test_partial_restores_and_the_follower_s_arguments_are_checked(tmp_path):
    train(tmp_path)
    target = {"w": jnp.float32(0), "extra": jnp.float32(-1)}
    states = [state for _, state in ciclo.follow_checkpoints(tmp_path, target, partial=True)]
    assert [float(state["extra"]) for state in states] == [-1.0] * 3
    for options, message in [
        ({"poll": 0}, "poll must be a number of seconds > 0, got 0"),
        ({"timeout": -1.0}, "timeout must be None or a number of seconds >= 0, got -1.0"),
        ({"name": "../x"}, "name must be letters, digits"),
    ]:
        with pytest.raises(ValueError, match=message):
            next(ciclo.follow_checkpoints(tmp_path, zero(), **options))
    with pytest.raises(TypeError, match="pass no step="):
        next(ciclo.follow_checkpoints(tmp_path, zero(), step=2))
    (tmp_path / "ciclo_follow_bad.json").write_text('{"done": "6"}')
    with pytest.raises(ValueError, match=r"ciclo_follow_bad.json: done is '6'; delete it"):
        next(ciclo.follow_checkpoints(tmp_path, zero(), name="bad"))
    os.remove(tmp_path / "ciclo_follow_bad.json")
    os.symlink(tmp_path / "ciclo_follow_default.json", tmp_path / "ciclo_follow_link.json")
    with pytest.raises(LinkError):  # a link in the directory: never followed out of it
        next(ciclo.follow_checkpoints(tmp_path, zero(), name="link"))


def test_overwrite_removes_the_followers_progress_of_the_run_it_replaces(tmp_path):
    train(tmp_path)
    assert [step for step, _ in followed(tmp_path)] == [2, 4, 6]
    (tmp_path / "notes.json").write_text("{}")  # not ciclo's: left alone
    train(tmp_path, overwrite=True)  # a new run in the same directory
    assert not (tmp_path / "ciclo_follow_default.json").exists()
    assert (tmp_path / "notes.json").exists()
    assert [step for step, _ in followed(tmp_path)] == [2, 4, 6]  # the new run's steps, all of them
