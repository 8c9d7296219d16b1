import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo._src.callbacks._checkpoint import SETTINGS_FILE


def committed_steps(directory):
    """Steps whose directory orbax has finalised, read from the file system only."""
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def add_batch(state, batch):
    return None, {"w": state["w"] + batch}


def zero():
    return {"w": jnp.float32(0)}


def monitored_run(ckpt, values, key="loss"):
    """Saves {"v": values[i]} as step i, with values[i] logged under `key`."""
    for step, value in enumerate(values):
        logs = ciclo.logs().add_metric(key, value)
        ckpt.save(step, {"v": jnp.float32(value)}, logs)
    ckpt.wait()


# --- saving on a schedule -------------------------------------------------------------------------


@pytest.mark.parametrize("async_save", [True, False])
@pytest.mark.parametrize(
    ("schedule", "keep", "expected"),
    [
        # A plain every(3) fires in the steps that start at 0, 3, 6, 9: saved once they are done.
        (ciclo.every, 2, [7, 10]),
        (ciclo.every, 1, [10]),
        (ciclo.every, None, [1, 4, 7, 10]),
        (lambda k: ciclo.at_step_end(ciclo.every(k)), None, [3, 6, 9]),
    ],
)
def test_loop_saves_every_k_steps_and_keeps_the_last(tmp_path, schedule, keep, expected, async_save):
    ckpt = ciclo.checkpoint(tmp_path / "model", keep=keep, async_save=async_save)
    state, _, elapsed = ciclo.loop(
        zero(), range(100), {ciclo.every(1): [add_batch], schedule(3): [ckpt]}, stop=10
    )
    assert elapsed.steps == 10 and float(state["w"]) == 45.0
    assert ckpt.all_steps() == expected
    assert committed_steps(tmp_path / "model") == expected
    assert ckpt.latest_step() == expected[-1]
    # The checkpoint of step s holds the state after s updates: 0 + 1 + ... + (s - 1).
    for step in expected:
        assert float(ckpt.restore(zero(), step=step)["w"]) == sum(range(step))


def test_checkpoint_number_is_the_managed_step(tmp_path):
    # The finding: checkpoints were numbered 9 and 19 while the state they held had step 10 and 20.
    def train_step(state, batch):
        return None, {"step": state["step"] + 1}

    ckpt = ciclo.checkpoint(tmp_path, keep=None)
    ciclo.loop(
        {"step": jnp.int32(0)},
        range(100),
        {ciclo.every(1): [train_step], ciclo.at_step_end(ciclo.every(10)): [ckpt]},
        stop=20,
    )
    assert ckpt.all_steps() == [10, 20]
    for step in ckpt.all_steps():
        assert int(ckpt.restore({"step": jnp.int32(0)}, step=step)["step"]) == step


def test_manual_iteration(tmp_path):
    call_checkpoint = ciclo.every(steps=4)
    ckpt = ciclo.checkpoint(tmp_path, keep=2)
    state = zero()
    for elapsed, batch in ciclo.elapse(range(100), stop=13):
        _, state = add_batch(state, batch)
        if call_checkpoint(elapsed):
            ckpt(elapsed, state)
    ckpt.wait()
    # Called in the steps that start at 0, 4, 8, 12: numbered with the steps done, 1, 5, 9, 13.
    assert ckpt.all_steps() == committed_steps(tmp_path) == [9, 13]
    assert float(ciclo.restore_checkpoint(tmp_path, zero())["w"]) == sum(range(13))


def test_directory_is_made_absolute_and_created(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ckpt = ciclo.checkpoint("logdir/model")
    assert ckpt.directory == str(tmp_path / "logdir" / "model")
    assert os.path.isdir(tmp_path / "logdir" / "model")
    ckpt.close()


def test_is_a_callback_placed_at_the_epoch_end(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path)
    assert isinstance(ckpt, ciclo.Callback) and isinstance(ckpt, ciclo.types.LoopCallback)
    assert ckpt.hook == ciclo.on_epoch_end


def test_same_step_twice_saves_once(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, keep=None)
    elapsed = ciclo.types.Elapsed.create(steps=4)
    ckpt.save(4, {"w": jnp.float32(1)})
    ckpt.save(4, {"w": jnp.float32(2)})  # e.g. every(k) and on_epoch_end at the same step

    loop_state = ciclo.types.LoopState(
        state={"w": jnp.float32(3)},
        batch=None,
        history=ciclo.history(),
        elapsed=elapsed,
        logs=ciclo.logs(),
        accumulated_logs=ciclo.logs(),
    )
    assert ckpt.__loop_callback__(loop_state) == ({}, loop_state.state)
    ckpt(ciclo.types.Elapsed.create(steps=3), loop_state.state)  # the hand-written form: step 3 + 1
    assert ckpt.all_steps() == [4]
    assert float(ckpt.restore(zero())["w"]) == 1.0  # the first save of the step wins

    # The hand-written form saves a new step like the schedule does.
    ckpt(ciclo.types.Elapsed.create(steps=4), {"w": jnp.float32(5)})
    assert ckpt.all_steps() == [4, 5]
    assert float(ckpt.restore(zero())["w"]) == 5.0
    ckpt.close()


# --- monitor ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "values", "kept", "best"),
    [
        ("min", [0.5, 0.2, 0.9, 0.1, 0.3], [1, 3], 3),
        ("max", [0.5, 0.2, 0.9, 0.1, 0.7], [2, 4], 2),
    ],
)
def test_monitor_keeps_the_best(tmp_path, mode, values, kept, best):
    ckpt = ciclo.checkpoint(tmp_path, keep=2, monitor="loss", mode=mode)
    monitored_run(ckpt, values)
    assert ckpt.all_steps() == committed_steps(tmp_path) == kept
    assert ckpt.best_step() == best
    assert float(ckpt.restore({"v": jnp.float32(0)}, step="best")["v"]) == pytest.approx(values[best])
    assert float(ckpt.restore({"v": jnp.float32(0)})["v"]) == pytest.approx(values[kept[-1]])
    ckpt.close()
    # Another call, with no Checkpoint and no monitor or mode restated, finds the same best.
    restored = ciclo.restore_checkpoint(tmp_path, {"v": jnp.float32(0)}, step="best")
    assert float(restored["v"]) == pytest.approx(values[best])


def test_nan_is_never_the_best(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, keep=2, monitor="acc", mode="max")
    monitored_run(ckpt, [0.3, float("nan"), 0.2, 0.4], key="acc")
    assert ckpt.all_steps() == [0, 3]
    assert ckpt.best_step() == 3
    ckpt.close()


def test_monitor_reads_the_accumulated_logs_of_the_loop(tmp_path):
    accuracies = iter([0.5, 0.8, 0.6, 0.7, 0.2])

    def test_step(state):
        return ciclo.logs().add_metric("accuracy_test", next(accuracies)), state

    ckpt = ciclo.checkpoint(tmp_path, keep=1, monitor="metrics.accuracy_test", mode="max")
    ciclo.loop(
        zero(),
        range(100),
        {
            ciclo.every(1): [add_batch],
            ciclo.every(2): [test_step],
            # At odd steps, which log no accuracy: it comes from the step before.
            ciclo.after(1).every(2): [ckpt],
        },
        stop=10,
    )
    # accuracy 0.8, logged in the step that starts at 2; saved after the next one, with 4 steps done
    assert ckpt.all_steps() == [4]
    assert float(ckpt.restore(zero(), step="best")["w"]) == sum(range(4))
    ckpt.close()


def test_missing_monitor_entry_raises_key_error_naming_it(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, monitor="accuracy")
    logs = ciclo.logs().add_metric("loss", 0.1)
    with pytest.raises(KeyError, match=r"'accuracy'.*metrics\.loss"):
        ckpt(ciclo.types.Elapsed.create(), zero(), logs)
    with pytest.raises(KeyError, match=r"'accuracy'.*present: \[\]"):
        ckpt(ciclo.types.Elapsed.create(), zero())
    with pytest.raises(KeyError, match=r"'accuracy'.*metrics\.loss"):
        ciclo.loop(
            zero(),
            range(3),
            {ciclo.every(1): [lambda state: (ciclo.logs().add_metric("loss", 1.0), state), ckpt]},
        )
    assert ckpt.all_steps() == []
    ckpt.close()


# --- restore ----------------------------------------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Stats:
    mean: jax.Array
    count: jax.Array


def make_state(seed):
    key = jax.random.key(seed)
    params = {
        "dense": {"w": jax.random.normal(key, (4, 3)), "b": jnp.zeros(3)},
        "scale": jnp.ones((), jnp.bfloat16),
    }
    return {
        "params": params,
        "opt_state": optax.adam(1e-2).init(params),
        "stats": Stats(mean=jnp.zeros(3), count=jnp.int32(0)),
        "step": 0,
    }


def train(state, batch):
    grads = jax.tree.map(lambda p: jnp.full_like(p, batch), state["params"])
    updates, opt_state = optax.adam(1e-2).update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    stats = Stats(mean=state["stats"].mean + batch, count=state["stats"].count + 1)
    return None, {"params": params, "opt_state": opt_state, "stats": stats, "step": state["step"] + 1}


def test_restore_latest_into_nested_optax_and_dataclass_state(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path)
    trained, _, _ = ciclo.loop(
        make_state(0), np.linspace(0.1, 1.0, 6), {ciclo.every(1): [train], ciclo.every(5): [ckpt]}
    )
    target = make_state(1)
    for restored in (ckpt.restore(target), ciclo.restore_checkpoint(tmp_path, target, step=6)):
        assert jax.tree.structure(restored) == jax.tree.structure(trained)
        assert isinstance(restored["opt_state"][0], optax.ScaleByAdamState)
        assert isinstance(restored["stats"], Stats)
        assert restored["step"] == 6 and isinstance(restored["step"], int)
        for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(trained), strict=True):
            assert isinstance(got, type(want))
            assert getattr(got, "dtype", None) == getattr(want, "dtype", None)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    ckpt.close()


@pytest.mark.parametrize("state", [7, jnp.float32(2.5), jnp.arange(3)])
def test_single_leaf_state(tmp_path, state):
    ckpt = ciclo.checkpoint(tmp_path)
    ckpt.save(1, state)
    restored = ckpt.restore(jax.tree.map(lambda x: x * 0, state))
    np.testing.assert_array_equal(np.asarray(restored), np.asarray(state))
    assert type(restored) is type(state)
    ckpt.close()


def test_async_saves_are_complete_when_the_loop_returns(tmp_path):
    big = {"w": jnp.zeros((2_000_000,), jnp.float32)}  # 8 MB: the background write takes a while

    def bump(state):
        return None, {"w": state["w"] + 1}

    ckpt = ciclo.checkpoint(tmp_path, keep=None, async_save=True)
    ciclo.loop(big, range(4), {ciclo.every(1): [bump, ckpt]})
    # Read the directory behind the Checkpoint's back: every step must be finalised already.
    assert committed_steps(tmp_path) == [1, 2, 3, 4]
    assert not [name for name in os.listdir(tmp_path) if "tmp" in name]
    restored = ciclo.restore_checkpoint(tmp_path, big)
    assert float(restored["w"][0]) == 4.0


def test_a_new_process_restores_the_best(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, keep=3, monitor="loss", mode="min")
    monitored_run(ckpt, [0.9, 0.4, 0.6, 0.5, 0.7])
    # No close(): what the loop or wait() leaves behind must be enough.
    # The new process logs at INFO, and imports absl only through ciclo's first restore.
    script = textwrap.dedent(
        f"""
        import logging, sys
        logging.basicConfig(level=logging.INFO, stream=sys.stdout)
        import jax.numpy as jnp, ciclo
        target = {{"v": jnp.float32(0)}}
        best = ciclo.restore_checkpoint({str(tmp_path)!r}, target, step="best")
        latest = ciclo.restore_checkpoint({str(tmp_path)!r}, target)
        print("restored", float(best["v"]), float(latest["v"]))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    lines = result.stdout.splitlines()
    assert lines[-1].split() == ["restored", "0.4000000059604645", "0.5"]
    assert not [line for line in lines if "absl" in line]  # orbax logs through absl: not one line
    assert result.stderr == ""
    ckpt.close()


# --- settings persisted in the directory ------------------------------------------------------------


def test_settings_are_recorded_and_a_conflicting_monitor_is_refused(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, monitor="loss", mode="min")
    monitored_run(ckpt, [0.3])
    ckpt.close()
    settings = json.loads((tmp_path / SETTINGS_FILE).read_text())
    assert settings == {"monitor": "loss", "mode": "min"}
    with pytest.raises(ValueError, match=r"monitor='loss', mode='min'.*monitor='accuracy', mode='max'"):
        ciclo.checkpoint(tmp_path, monitor="accuracy", mode="max")
    with pytest.raises(ValueError, match=r"monitor='loss'.*monitor=None"):
        ciclo.checkpoint(tmp_path)
    ciclo.checkpoint(tmp_path, monitor="loss", keep=3).close()  # same ranking: fine


def test_empty_directory_takes_the_new_settings(tmp_path):
    ciclo.checkpoint(tmp_path, monitor="loss").close()
    ckpt = ciclo.checkpoint(tmp_path, monitor="acc", mode="max")
    monitored_run(ckpt, [0.1, 0.3, 0.2], key="acc")
    ckpt.close()
    assert float(ciclo.restore_checkpoint(tmp_path, {"v": jnp.float32(0)}, step="best")["v"]) == (
        pytest.approx(0.3)
    )


def test_resuming_skips_existing_steps_and_warns_about_older_ones(tmp_path, caplog):
    first = ciclo.checkpoint(tmp_path, keep=None)
    first.save(10, {"w": jnp.float32(10)})
    first.close()

    resumed = ciclo.checkpoint(tmp_path, keep=None)
    assert float(resumed.restore(zero())["w"]) == 10.0  # resuming: restored from the directory
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        resumed.save(10, {"w": jnp.float32(-1)})  # the step resumed from
        assert not caplog.records
        resumed.save(4, {"w": jnp.float32(-1)})  # an older step: a new run?
        resumed.save(5, {"w": jnp.float32(-1)})
    assert len(caplog.records) == 1 and "up to step 10" in caplog.records[0].getMessage()
    resumed.save(12, {"w": jnp.float32(12)})
    assert resumed.all_steps() == [10, 12]
    assert float(resumed.restore(zero(), step=10)["w"]) == 10.0
    resumed.close()


def test_orbax_info_logs_are_filtered(tmp_path, caplog):
    with caplog.at_level(logging.DEBUG):
        ckpt = ciclo.checkpoint(tmp_path)
        ckpt.save(0, zero())
        ckpt.restore(zero())
        ckpt.close()
    assert [r for r in caplog.records if r.name == "absl"] == []


# --- errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"keep": 0}, ValueError, "0"),
        ({"keep": -2}, ValueError, "-2"),
        ({"keep": 1.5}, ValueError, "1.5"),
        ({"keep": True}, ValueError, "True"),
        ({"mode": "mean"}, ValueError, "'mean'"),
        ({"monitor": 3}, TypeError, "3"),
        ({"monitor": ""}, ValueError, "''"),
        ({"async_save": "yes"}, TypeError, "'yes'"),
    ],
)
def test_bad_arguments_name_the_value(tmp_path, kwargs, error, named):
    (name,) = kwargs
    with pytest.raises(error, match=rf"{name}.*{re.escape(named)}"):
        ciclo.checkpoint(tmp_path, **kwargs)


@pytest.mark.parametrize("directory", [123, None, b"bytes/path"])
def test_bad_directory_type(directory):
    with pytest.raises(TypeError, match=rf"directory.*{re.escape(repr(directory))}"):
        ciclo.checkpoint(directory)


def test_directory_that_is_a_file(tmp_path):
    path = tmp_path / "file"
    path.write_text("")
    with pytest.raises(NotADirectoryError, match=re.escape(str(path))):
        ciclo.checkpoint(path)


def test_call_needs_an_elapsed(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path)
    with pytest.raises(TypeError, match=r"ciclo\.types\.Elapsed.*\{'w'"):
        ckpt({"w": 1.0}, ciclo.types.Elapsed.create())
    ckpt.close()


def test_restore_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ciclo.restore_checkpoint(tmp_path / "missing", zero())
    assert not (tmp_path / "missing").exists()

    ckpt = ciclo.checkpoint(tmp_path / "run", keep=None)
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        ckpt.restore(zero())
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        ciclo.restore_checkpoint(tmp_path / "run", zero())
    assert ckpt.latest_step() is None and ckpt.best_step() is None

    ckpt.save(2, zero())
    ckpt.save(4, zero())
    with pytest.raises(FileNotFoundError, match=re.escape("step 3") + r".*\[2, 4\]"):
        ckpt.restore(zero(), step=3)
    with pytest.raises(FileNotFoundError, match=re.escape("step 3") + r".*\[2, 4\]"):
        ciclo.restore_checkpoint(tmp_path / "run", zero(), step=3)
    with pytest.raises(ValueError, match="'first'"):
        ckpt.restore(zero(), step="first")
    with pytest.raises(TypeError, match="2.0"):
        ckpt.restore(zero(), step=2.0)
    with pytest.raises(ValueError, match="without `monitor`"):
        ckpt.restore(zero(), step="best")
    with pytest.raises(ValueError, match="without `monitor`"):
        ciclo.restore_checkpoint(tmp_path / "run", zero(), step="best")
    ckpt.close()


def test_close_then_save_reopens(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, keep=None)
    ckpt.save(0, zero())
    ckpt.close()
    ckpt.close()  # idempotent
    ckpt.save(1, {"w": jnp.float32(1)})
    assert ckpt.all_steps() == [0, 1]
    assert float(ckpt.restore(zero())["w"]) == 1.0
    ckpt.close()
    assert "monitor=None" in repr(ckpt)


# --- surviving: non-finite values, Ctrl-C, kills, another run's directory ---------------------------


def test_a_non_finite_monitored_value_is_never_saved(tmp_path, caplog):
    ckpt = ciclo.checkpoint(tmp_path, keep=1, monitor="loss")
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        monitored_run(ckpt, [0.5, 0.4, float("nan"), float("inf"), 0.45])
    assert ckpt.all_steps() == [1] and ckpt.best_step() == 1  # keep=1 kept the last finite best
    messages = [record.getMessage() for record in caplog.records]
    assert sum("not saved" in m and "'loss'" in m for m in messages) == 2
    ckpt.close()


def test_settings_file_is_written_atomically_and_only_when_changed(tmp_path):
    ciclo.checkpoint(tmp_path, monitor="loss").close()
    settings = tmp_path / SETTINGS_FILE
    before = settings.stat()
    ciclo.checkpoint(tmp_path, monitor="loss", keep=3).close()
    after = settings.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert [name for name in os.listdir(tmp_path) if name.endswith(".tmp")] == []


def test_unfinished_saves_are_removed_and_keep_holds_at_start(tmp_path, caplog):
    ckpt = ciclo.checkpoint(tmp_path, keep=None)
    for step in (10, 20, 30):
        ckpt.save(step, {"w": jnp.float32(step)})
    ckpt.close()
    # What a run killed mid-save and before orbax's cleanup leaves: a tmp directory and one step too many.
    (tmp_path / "40.orbax-checkpoint-tmp-1234").mkdir()
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        resumed = ciclo.checkpoint(tmp_path, keep=2, resume=True)
    assert committed_steps(tmp_path) == resumed.all_steps() == [20, 30]
    assert any("keep=2" in record.getMessage() for record in caplog.records)
    assert any("unfinished save" in record.getMessage() for record in caplog.records)
    # orbax's own cleanup removes the tmp directory; a save waits for it.
    resumed.save(50, {"w": jnp.float32(50)})
    resumed.wait()
    assert not [name for name in os.listdir(tmp_path) if "tmp" in name]
    assert committed_steps(tmp_path) == [30, 50]
    resumed.close()


def test_keep_at_start_drops_the_worst_with_a_monitor(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, keep=None, monitor="accuracy")
    monitored_run(ckpt, [0.7, 0.9, 0.6, 0.8], key="accuracy")
    ckpt.close()
    resumed = ciclo.checkpoint(tmp_path, keep=2, monitor="accuracy")
    assert resumed.all_steps() == [1, 3] and resumed.best_step() == 1
    resumed.close()


def test_another_runs_directory_is_refused_unless_resumed_or_overwritten(tmp_path):
    first = ciclo.checkpoint(tmp_path, keep=None)
    first.save(5, {"w": jnp.float32(5)})
    first.close()

    stranger = ciclo.checkpoint(tmp_path, keep=None)
    with pytest.raises(FileExistsError, match=r"another run \(steps \[5\]\).*overwrite=True"):
        stranger.save(3, {"w": jnp.float32(-1)})
    assert committed_steps(tmp_path) == [5]
    stranger.close()

    # Restoring through the module function says nothing about who saves next: resuming is explicit.
    ciclo.restore_checkpoint(tmp_path, zero())
    with pytest.raises(FileExistsError, match="resume=True"):
        ciclo.checkpoint(tmp_path, keep=None).save(6, {"w": jnp.float32(6)})
    resumer = ciclo.checkpoint(tmp_path, keep=None, resume=True)
    resumer.save(6, {"w": jnp.float32(6)})
    assert resumer.all_steps() == [5, 6]
    resumer.close()

    fresh = ciclo.checkpoint(tmp_path, keep=None, overwrite=True)
    assert committed_steps(tmp_path) == []
    fresh.save(1, {"w": jnp.float32(1)})
    assert fresh.all_steps() == [1]
    fresh.close()


def test_another_runs_directory_is_refused_before_the_first_step(tmp_path):
    first = ciclo.checkpoint(tmp_path, keep=None)
    first.save(5, {"w": jnp.float32(5)})
    first.close()
    steps = []

    def step(state, elapsed):
        steps.append(elapsed.steps)
        return None, state

    ckpt = ciclo.checkpoint(tmp_path, keep=None)
    with pytest.raises(FileExistsError, match=r"another run \(steps \[5\]\)"):
        ciclo.train_loop(zero(), range(10), {ciclo.on_train_step: step}, callbacks=[ckpt], epoch_duration=5)
    assert steps == []  # refused before any compute was spent
    ckpt.close()

    ckpt = ciclo.checkpoint(tmp_path, keep=None, resume=True)
    ciclo.train_loop(zero(), range(10), {ciclo.on_train_step: step}, callbacks=[ckpt], epoch_duration=5)
    assert ckpt.all_steps() == [5, 10]  # step 5 was the earlier run's: skipped, not rewritten
    ckpt.close()
    with pytest.raises(ValueError, match="not both"):
        ciclo.checkpoint(tmp_path, resume=True, overwrite=True)


def test_a_finished_run_with_a_checkpoint_run_again_returns_at_once(tmp_path):
    """docs/resume.md: a finished script run again returns at once, its checkpoint callback included."""
    calls = []

    def step(state, batch):
        calls.append(batch)
        return add_batch(state, batch)

    def run():
        ckpt = ciclo.checkpoint(tmp_path / "ckpt", keep=None)
        try:
            return ciclo.train_loop(
                zero(),
                range(100),
                {ciclo.on_train_step: step},
                callbacks=[ckpt],
                epoch_duration=4,
                stop=8,
                backup=tmp_path / "backup",
            )
        finally:
            ckpt.close()

    first = run()
    second = run()
    assert len(calls) == 8 and float(second[0]["w"]) == float(first[0]["w"]) == 28.0
    assert committed_steps(tmp_path / "ckpt") == [4, 8]


def test_restoring_into_another_structure_names_the_leaves(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path)
    ckpt.save(1, {"params": {"w": jnp.zeros((4, 3)), "b": jnp.zeros(3)}, "step": jnp.int32(1)})
    ckpt.wait()
    target = {"params": {"w": jnp.zeros((4, 5)), "b": jnp.zeros(3)}, "count": jnp.int32(0)}
    for restore in (ckpt.restore, lambda t: ciclo.restore_checkpoint(tmp_path, t)):
        with pytest.raises(ValueError) as info:
            restore(target)
        message = str(info.value)
        assert (
            "\n  params/w: the checkpoint holds shape (4, 3) float32, the target has shape (4, 5) float32"
            in (message)
        )
        assert "\n  count: in the target ((), int32) but not in the checkpoint" in message
        assert "\n  step: in the checkpoint ((), int32) but not in the target" in message
        assert "strict" not in message and "partial_restore" not in message
    ckpt.close()


SIGINT_CHILD = """
import os, sys, threading, time
import jax.numpy as jnp
import ciclo

directory, gate = sys.argv[1], sys.argv[2]
main = threading.main_thread().ident

def inside_orbax_save(step):
    frame = sys._current_frames().get(main)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "save" and code.co_filename.endswith("checkpoint_manager.py"):
            return frame.f_locals.get("step") == step
        frame = frame.f_back
    return False

def watch():
    # Tells the parent when the main thread is inside orbax's save of step 30 (an 80 MB state: it
    # stays there for a while), and waits until the SIGINT is sent.
    while not inside_orbax_save(30):
        time.sleep(0.0005)
    open(os.path.join(gate, "saving"), "w").close()
    while not os.path.exists(os.path.join(gate, "sent")):
        time.sleep(0.001)

threading.Thread(target=watch, daemon=True).start()

def train_step(state, batch):
    return None, {"w": state["w"] + batch}

ckpt = ciclo.checkpoint(directory, keep=2)
state, _, elapsed = ciclo.loop(
    {"w": jnp.zeros((20_000_000,), jnp.float32)},
    range(100),
    {ciclo.every(1): [train_step], ciclo.after(9).every(10): [ckpt]},
    catch_keyboard_interrupt=CATCH,
)
print("steps", ckpt.all_steps(), "stopped at", elapsed.steps, flush=True)
"""


@pytest.mark.parametrize("catch", [True, False])
def test_ctrl_c_during_a_save_loses_no_checkpoint(tmp_path, catch):
    from support import zygote
    from support.processes import clean_env

    directory, gate = tmp_path / "ckpt", tmp_path / "gate"
    gate.mkdir()
    script = tmp_path / "child.py"
    script.write_text(SIGINT_CHILD.replace("CATCH", str(catch)))
    child = zygote.popen(
        [sys.executable, str(script), str(directory), str(gate)],
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not (gate / "saving").exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the child never started the save of step 30"
            time.sleep(0.001)
        child.send_signal(signal.SIGINT)
        (gate / "sent").touch()
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # The save of step 30 was finished (held Ctrl-C), and the older ones were not lost.
    assert committed_steps(directory) == [20, 30], (out, err)
    assert not [name for name in os.listdir(directory) if "tmp" in name]
    assert "cannot schedule new futures" not in err
    if catch:
        assert child.returncode == 0 and out.split()[:3] == ["steps", "[20,", "30]"], (out, err)
    else:
        assert child.returncode != 0 and "KeyboardInterrupt" in err
    restored = ciclo.restore_checkpoint(directory, {"w": jnp.zeros((20_000_000,), jnp.float32)})
    assert float(restored["w"][0]) == sum(range(30))


def test_a_checkpoint_in_on_end_is_numbered_by_the_steps_done(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path, async_save=False)
    ciclo.loop(0, range(10), {ciclo.every(1): lambda s, b: (None, s + 1)}, stop=5, on_end=[ckpt])
    assert ckpt.all_steps() == [5]
    assert ciclo.restore_checkpoint(tmp_path, 0) == 5


def test_a_state_holding_nan_behind_a_finite_loss_is_not_kept(tmp_path):
    # The RMSE of an all-zero batch: sqrt(0) has a finite value and a NaN gradient, so the step's loss
    # is finite while the updated state is NaN. keep=1 must still hold the last finite state.
    def step(state, batch):
        w = state["w"] + (jnp.float32(jnp.nan) if batch == 3 else jnp.float32(1))
        return ciclo.logs().add_loss("loss", jnp.float32(0.5)), {"w": w}

    ckpt = ciclo.checkpoint(tmp_path, keep=1)
    state, _, _ = ciclo.loop(zero(), range(5), {ciclo.every(1): [step, ckpt]})
    assert np.isnan(state["w"])
    ckpt.wait()
    assert ckpt.all_steps() == [3]
    assert float(ciclo.restore_checkpoint(tmp_path, zero())["w"]) == 3.0
    ckpt.close()


@pytest.mark.parametrize("open_it", ["overwrite", "restore"])
def test_a_link_in_a_checkpoint_directory_is_refused_and_nothing_outside_is_touched(tmp_path, open_it):
    outside = tmp_path / "data"
    outside.mkdir()
    (outside / "weights.npy").write_text("precious")
    directory = tmp_path / "ckpt"
    ckpt = ciclo.checkpoint(directory, keep=None)
    ckpt.save(1, {"w": jnp.zeros(2)})
    ckpt.close()
    (directory / "7").symlink_to(outside)  # a step-like name: `overwrite=True` would remove it
    with pytest.raises(ciclo.types.LinkError, match=rf"holds {directory / '7'}, a symbolic link"):
        if open_it == "overwrite":
            ciclo.checkpoint(directory, keep=None, overwrite=True)
        else:
            ciclo.restore_checkpoint(directory, {"w": jnp.zeros(2)})
    assert [p.read_text() for p in outside.iterdir()] == ["precious"]


# --- after training: partial restore, the report, the EMA weights, the strict error's options ---------


@dataclasses.dataclass(frozen=True, eq=False)
class TwoLayers:
    """A ModelAdapter: relu(x @ backbone) @ head, with `classes` outputs."""

    classes: int = 3

    def init(self, key, inputs):
        k1, k2 = jax.random.split(key)
        return {
            "backbone": {"w": jax.random.normal(k1, (inputs.shape[-1], 8))},
            "head": {"w": jax.random.normal(k2, (8, self.classes))},
        }, None

    def apply(self, params, model_state, inputs, *, key, training):
        return jax.nn.relu(inputs @ params["backbone"]["w"]) @ params["head"]["w"], model_state


INPUTS = np.random.RandomState(0).randn(8, 4).astype(np.float32)
LABELS = (INPUTS[:, 0] > 0).astype(np.int32)


def accuracy(preds, target):
    return preds.argmax(-1) == target


TRAINING = {
    "tx": optax.adam(1e-2),
    "losses": optax.softmax_cross_entropy_with_integer_labels,
    "metrics": {"accuracy": accuracy},
    "precision": "16-mixed",
    "ema_decay": 0.5,
}


def model_state(adapter=None, **settings):
    return ciclo.create_model_state(adapter or TwoLayers(), inputs=INPUTS[:1], **settings)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A state trained with metrics, loss scaling and an EMA, and its checkpoint directory."""
    directory = tmp_path_factory.mktemp("trained")
    state = model_state(**TRAINING)
    state, _, _ = ciclo.train_loop(
        state, [(INPUTS, LABELS)] * 4, callbacks=[ciclo.checkpoint(directory)], epoch_duration=4
    )
    return state, directory


def preds(state):
    return np.asarray(state.predict_step(INPUTS)[0].outputs.preds)


def test_partial_restore_into_a_state_for_inference_reports_what_it_did(trained, caplog):
    state, directory = trained
    caplog.set_level(logging.WARNING, logger="ciclo.resume")
    restored, report = ciclo.restore_checkpoint(directory, model_state(), partial=True, report=True)
    np.testing.assert_array_equal(preds(restored), preds(state.replace(options=model_state().options)))
    assert isinstance(report, ciclo.types.RestoreReport) and report.step == 4
    assert set(report.restored) == {"params/backbone/w", "params/head/w", "step", "key"}
    assert report.kept == ()
    unused = " ".join(report.unused)
    assert "opt_state/" in unused and "/ema_params/" in unused and "metrics/" in unused
    assert "/loss_scale/" in unused
    (line,) = [r.getMessage() for r in caplog.records if r.name == "ciclo.resume"]
    assert line.endswith(
        f"restored 4 leaves, kept 0 from the target, {len(report.unused)} of the checkpoint unused"
    )


def test_params_from_ema_params_restores_the_ema_weights_as_the_parameters(trained):
    state, directory = trained
    restored = ciclo.restore_checkpoint(directory, model_state(), partial=True, params_from="ema_params")
    expected = state.with_ema_params().replace(options=model_state().options)
    np.testing.assert_array_equal(preds(restored), preds(expected))
    assert not np.array_equal(preds(restored), preds(state.replace(options=model_state().options)))
    with pytest.raises(ValueError, match="pass partial=True too"):
        ciclo.restore_checkpoint(directory, model_state(), params_from="ema_params")
    with pytest.raises(ValueError, match="holds no norms"):
        ciclo.restore_checkpoint(directory, model_state(), partial=True, params_from="norms")


def restore_with(how, directory, target, **options):
    """`ciclo.restore_checkpoint(directory, ...)`, or the `restore` of a `Checkpoint` on `directory`."""
    if how == "restore_checkpoint":
        return ciclo.restore_checkpoint(directory, target, **options)
    ckpt = ciclo.checkpoint(directory, keep=None)
    try:
        return ckpt.restore(target, **options)
    finally:
        ckpt.close()


@pytest.mark.parametrize("how", ["restore_checkpoint", "Checkpoint.restore"])
def test_the_function_and_the_method_take_the_same_keywords(trained, how):
    state, directory = trained
    restored, report = restore_with(
        how, directory, model_state(), step=4, partial=True, params_from="ema_params", report=True
    )
    expected = state.with_ema_params().replace(options=model_state().options)
    np.testing.assert_array_equal(preds(restored), preds(expected))
    assert report.step == 4 and report.params_from == "ema_params" and report.kept == ()
    assert "params/head/w" in report.unused  # the EMA weights were read instead
    strict = restore_with(how, directory, model_state(**TRAINING), step="latest")
    np.testing.assert_array_equal(strict.params["head"]["w"], state.params["head"]["w"])
    with pytest.raises(ValueError, match="pass partial=True too"):
        restore_with(how, directory, model_state(), params_from="ema_params")
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) \['stpe'\].*RestoreOptions"):
        restore_with(how, directory, model_state(), stpe=4)
    with pytest.raises(TypeError, match="partial must be True or False"):
        restore_with(how, directory, model_state(), partial="yes")


def test_fine_tuning_restores_the_backbone_keeps_the_new_head_and_trains_on(trained):
    state, directory = trained
    target = model_state(TwoLayers(classes=5), tx=optax.sgd(0.1), losses=TRAINING["losses"])
    restored, report = ciclo.restore_checkpoint(directory, target, partial=True, report=True)
    np.testing.assert_array_equal(restored.params["backbone"]["w"], state.params["backbone"]["w"])
    np.testing.assert_array_equal(restored.params["head"]["w"], target.params["head"]["w"])
    kept = dict(report.kept)
    assert kept["params/head/w"] == "other shape: the checkpoint's (8, 3), the target's (8, 5)"
    assert "opt_state" not in " ".join(report.restored)  # sgd keeps no state; adam's goes unused
    assert "params/head/w" in report.unused
    assert "kept params/head/w: other shape" in str(report)
    for _ in range(2):
        logs, restored = restored.train_step((INPUTS, LABELS % 5))
    assert int(restored.step) == int(state.step) + 2 and np.isfinite(float(logs.losses.loss))


def test_partial_restore_casts_a_floating_leaf_keeps_another_dtype_and_restores_onto_the_sharding(trained):
    """docs/resume.md: a restore casts to the target's dtypes; partial=True casts floats and says so."""
    state, directory = trained
    target = model_state(strategy="data_parallel")
    target = target.replace(
        params={**target.params, "head": {"w": target.params["head"]["w"].astype(jnp.bfloat16)}},
        step=target.step.astype(jnp.int16),
    )
    restored, report = ciclo.restore_checkpoint(directory, target, partial=True, report=True)
    assert report.cast == (("params/head/w", "float32 to bfloat16"),)
    assert dict(report.kept) == {"step": "other dtype: the checkpoint's int32, the target's int16"}
    assert "params/head/w" in report.restored and "(1 cast to the target's dtype)" in report.summary()
    assert "cast params/head/w: float32 to bfloat16" in str(report)
    assert restored.params["head"]["w"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        restored.params["head"]["w"], state.params["head"]["w"].astype(jnp.bfloat16)
    )
    assert restored.params["backbone"]["w"].sharding == target.params["backbone"]["w"].sharding
    assert restored.step is target.step


def test_a_strict_restore_reports_the_leaves_it_casts(trained):
    """docs/resume.md: a strict restore casts every leaf to the target's dtype, listed in report.cast."""
    state, directory = trained
    target = model_state(**TRAINING)
    target = target.replace(
        params={**target.params, "head": {"w": target.params["head"]["w"].astype(jnp.bfloat16)}},
        step=target.step.astype(jnp.int16),
    )
    restored, report = ciclo.restore_checkpoint(directory, target, report=True)
    assert dict(report.cast) == {"params/head/w": "float32 to bfloat16", "step": "int32 to int16"}
    assert report.kept == report.unused == () and "params/head/w" in report.restored
    assert "(2 cast to the target's dtype)" in report.summary()
    assert restored.params["head"]["w"].dtype == jnp.bfloat16 and restored.step.dtype == jnp.int16
    assert int(restored.step) == int(state.step)


@pytest.mark.parametrize(
    ("differs", "option"),
    [
        ({"metrics": None}, "metrics="),
        ({"precision": "32"}, "precision="),
        ({"accumulate_steps": 2}, "accumulate_steps="),
        ({"ema_decay": None}, "ema_decay="),
        ({"tx": optax.sgd(0.1)}, "tx="),
    ],
)
def test_the_strict_error_names_the_option_that_differs(trained, differs, option):
    _, directory = trained
    with pytest.raises(ValueError, match="does not match the target state") as error:
        ciclo.restore_checkpoint(directory, model_state(**{**TRAINING, **differs}))
    message = str(error.value)
    assert f"the states differ in {option}" in message and "partial=True" in message
    assert len(message) <= 2000


def test_the_strict_error_summarises_many_leaves_under_2000_characters(tmp_path):
    many = {f"layer_{i:03d}": jnp.zeros(2) for i in range(300)}
    ckpt = ciclo.checkpoint(tmp_path)
    ckpt.save(1, {"params": many, "opt_state": many})
    ckpt.close()
    with pytest.raises(ValueError, match=r"\(900 difference\(s\)\)") as error:
        ciclo.restore_checkpoint(tmp_path, {"weights": many})
    assert len(str(error.value)) <= 2000
    assert "the states differ in tx=" in str(error.value)


# --- damaged checkpoints, a backup given as one, "best" without its monitor -------------------------


def three_steps(directory, monitor=None):
    """Steps 1, 2, 3 of {"w": arange(1000) * step, "b": ones(3)}, with `monitor` logged as step / 10."""
    ckpt = ciclo.checkpoint(directory, keep=None, monitor=monitor)
    for step in (1, 2, 3):
        logs = ciclo.logs().add_metric(monitor or "accuracy", step / 10)
        ckpt.save(step, {"w": jnp.arange(1000, dtype=jnp.float32) * step, "b": jnp.ones(3)}, logs)
    ckpt.close()


def cut_the_arrays(step_directory):
    """Truncates every data file orbax wrote for the arrays of one step."""
    for path in step_directory.glob("default/ocdbt.process_0/d/*"):
        with open(path, "r+b") as file:
            file.truncate(10)


def flip_the_manifest(step_directory):
    """Flips the first bytes of the manifest of orbax's database of one step's arrays."""
    path = step_directory / "default" / "manifest.ocdbt"
    data = path.read_bytes()
    path.write_bytes(bytes(byte ^ 0xFF for byte in data[:16]) + data[16:])


TARGET = {"w": jnp.zeros(1000), "b": jnp.zeros(3)}


# orbax's read of the arrays left after one failed raises again in a coroutine no one awaits any more
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize(
    "damage",
    [cut_the_arrays, flip_the_manifest, lambda step: (step / "default" / "manifest.ocdbt").unlink()],
    ids=["array data cut", "manifest flipped", "manifest deleted"],
)
def test_a_damaged_checkpoint_names_the_step_its_files_and_the_steps_that_open(tmp_path, damage, partial):
    three_steps(tmp_path)
    damage(tmp_path / "3")
    with pytest.raises(ValueError) as error:
        ciclo.restore_checkpoint(tmp_path, TARGET, partial=partial)
    message = str(error.value)
    assert message.startswith(f"the checkpoint of step 3 in {tmp_path} is damaged: {tmp_path / '3'} ")
    assert message.endswith("restore another step with step=N: the files of steps [1, 2] open")
    assert len(message) < 2000 and "tensorstore_spec" not in message
    restored = ciclo.restore_checkpoint(tmp_path, TARGET, step=2)  # an intact step still restores
    np.testing.assert_array_equal(restored["w"], np.arange(1000, dtype=np.float32) * 2)


def test_a_damaged_record_of_the_metrics_names_its_step_and_blocks_only_best(tmp_path):
    three_steps(tmp_path, monitor="accuracy")
    (tmp_path / "2" / "metrics" / "metrics").write_text("{not json")
    with pytest.raises(ValueError) as error:
        ciclo.restore_checkpoint(tmp_path, TARGET, step="best")
    message = str(error.value)
    assert message.startswith(f"the checkpoint of step 2 in {tmp_path} is damaged: {tmp_path / '2'} ")
    assert "metrics/metrics" in message and "not JSON" in message
    assert message.endswith("restore another step with step=N: the files of steps [1, 3] open")
    for step, factor in (("latest", 3), (1, 1), (2, 2)):  # the arrays are intact: those restores read them
        restored = ciclo.restore_checkpoint(tmp_path, TARGET, step=step)
        np.testing.assert_array_equal(restored["w"], np.arange(1000, dtype=np.float32) * factor)


def test_a_strict_restore_without_the_tree_metadata_reports_every_leaf_restored(tmp_path):
    three_steps(tmp_path)
    (tmp_path / "3" / "default" / "_METADATA").unlink()  # orbax reads the arrays without it
    restored, report = ciclo.restore_checkpoint(tmp_path, TARGET, report=True)
    assert sorted(report.restored) == ["b", "w"] and report.kept == report.unused == report.cast == ()
    assert float(restored["w"][1]) == 3.0


def test_an_empty_step_directory_is_skipped_with_a_warning(tmp_path, caplog):
    three_steps(tmp_path)
    (tmp_path / "4").mkdir()  # a save cut before it wrote anything
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        restored = ciclo.restore_checkpoint(tmp_path, TARGET)
    assert float(restored["w"][1]) == 3.0
    assert f"skipping the empty checkpoint directories of steps [4] in {tmp_path}" in caplog.text
    with pytest.raises(FileNotFoundError, match=r"no checkpoint for step 4 .*steps present: \[1, 2, 3\]"):
        ciclo.restore_checkpoint(tmp_path, TARGET, step=4)


def test_a_backup_directory_given_to_restore_checkpoint_says_how_to_resume_it(tmp_path):
    ciclo.loop(zero(), range(4), {ciclo.every(1): add_batch}, stop=2, backup=tmp_path)
    with pytest.raises(
        ValueError, match=r"is a ciclo\.backup directory.*run the same loop again with backup="
    ):
        ciclo.restore_checkpoint(tmp_path, zero())


@pytest.mark.parametrize(
    ("damage", "without"),
    [
        (lambda directory: os.remove(directory / SETTINGS_FILE), "[1, 2, 3]"),  # saved without a monitor
        (lambda directory: (directory / "2" / "metrics" / "metrics").write_text("[1]"), "[2]"),
        (lambda directory: (directory / "2" / "metrics" / "metrics").unlink(), "[2]"),
    ],
    ids=["never logged", "record unreadable", "record deleted"],
)
def test_best_without_a_value_of_the_monitor_is_refused_naming_the_steps_that_have_it(
    tmp_path, damage, without
):
    three_steps(tmp_path, monitor=None if without == "[1, 2, 3]" else "accuracy")
    damage(tmp_path)
    ciclo.checkpoint(tmp_path, keep=None, monitor="accuracy").close()  # records the monitor
    have = "[]" if without == "[1, 2, 3]" else "[1, 3]"
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"by 'accuracy', but steps {without} hold no readable value of it (steps that do: {have})"
        ),
    ) as error:
        ciclo.restore_checkpoint(tmp_path, TARGET, step="best")
    assert "step='latest'" in str(error.value)
