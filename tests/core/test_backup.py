"""ciclo.backup: a loop that is stopped and started again equals one that never stopped."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support import processes, zygote
from support.training import LinearClassifier

import ciclo


class Crash(Exception):
    pass


def crash_at(step: int):
    def callback(state, batch, elapsed):
        if elapsed.steps == step:
            raise Crash(f"killed at step {step}")

    return callback


@jax.jit
def sgd_step(params, batch):
    x, y = batch

    def loss_fn(p):
        return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    return ciclo.logs().add_loss("loss", loss).add_metric("w0", params["w"][0, 0]), params


def batches(n=40):
    rng = np.random.default_rng(0)
    for _ in range(n):
        x = rng.normal(size=(8, 3)).astype(np.float32)
        yield x, x.sum(axis=1, keepdims=True).astype(np.float32)


def init():
    return {"w": jnp.zeros((3, 1)), "b": jnp.zeros((1, 1))}


def run(directory, *extra, stop=30, every=5, dataset=None):
    return ciclo.loop(
        init(),
        batches() if dataset is None else dataset,
        {ciclo.every(1): [sgd_step, *extra]},
        stop=stop,
        backup=ciclo.backup(directory, every=every),
    )


def assert_same_run(a, b):
    state_a, history_a, elapsed_a = a
    state_b, history_b, elapsed_b = b
    for x, y in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # bitwise
    assert history_a.collect("steps", "loss", "w0") == history_b.collect("steps", "loss", "w0")
    assert (elapsed_a.steps, elapsed_a.samples) == (elapsed_b.steps, elapsed_b.samples)


@pytest.mark.parametrize("crash_step", [3, 5, 13, 29])
def test_a_crashed_run_resumes_to_the_same_result(tmp_path, crash_step):
    reference = ciclo.loop(init(), batches(), {ciclo.every(1): sgd_step}, stop=30)
    with pytest.raises(Crash):
        run(tmp_path / "b", crash_at(crash_step))
    resumed = run(tmp_path / "b")
    assert_same_run(reference, resumed)


def test_a_finished_run_returns_its_results_at_once(tmp_path):
    first = run(tmp_path)
    calls = []

    def count(state, batch):
        calls.append(batch)

    again = run(tmp_path, count)
    assert calls == []
    assert_same_run(first, again)


def test_backups_are_numbered_by_completed_steps_and_rotated(tmp_path):
    with pytest.raises(Crash):
        run(tmp_path, crash_at(23), every=5)
    steps = sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit())
    assert steps == [15, 20]  # keep=2; step 20 holds the state after 20 updates


class CountingIterator:
    """An iterator with grain's get_state / set_state."""

    def __init__(self):
        self.position = 0
        self.draws = 0

    def __iter__(self):
        return self

    def __next__(self):
        self.position += 1
        self.draws += 1
        return np.float32(self.position)

    def get_state(self):
        return {"position": self.position}

    def set_state(self, state):
        self.position = state["position"]


def add(state, batch):
    return ciclo.logs().add_metric("batch", batch), state + batch


def test_an_iterator_with_get_state_is_positioned_by_its_state(tmp_path):
    spec = ciclo.backup(tmp_path, every=4)
    with pytest.raises(Crash):
        ciclo.loop(
            jnp.float32(0), CountingIterator(), {ciclo.every(1): [add, crash_at(9)]}, stop=12, backup=spec
        )
    iterator = CountingIterator()
    state, history, _ = ciclo.loop(jnp.float32(0), iterator, {ciclo.every(1): add}, stop=12, backup=spec)
    assert iterator.draws == 4  # set_state moved it to batch 8: no batch was drawn to skip
    assert history.collect("batch") == [float(i) for i in range(1, 13)]
    assert float(state) == sum(range(1, 13))


def test_any_other_dataset_is_iterated_again_skipping_the_used_batches(tmp_path):
    spec = ciclo.backup(tmp_path, every=4)
    with pytest.raises(Crash):
        ciclo.loop(
            jnp.float32(0),
            np.arange(1, 20, dtype=np.float32),
            {ciclo.every(1): [add, crash_at(9)]},
            stop=12,
            backup=spec,
        )
    state, history, _ = ciclo.loop(
        jnp.float32(0), np.arange(1, 20, dtype=np.float32), {ciclo.every(1): add}, stop=12, backup=spec
    )
    assert history.collect("batch") == [float(i) for i in range(1, 13)]


def test_a_partly_consumed_generator_is_refused(tmp_path):
    spec = ciclo.backup(tmp_path, every=2)
    with pytest.raises(Crash):
        ciclo.loop(0, (i for i in range(10)), {ciclo.every(1): [add, crash_at(3)]}, backup=spec)
    generator = (i for i in range(10))
    next(generator)
    with pytest.raises(ValueError, match="partly consumed"):
        ciclo.loop(0, generator, {ciclo.every(1): add}, backup=spec)


def test_a_dataset_shorter_than_the_backed_up_position_is_refused(tmp_path):
    spec = ciclo.backup(tmp_path, every=2)
    with pytest.raises(Crash):
        ciclo.loop(0, range(10), {ciclo.every(1): [add, crash_at(5)]}, backup=spec)
    with pytest.raises(ValueError, match="ended after 2 batches"):
        ciclo.loop(0, range(2), {ciclo.every(1): add}, backup=spec)


def test_a_directory_with_other_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds no ciclo backup"):
        ciclo.loop(0, range(3), {ciclo.every(1): add}, backup=tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_backup_of_another_model_names_the_leaf(tmp_path):
    with pytest.raises(Crash):
        run(tmp_path, crash_at(7))
    other = {"w": jnp.zeros((4, 1)), "b": jnp.zeros((1, 1))}
    with pytest.raises(ValueError, match=r"\n  w: .*\(3, 1\).*\(4, 1\)"):
        ciclo.loop(
            other, batches(), {ciclo.every(1): sgd_step}, stop=30, backup=ciclo.backup(tmp_path, every=5)
        )


def test_a_backup_of_another_dtype_is_refused_naming_the_leaf_and_both_dtypes(tmp_path):
    # orbax would cast the float32 backup into the bfloat16 target: the result equals neither run.
    with pytest.raises(Crash):
        run(tmp_path, crash_at(7))
    steps = _steps(tmp_path)
    other = {"w": jnp.zeros((3, 1), jnp.bfloat16), "b": jnp.zeros((1, 1))}
    with pytest.raises(
        ValueError,
        match=r"\n  w: the backup holds dtype float32 \(shape \(3, 1\)\), the target has dtype bfloat16",
    ) as refused:
        ciclo.loop(
            other, batches(), {ciclo.every(1): sgd_step}, stop=30, backup=ciclo.backup(tmp_path, every=5)
        )
    assert "\n  b: " not in str(refused.value)  # only the leaf that differs
    assert _steps(tmp_path) == steps  # nothing deleted: the run resumes with its own dtypes
    assert_same_run(run(tmp_path), ciclo.loop(init(), batches(), {ciclo.every(1): sgd_step}, stop=30))


def test_callback_states_are_restored(tmp_path):
    # early stopping counts its patience across the restart: it stops where the uninterrupted run did
    def worse_after_4(state, batch, elapsed):
        return ciclo.logs().add_loss("loss", float(abs(elapsed.steps - 4))), state

    def make_run(*extra, backup=None):
        return ciclo.loop(
            0,
            range(100),
            {ciclo.every(1): [worse_after_4, ciclo.early_stopping("loss", patience=5), *extra]},
            backup=backup,
        )

    _, _, reference = make_run()
    spec = ciclo.backup(tmp_path, every=1)
    with pytest.raises(Crash):
        make_run(crash_at(7), backup=spec)
    _, _, elapsed = make_run(backup=spec)
    assert elapsed.steps == reference.steps == 11  # best at step 4, then 5 steps without improvement


def _worse_after_4(state, batch, elapsed):
    return ciclo.logs().add_loss("loss", float(abs(elapsed.steps - 4))), state


class Counter:
    """A user's stateful callback, keyed by its class's name."""

    def __init__(self):
        self.calls = 0

    def __call__(self, state):
        self.calls += 1

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = int(state["calls"])


@pytest.mark.parametrize("edit", ["logger_added_before", "reordered"])
def test_callback_states_are_found_by_key_after_the_loop_is_edited(tmp_path, edit, caplog):
    # Keyed by position ("0:EarlyStopping"), either edit made the resume raise KeyError.
    spec = ciclo.backup(tmp_path / "backup", every=1)

    def make_run(callbacks):
        return ciclo.loop(0, range(100), {ciclo.every(1): [_worse_after_4, *callbacks]}, backup=spec)

    counter = Counter()
    with pytest.raises(Crash):
        make_run([ciclo.early_stopping("loss", patience=5), counter, crash_at(7)])
    stopper, counter = ciclo.early_stopping("loss", patience=5), Counter()
    if edit == "logger_added_before":
        logger = ciclo.csv_logger(tmp_path / "logs")
        callbacks = [logger, stopper, counter]
    else:
        callbacks = [counter, stopper]
    with caplog.at_level("WARNING", logger="ciclo"):
        _, _, elapsed = make_run(callbacks)
    assert elapsed.steps == 11  # the early stopping's best (step 4) and patience came back
    # 7 calls before the crash (steps 0-6), then steps 7-10; at step 10 the early stopping ends the
    # loop before a callback after it runs.
    assert counter.calls == (11 if callbacks.index(counter) < callbacks.index(stopper) else 10)
    if edit == "logger_added_before":
        assert "has no saved state: it starts afresh" in caplog.text
        assert logger.state_key in caplog.text


def test_a_callback_state_no_callback_claims_is_dropped_with_a_warning(tmp_path, caplog):
    spec = ciclo.backup(tmp_path, every=1)
    with pytest.raises(Crash):
        ciclo.loop(0, range(10), {ciclo.every(1): [Counter(), crash_at(3)]}, backup=spec)
    with caplog.at_level("WARNING", logger="ciclo"):
        _, _, elapsed = ciclo.loop(0, range(10), {ciclo.every(1): [lambda state: state]}, backup=spec)
    assert elapsed.steps == 10
    assert "dropping the saved state of callback 'Counter'" in caplog.text


def test_two_callbacks_with_one_state_key_are_refused_before_the_first_step():
    ran = []
    with pytest.raises(ValueError, match=r"under the key 'EarlyStopping\(loss, min\)'.*another name="):
        ciclo.loop(
            0,
            range(3),
            {
                ciclo.every(1): [
                    lambda state: ran.append(1),
                    ciclo.early_stopping("loss", patience=1),
                    ciclo.early_stopping("loss", patience=3),
                ]
            },
        )
    assert ran == []
    # name= tells them apart
    ciclo.loop(
        0,
        range(3),
        {
            ciclo.every(1): [
                _worse_after_4,
                ciclo.early_stopping("loss", patience=1),
                ciclo.early_stopping("loss", patience=3, name="patient"),
            ]
        },
    )


def test_sigterm_saves_a_backup_and_raises_preempted(tmp_path):
    def preempt(state, batch, elapsed):
        if elapsed.steps == 11:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(ciclo.types.Preempted) as caught:
        run(tmp_path, preempt, every=100)
    assert caught.value.code == 143
    assert caught.value.steps == 12  # the step in flight finished
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    reference = ciclo.loop(init(), batches(), {ciclo.every(1): sgd_step}, stop=30)
    assert_same_run(reference, run(tmp_path, every=100))


def test_ctrl_c_finishes_the_step_and_returns_a_consistent_result():
    seen = []

    def interrupt(state, batch, elapsed):
        seen.append(elapsed.steps)
        if elapsed.steps == 5:
            os.kill(os.getpid(), signal.SIGINT)
        return ciclo.logs().add_metric("step", elapsed.steps), state + 1

    state, history, elapsed = ciclo.loop(0, range(100), {ciclo.every(1): interrupt})
    assert state == elapsed.steps == len(history) == 6
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_with_sigint_backup_saves_and_resumes(tmp_path):
    def interrupt(state, batch, elapsed):
        if elapsed.steps == 6:
            os.kill(os.getpid(), signal.SIGINT)

    spec = ciclo.backup(tmp_path, every=100, sigint=True)
    with pytest.raises(ciclo.types.Preempted) as caught:
        ciclo.loop(init(), batches(), {ciclo.every(1): [sgd_step, interrupt]}, stop=30, backup=spec)
    assert caught.value.code == 130
    reference = ciclo.loop(init(), batches(), {ciclo.every(1): sgd_step}, stop=30)
    assert_same_run(
        reference, ciclo.loop(init(), batches(), {ciclo.every(1): sgd_step}, stop=30, backup=spec)
    )


def test_a_second_ctrl_c_during_the_preemption_save_raises_whatever_catch_keyboard_interrupt_says(
    tmp_path, monkeypatch, capfd, caplog
):
    # The second Ctrl-C arrives while the backup of the first is being written: the loop must raise
    # KeyboardInterrupt (exit 130), not return as if it had finished (exit 0, and no requeue).
    import ciclo._src.resume.backup as backup_module

    def interrupt(state, batch, elapsed):
        if elapsed.steps == 6:
            os.kill(os.getpid(), signal.SIGINT)

    save = backup_module.BackupCallback._save

    def save_interrupted(self, *args, wait, **kwargs):
        if wait:
            os.kill(os.getpid(), signal.SIGINT)
        return save(self, *args, wait=wait, **kwargs)

    monkeypatch.setattr(backup_module.BackupCallback, "_save", save_interrupted)
    spec = ciclo.backup(tmp_path, every=100, sigint=True)
    with pytest.raises(KeyboardInterrupt):
        ciclo.loop(
            init(),
            batches(),
            {ciclo.every(1): [sgd_step, interrupt]},
            stop=30,
            backup=spec,
            catch_keyboard_interrupt=True,
        )
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # Nothing of orbax's (its save threads, absl's logging) is printed over the user's Ctrl-C.
    printed = capfd.readouterr().err
    assert "Traceback" not in printed and "orbax" not in printed.lower(), printed
    logged = [
        r for r in caplog.records if r.name.startswith(("orbax", "absl")) and r.levelno >= logging.WARNING
    ]
    assert logged == [], [r.getMessage()[:200] for r in logged]


def test_train_loop_resumes_with_epochs_and_fused_groups(tmp_path):
    def train_step(state, batch):
        return ciclo.logs().add_loss("loss", state * 0.5 + batch), state + batch

    def test_step(state, batch):
        return ciclo.logs().add_metric("value", state + batch)

    def make(*extra, spe=1):
        tasks = {ciclo.on_train_step: [train_step], ciclo.on_test_step: [test_step]}
        if extra:
            tasks[ciclo.every(1)] = list(extra)
        return ciclo.train_loop(
            jnp.float32(0),
            np.arange(100, dtype=np.float32),
            tasks,
            test_dataset=lambda: np.arange(3, dtype=np.float32),
            epoch_duration=4,
            stop=20,
            backup=tmp_path / f"spe{spe}",
        )

    reference = ciclo.train_loop(
        jnp.float32(0),
        np.arange(100, dtype=np.float32),
        {ciclo.on_train_step: [train_step], ciclo.on_test_step: [test_step]},
        test_dataset=lambda: np.arange(3, dtype=np.float32),
        epoch_duration=4,
        stop=20,
    )
    with pytest.raises(Crash):
        make(crash_at(14))
    resumed = make()
    assert float(resumed[0]) == float(reference[0])
    assert resumed[1].collect("steps", "loss") == reference[1].collect("steps", "loss")
    assert resumed[1].collect("steps", "value_test") == reference[1].collect("steps", "value_test")


def test_history_can_be_bounded():
    history = ciclo.history(max_rows=10)
    for step in range(2000):
        history.append(step, step, 0.0, ciclo.logs().add_metric("x", float(step)))
    assert len(history) <= 10 + 3 * 128
    assert history.collect("steps")[-1] == 1999
    assert history.latest()["metrics"]["x"] == 1999.0
    assert history.dropped + len(history) == 2000


def test_a_bounded_history_still_feeds_every_row_to_a_logger(tmp_path):
    logger = ciclo.csv_logger(tmp_path / "log.csv")

    def step(state, batch):
        return ciclo.logs().add_metric("x", jnp.float32(batch)), state

    _, history, _ = ciclo.loop(
        0, range(1000), {ciclo.every(1): [step, logger]}, history=ciclo.history(max_rows=0)
    )
    assert history.dropped > 0
    rows = (tmp_path / "log.csv").read_text().splitlines()[1:]
    assert [float(row.split(",")[-1]) for row in rows] == [float(i) for i in range(1000)]


def test_a_marker_left_half_written_by_a_kill_is_not_another_run(tmp_path):
    (tmp_path / "ciclo_backup.json.tmp").write_text("")
    state, _, elapsed = ciclo.loop(0, range(3), {ciclo.every(1): add}, backup=tmp_path)
    assert (state, elapsed.steps) == (3, 3)


@pytest.mark.parametrize("process", [0, 1])
def test_a_marker_written_by_a_peer_while_this_process_looks_is_not_another_run(
    tmp_path, monkeypatch, process
):
    # Under several processes, process 0 writes the marker while process 1 checks the directory:
    # process 1 looks for the marker (not there yet), then lists the directory, which now holds it.
    import ciclo._src.resume.backup as backup_module

    (tmp_path / "ciclo_backup.json").write_text('{"format": 1}\n')
    looked = []

    def exists(path):
        looked.append(path)
        return False if path.endswith("ciclo_backup.json") else os.path.lexists(path)

    monkeypatch.setattr(backup_module.os.path, "exists", exists)
    monkeypatch.setattr(backup_module.jax, "process_index", lambda: process)
    backup_module.BackupCallback(
        tmp_path, kind="loop"
    )._check_marker()  # no FileExistsError: the marker is a ciclo backup's own file
    assert looked


def test_a_file_renamed_while_the_directory_is_checked_is_no_link(tmp_path, monkeypatch):
    # A peer process renames ciclo_backup.json.tmp to ciclo_backup.json (an atomic write) between
    # this process's listing of the directory and its look at each entry: the entry is gone, not a link.
    import ciclo._src.base.files as files

    (tmp_path / "ciclo_backup.json.tmp").write_text("{}")
    lstat = os.lstat

    def renamed_meanwhile(path):
        if str(path).endswith(".tmp"):
            os.replace(path, str(path)[: -len(".tmp")])
        return lstat(path)

    monkeypatch.setattr(files.os, "lstat", renamed_meanwhile)
    files.check_closed(str(tmp_path), "backup directory")
    assert sorted(os.listdir(tmp_path)) == ["ciclo_backup.json"]


def test_a_state_holding_a_typed_key_resumes_bit_for_bit(tmp_path):
    # jax.random.key(0) (JAX's recommended keys, and every nnx module's rng streams) is stored by orbax
    # as its raw uint32 data: the backup's structure check compares it as such.
    def step(state, batch):
        key, sub = jax.random.split(state["key"])
        return ciclo.logs(), {"key": key, "w": state["w"] + jax.random.normal(sub, (3,))}

    start = {"key": jax.random.key(0), "w": jnp.zeros(3)}
    expected, _, _ = ciclo.loop(start, range(6), {ciclo.every(1): step})
    with pytest.raises(Crash):
        ciclo.loop(
            start, range(6), {ciclo.every(1): [step, crash_at(4)]}, backup=ciclo.backup(tmp_path, every=2)
        )
    resumed, _, elapsed = ciclo.loop(
        start, range(6), {ciclo.every(1): step}, backup=ciclo.backup(tmp_path, every=2)
    )
    assert elapsed.steps == 6
    np.testing.assert_array_equal(jax.random.key_data(resumed["key"]), jax.random.key_data(expected["key"]))
    np.testing.assert_array_equal(resumed["w"], expected["w"])


def test_early_stopping_best_weights_of_an_optax_state_are_backed_up_and_restored(tmp_path):
    # The best state holds optax's closures in its static fields: the backup saves its arrays with
    # orbax, and the resumed run rebuilds it in the structure of its own state (no pickle).
    import optax

    state = ciclo.create_model_state(
        LinearClassifier(),
        inputs=jnp.zeros((1, 8)),
        tx=optax.adam(0.1),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
    )
    rng = np.random.default_rng(0)
    data = [
        (rng.normal(size=(4, 8)).astype(np.float32), rng.integers(0, 3, 4).astype(np.int32))
        for _ in range(12)
    ]

    def worse_after_3(state, batch, elapsed):
        return ciclo.logs().add_metric("score", float(abs(elapsed.steps - 3))), state

    def run(*extra, backup=None):
        stopper = ciclo.early_stopping("score", patience=3, mode="min", restore_best_weights=True)
        tasks = {
            ciclo.every(1): [lambda state, batch: state.train_step(batch), worse_after_3, stopper, *extra]
        }
        return ciclo.loop(state, data, tasks, backup=backup)

    reference, _, reference_elapsed = run()
    spec = ciclo.backup(tmp_path, every=1)
    with pytest.raises(Crash):
        run(crash_at(5), backup=spec)
    assert not list(tmp_path.rglob("*.pkl"))
    resumed, _, elapsed = run(backup=spec)
    assert elapsed.steps == reference_elapsed.steps
    assert int(resumed.step) == int(reference.step) == 4  # the best state: after step 3, 4 updates
    np.testing.assert_array_equal(resumed.params["w"], reference.params["w"])


def _steps(directory):
    """The backups' step directories, newest first."""
    return sorted((p for p in directory.iterdir() if p.name.isdigit()), key=lambda p: -int(p.name))


def _logged_add(state, batch):
    return ciclo.logs().add_metric("x", state), state + batch


def _small_run(directory):
    return ciclo.loop(
        0, range(4), {ciclo.every(1): _logged_add}, backup=ciclo.backup(directory, every=2), stop=3
    )


def test_a_backup_is_read_as_data_and_a_pickle_in_it_never_runs(tmp_path):
    import base64
    import json
    import pickle

    _small_run(tmp_path)
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    old = {"format": 1, "finished": False, "payload": base64.b64encode(pickle.dumps(Payload())).decode()}
    for step in _steps(tmp_path):
        (step / "loop" / "metadata").write_text(json.dumps(old))
    with pytest.raises(ValueError, match=r"earlier ciclo, whose backups held a pickle: it is not read"):
        _small_run(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("position", 10**12, r"position is 1000000000000, not a number of batches from 0 to the 3 steps"),
        ("position", -1, r"position is -1"),
        ("elapsed", [-3, 0, 0.0, 0.0], r"elapsed is \[-3, 0, 0.0, 0.0\]"),
        ("elapsed", [3, 3, float("nan"), 0.0], r"elapsed is \[3, 3, nan, 0.0\]"),
        ("elapsed", [3, 3, 1.0, float("inf")], r"elapsed is \[3, 3, 1.0, inf\]"),
        ("extra", 1, r"unknown fields \['extra'\]"),
        ("devices", 0, r"devices is 0, not a device count"),
        ("callbacks", [], r"callbacks is a list, not a dict"),
        (
            "history",
            {"$array": {"dtype": "object", "shape": [], "scalar": True, "data": ""}},
            r"dtype object",
        ),
    ],
)
def test_a_damaged_or_crafted_backup_names_its_file_and_field(tmp_path, field, value, message):
    import json

    _small_run(tmp_path)
    steps = _steps(tmp_path)
    for step in steps:  # every backup: none is left to fall back to
        document = step / "loop" / "metadata"
        item = json.loads(document.read_text())
        item[field] = value
        document.write_text(json.dumps(item))
    with pytest.raises(ValueError, match=message) as caught:
        _small_run(tmp_path)
    assert f"no backup in {tmp_path} can be resumed from" in str(caught.value)
    for step in steps:
        assert f"- step {step.name}: {step / 'loop'}" in str(caught.value)
    assert [step.name for step in _steps(tmp_path)] == [step.name for step in steps]  # none deleted


@pytest.mark.parametrize("devices", [None, 1, 3])
def test_a_backup_of_another_device_count_resumes_with_a_note(tmp_path, capsys, devices):
    import json

    _small_run(tmp_path)
    for step in _steps(tmp_path):
        document = step / "loop" / "metadata"
        item = json.loads(document.read_text())
        assert item["devices"] == jax.device_count() == 1
        if devices is None:  # a backup of a ciclo that did not record its devices
            del item["devices"]
        else:
            item["devices"] = devices
        document.write_text(json.dumps(item))
    capsys.readouterr()
    state, _, elapsed = ciclo.loop(
        0, range(4), {ciclo.every(1): _logged_add}, backup=ciclo.backup(tmp_path, every=2), stop=4
    )
    assert elapsed.steps == 4
    note = (
        "ciclo: resuming a backup written on 3 devices onto 1: the run goes on; its results are not bitwise"
    )
    assert (note in capsys.readouterr().err) == (devices == 3)


def _truncate_loop_document(step):
    document = step / "loop" / "metadata"
    document.write_text(document.read_text()[:20])


def _zero_state_files(step):
    for path in (step / "state").rglob("*"):
        if path.is_file():
            path.write_bytes(bytes(path.stat().st_size))


def _garbage_rows(step):
    """The newest backup's own rows chunk, crafted: a string where the History holds numbers."""
    import json

    chunk = step.parent / "history" / "rows-2-3.json"
    part = json.loads(chunk.read_text())
    part["values"] = [{"$tuple": ["<script>"]}]
    chunk.write_text(json.dumps(part))


def _nan_row_time(step):
    import json

    chunk = step.parent / "history" / "rows-2-3.json"
    part = json.loads(chunk.read_text())
    part["elapsed"] = [{"$tuple": [2, 2, {"$float": "nan"}]}]
    chunk.write_text(json.dumps(part))


@pytest.mark.parametrize("damage", [_truncate_loop_document, _zero_state_files, _garbage_rows, _nan_row_time])
def test_a_damaged_newest_backup_is_warned_about_and_the_one_before_resumed(tmp_path, damage, caplog):
    reference = _small_run(tmp_path / "reference")
    _small_run(tmp_path / "run")
    newest, previous = _steps(tmp_path / "run")[:2]
    damage(newest)
    with caplog.at_level("WARNING", logger="ciclo"):
        resumed = _small_run(tmp_path / "run")
    assert f"cannot resume from the backup at step {newest.name} in {tmp_path / 'run'}" in caplog.text
    assert resumed[0] == reference[0] == 3
    assert resumed[2].steps == reference[2].steps == 3
    assert resumed[1].collect("steps") == reference[1].collect("steps")
    # The damaged backup was replaced by the resumed run's own: a third run returns at once.
    caplog.clear()
    with caplog.at_level("WARNING", logger="ciclo"):
        assert _small_run(tmp_path / "run")[0] == 3
    assert "cannot resume" not in caplog.text


def test_after_a_nan_the_newest_finite_backup_is_the_resume_point(tmp_path):
    # The poisoned run turns NaN at step 7 and terminate_on_nan stops it; no backup holds the NaN and
    # none is marked finished, so the run with the data fixed resumes from step 6 and equals a clean run.
    def step(state, batch):
        x = jnp.float32(jnp.nan) if batch == "poison" else jnp.float32(batch)
        new = state + x
        return ciclo.logs().add_loss("loss", new), new

    clean = list(range(12))
    poisoned = [*range(7), "poison", *range(8, 12)]
    guard = ciclo.terminate_on_nan("loss", check_every=1)
    spec = ciclo.backup(tmp_path, every=2)
    stopped, _, _ = ciclo.loop(jnp.float32(0), poisoned, {ciclo.every(1): [step, guard]}, backup=spec)
    assert np.isnan(stopped)
    saved = sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit())
    assert saved == [4, 6]
    resumed, _, elapsed = ciclo.loop(jnp.float32(0), clean, {ciclo.every(1): step}, backup=spec)
    reference, _, _ = ciclo.loop(jnp.float32(0), clean, {ciclo.every(1): step})
    assert elapsed.steps == 12
    assert float(resumed) == float(reference) == float(sum(clean))


def test_test_loop_resumed_keeps_the_metrics_accumulated_before_the_backup(tmp_path):
    # reset_step runs at the start of test_loop; run again at the resume, it zeroed the first half.
    def count(state, batch):
        new = {"seen": state["seen"] + 1, "total": state["total"] + batch}
        return ciclo.logs().add_metric("mean", new["total"] / new["seen"]), new

    def reset(state):
        return None, {"seen": jnp.float32(0), "total": jnp.float32(0)}

    def tasks(*extra):
        return {ciclo.on_test_step: [count, *extra], "reset_step": [reset]}

    start = {"seen": jnp.float32(99), "total": jnp.float32(99)}  # reset_step must clear this once
    data = [float(i) for i in range(10)]
    spec = ciclo.backup(tmp_path, every=2)
    with pytest.raises(Crash):
        ciclo.test_loop(start, data, tasks(crash_at(7)), backup=spec)
    state, history, _ = ciclo.test_loop(start, data, tasks(), backup=spec)
    assert float(state["seen"]) == 10 and float(state["total"]) == sum(data)
    assert history.collect("mean")[-1] == pytest.approx(np.mean(data))


def test_predict_loop_resumed_keeps_the_predictions_gathered_before_the_kill(tmp_path):
    def predict(state, batch):
        return ciclo.logs().add_output("preds", np.full((2,), batch, np.float32)), state

    def tasks(*extra):
        return {ciclo.hooks.on_predict_step: [predict, *extra]}

    data = list(range(8))
    spec = ciclo.backup(tmp_path, every=3)
    with pytest.raises(Crash):
        ciclo.predict_loop(0, data, tasks(crash_at(5)), backup=spec)
    _, history, _ = ciclo.predict_loop(0, data, tasks(), backup=spec)
    np.testing.assert_array_equal(np.stack(history.collect("preds"))[:, 0], np.arange(8, dtype=np.float32))


# ------------------------------------------------------------------------- a resume checks what it resumes


def test_a_larger_stop_goes_on_from_a_finished_run(tmp_path):
    reference = run(tmp_path / "reference", stop=30)
    run(tmp_path / "run", stop=20)
    calls = []
    longer = run(tmp_path / "run", lambda state, batch: calls.append(1), stop=30)
    assert len(calls) == 10  # the 10 steps after the finished run's 20
    assert_same_run(reference, longer)
    # The same stop again: finished, returned at once.
    assert_same_run(reference, run(tmp_path / "run", lambda state, batch: calls.append(1), stop=30))
    assert len(calls) == 10


def test_another_loop_kind_is_refused_before_any_step(tmp_path):
    _small_run(tmp_path)
    ran = []
    with pytest.raises(
        ValueError, match=r"written by 'loop', and this loop is 'predict_loop'.*directory of this"
    ):
        ciclo.predict_loop(
            0,
            range(4),
            {ciclo.hooks.on_predict_step: lambda state, batch: ran.append(batch)},
            backup=tmp_path,
        )
    assert ran == []


def test_a_crafted_kind_is_echoed_bounded(tmp_path):
    import json

    _small_run(tmp_path)
    for step in _steps(tmp_path):
        document = step / "loop" / "metadata"
        item = json.loads(document.read_text())
        item["kind"] = "k" * 1_000_000
        document.write_text(json.dumps(item))
    with pytest.raises(ValueError, match=r"written by 'kkk") as caught:
        _small_run(tmp_path)
    assert len(str(caught.value)) < 1000


def test_the_resume_line_is_silenced_through_its_logger(tmp_path, capsys):
    _small_run(tmp_path)
    capsys.readouterr()
    logging.getLogger("ciclo.resume").setLevel(logging.ERROR)
    try:
        assert _small_run(tmp_path)[0] == 3  # resumed: the finished run
    finally:
        logging.getLogger("ciclo.resume").setLevel(logging.NOTSET)
    assert capsys.readouterr().err == ""
    _small_run(tmp_path)
    assert capsys.readouterr().err.startswith("ciclo: resumed loop from the backup at step 3")


def test_a_resume_and_a_preemption_each_print_one_line_by_default(tmp_path):
    import sys

    script = (
        "import os, signal, sys, ciclo\n"
        "def step(state, batch):\n"
        "    if batch == 3 and sys.argv[1] == 'kill': os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return state + 1\n"
        f"ciclo.loop(0, range(6), {{ciclo.every(1): step}}, stop=6, backup={str(tmp_path)!r})\n"
    )
    first = zygote.run([sys.executable, "-c", script, "kill"], env=processes.clean_env(), timeout=120)
    assert first.returncode == 143
    assert first.stderr.strip().splitlines() == [
        f"ciclo: preempted by SIGTERM after step 4: the backup is saved in {tmp_path}; run the same "
        "command again to resume from it"
    ]
    second = zygote.run([sys.executable, "-c", script, "go"], env=processes.clean_env(), timeout=120)
    assert second.returncode == 0
    assert second.stderr.strip().splitlines() == [
        f"ciclo: resumed loop from the backup at step 4 in {tmp_path}"
    ]


# ----------------------------------------------------------------------------- a closed world


@pytest.mark.parametrize("where", ["history", "history/rows-0-2.json", "2/state"])
def test_a_link_in_a_backup_directory_is_refused_and_nothing_outside_is_touched(tmp_path, where):
    outside = tmp_path / "data"
    outside.mkdir()
    for name in ("a.csv", "rows-0-2.json", "rows-9-10.json"):
        (outside / name).write_text("precious")
    directory = tmp_path / "backup"
    if where == "history":
        directory.mkdir()  # a fresh directory planted with `history -> data`
    else:
        _small_run(directory)
        target = directory / where
        (shutil.rmtree if target.is_dir() else os.unlink)(target)
    (directory / where).symlink_to(outside / ("rows-0-2.json" if where.endswith(".json") else ""))
    with pytest.raises(ciclo.types.LinkError, match=rf"holds {directory / where}, a symbolic link"):
        _small_run(directory)
    assert sorted(p.name for p in outside.iterdir()) == ["a.csv", "rows-0-2.json", "rows-9-10.json"]
    assert {p.read_text() for p in outside.iterdir()} == {"precious"}


def test_a_hard_link_in_a_backup_directory_is_refused(tmp_path):
    _small_run(tmp_path / "backup")
    outside = tmp_path / "elsewhere.json"
    os.link(tmp_path / "backup" / "history" / "rows-0-2.json", outside)
    with pytest.raises(ciclo.types.LinkError, match=r"rows-0-2.json, a file with 1 other hard link"):
        _small_run(tmp_path / "backup")


def test_cleanup_deletes_only_the_chunks_ciclo_wrote(tmp_path):
    (tmp_path / "history").mkdir(parents=True)
    (tmp_path / "ciclo_backup.json").write_text('{"format": 3}')
    for name in ("notes.txt", "rows-x-y.json", "rows-0-2.json.bak"):
        (tmp_path / "history" / name).write_text("mine")
    (tmp_path / "history" / "rows-90-99.json").write_text("a killed run's chunk")
    run(tmp_path, stop=12, every=4)  # each backup's cleanup runs over the folder
    assert sorted(os.listdir(tmp_path / "history")) == [
        "notes.txt",
        "rows-0-2.json.bak",
        "rows-0-4.json",
        "rows-4-8.json",
        "rows-8-12.json",
        "rows-x-y.json",
    ]


def sized_batches(size, n):
    rng = np.random.default_rng(0)
    for _ in range(n):
        x = rng.normal(size=(size, 3)).astype(np.float32)
        yield x, x.sum(axis=1, keepdims=True).astype(np.float32)


def test_another_batch_size_is_refused_before_any_step(tmp_path):
    with pytest.raises(Crash):
        run(tmp_path, crash_at(13), dataset=sized_batches(8, 40))
    ran = []
    with pytest.raises(ValueError, match=r"drawn 10 batches holding 80 samples.*hold 40: another batch size"):
        run(tmp_path, lambda state, batch: ran.append(1), dataset=sized_batches(4, 80))
    assert ran == []
    # The batch size of the backed-up run resumes.
    assert run(tmp_path, dataset=sized_batches(8, 40))[2].samples == 30 * 8


LOCK_HOLDER = """
import sys, time
sys.path.insert(0, {support!r})
import ciclo

def wait_for_release(state, batch):
    while not __import__("os").path.exists({release!r}):
        time.sleep(0.01)

ciclo.loop(0, range(2), {{ciclo.every(1): wait_for_release}}, backup={directory!r})
"""


def test_a_second_process_on_one_backup_directory_is_refused_with_the_owners_name(tmp_path):
    import socket
    import sys
    import time

    directory, release = tmp_path / "backup", tmp_path / "release"
    script = LOCK_HOLDER.format(support=os.getcwd(), release=str(release), directory=str(directory))
    child = zygote.popen([sys.executable, "-c", script], env=processes.clean_env())
    try:
        lock = directory / "ciclo_backup.lock"
        while not lock.exists():  # the child holds the directory once its loop has started
            assert child.poll() is None, "the lock holder exited"
            time.sleep(0.05)
        with pytest.raises(
            FileExistsError, match=rf"in use by process {child.pid} on host '{socket.gethostname()}'"
        ):
            _small_run(directory)
    finally:
        release.touch()
        assert child.wait(timeout=120) == 0
    assert not lock.exists()  # released when the loop ended
    assert _small_run(directory)[2].steps == 3  # then usable: it goes on from the 2 steps of the other run


RACER = """
import os, sys, time
import ciclo
from ciclo._src.resume import backup as backup_module

gates, write = {gates!r}, backup_module.write_atomically


def wait_for(name):
    while not os.path.exists(os.path.join(gates, name)):
        time.sleep(0.01)


def gated_write(path, text):  # the marker's write waits until the other process got here too, or ended
    if os.path.basename(path) == "ciclo_backup.json":
        open(os.path.join(gates, f"marker-{{os.getpid()}}"), "w").close()
        wait_for("release")
    write(path, text)


backup_module.write_atomically = gated_write
open(os.path.join(gates, f"ready-{{os.getpid()}}"), "w").close()
wait_for("go")  # both processes start their loops at the same instant
ciclo.loop(0, range(3), {{ciclo.every(1): lambda state, batch: state + batch}}, backup={directory!r})
"""


def test_two_runs_started_at_once_on_one_directory_one_runs_and_the_other_names_it(tmp_path):
    """The lock is taken before anything is written: the loser writes nothing and names the winner.

    Both processes are held where they write the directory's marker until the
    other reaches it too or ends. Had the marker come before the lock, both would
    write it together (`FileNotFoundError: ciclo_backup.json.tmp` in about half the tries).
    """
    import subprocess
    import sys
    import time

    gates, directory = tmp_path / "gates", tmp_path / "backup"
    gates.mkdir()
    script = RACER.format(gates=str(gates), directory=str(directory))
    children = [
        zygote.popen([sys.executable, "-c", script], env=processes.clean_env(), stderr=subprocess.PIPE)
        for _ in range(2)
    ]

    def arrived(prefix):
        return sorted(int(path.name.split("-")[1]) for path in gates.glob(f"{prefix}-*"))

    try:
        while len(arrived("ready")) < 2:
            assert all(child.poll() is None for child in children), "a racer ended before it started"
            time.sleep(0.05)
        (gates / "go").touch()
        while len(arrived("marker")) < 2 and all(child.poll() is None for child in children):
            time.sleep(0.05)
        (gates / "release").touch()
        errors = [child.communicate(timeout=120)[1] for child in children]
    finally:
        for child in children:
            child.kill()
    codes = [child.returncode for child in children]
    assert sorted(codes) == [0, 1], errors
    winner, loser = (children[0], children[1]) if codes[0] == 0 else (children[1], children[0])
    assert arrived("marker") == [winner.pid], "the loser wrote in the directory before it held the lock"
    last_line = errors[children.index(loser)].strip().splitlines()[-1]
    assert f"is in use by process {winner.pid} on host '{socket.gethostname()}'" in last_line, last_line


@pytest.mark.parametrize(
    "content",
    [
        "",
        "{not json",
        # This process is alive, but it is not the holder: another start time (a reused pid).
        json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": "another-boot/1"}),
        json.dumps({"pid": 1, "host": socket.gethostname()}),  # pid 1 lives: a container's restart
    ],
    ids=["empty", "unreadable", "reused-pid", "pid-1"],
)
def test_a_lock_no_live_process_holds_is_taken_over_with_a_warning(tmp_path, content, caplog):
    _small_run(tmp_path / "backup")
    (tmp_path / "backup" / "ciclo_backup.lock").write_text(content)
    with caplog.at_level("WARNING", logger="ciclo"):
        assert _small_run(tmp_path / "backup")[0] == 3
    assert "taking over the lock of" in caplog.text
    assert not (tmp_path / "backup" / "ciclo_backup.lock").exists()


def test_a_lock_held_by_another_program_says_so(tmp_path):
    import fcntl

    directory = tmp_path / "backup"
    _small_run(directory)
    with open(directory / "ciclo_backup.lock", "w") as lock:  # another program's lock, of its own format
        lock.write("locked by rsync\n")
        lock.flush()
        fcntl.flock(lock, fcntl.LOCK_EX)
        with pytest.raises(FileExistsError) as refused:
            _small_run(directory)
    assert str(refused.value).startswith(
        f"the backup directory {directory} is in use by another program, not a ciclo run "
        f"({directory / 'ciclo_backup.lock'} holds b'locked by rsync\\n'): "
    )
    assert "None" not in str(refused.value)
    assert _small_run(directory)[2].steps == 3  # released: the backup is untouched


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_lock_path_that_is_not_a_regular_file_is_refused_with_its_path(tmp_path, kind):
    directory = tmp_path / "backup"
    directory.mkdir()
    lock = directory / "ciclo_backup.lock"
    os.mkfifo(lock) if kind == "fifo" else lock.mkdir()  # a FIFO opened for reading would block
    with pytest.raises(FileExistsError, match=rf"lock file {re.escape(str(lock))} is not a regular file"):
        _small_run(directory)
    assert sorted(os.listdir(directory)) == ["ciclo_backup.lock"]  # refused before writing anything


NAMESPACED_RUN = """
import os, sys, time
assert os.getpid() == 1, os.getpid()
import ciclo

def step(state, batch):
    if batch == 2 and not os.path.exists({resumed!r}):
        open({ready!r}, "w").close()
        while True:  # held here, lock taken, until the test SIGKILLs this pid 1
            time.sleep(1)
    return state + batch

state, _, _ = ciclo.loop(
    0, range(5), {{ciclo.every(1): step}}, stop=5, backup=ciclo.backup({directory!r}, every=1)
)
print(state)
"""


def test_a_container_pid_1_killed_and_restarted_as_pid_1_resumes(tmp_path):
    """A job SIGKILLed as pid 1 of its pid namespace, then restarted as pid 1 on the same host, resumes."""
    import shutil as _shutil
    import subprocess
    import sys
    import time

    unshare = ["unshare", "--pid", "--fork", "--mount-proc"]
    if _shutil.which("unshare") is None or subprocess.run([*unshare, "true"]).returncode != 0:
        pytest.skip("needs unshare and the right to make a pid namespace (root, as in CI)")
    ready, resumed, directory = tmp_path / "ready", tmp_path / "resumed", tmp_path / "backup"
    script = NAMESPACED_RUN.format(ready=str(ready), resumed=str(resumed), directory=str(directory))
    first = subprocess.Popen([*unshare, sys.executable, "-c", script], start_new_session=True)
    try:
        while not ready.exists():  # the worker holds the lock and waits in step 3
            assert first.poll() is None, "the namespaced run exited before its step 3"
            time.sleep(0.05)
        children = f"/proc/{first.pid}/task/{first.pid}/children"
        with open(children) as file:
            (pid_1,) = map(int, file.read().split())  # the namespace's pid 1, seen from here
        os.kill(pid_1, signal.SIGKILL)
        assert first.wait(timeout=60) != 0
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert (directory / "ciclo_backup.lock").exists()  # left by the killed pid 1
    resumed.touch()
    second = subprocess.run(
        [*unshare, sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert second.returncode == 0, second.stderr
    assert "taking over the lock" in second.stderr
    assert re.search(r"resumed loop from the backup at step [12] in", second.stderr)  # 2's save is async
    assert second.stdout.split() == ["10"]


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path, caplog):
    import json
    import socket
    import subprocess
    import sys

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    _small_run(tmp_path)
    (tmp_path / "ciclo_backup.lock").write_text(
        json.dumps({"pid": int(gone.stdout), "host": socket.gethostname()})
    )
    with caplog.at_level("WARNING", logger="ciclo"):
        assert _small_run(tmp_path)[0] == 3
    assert "which is gone" in caplog.text
    assert not (tmp_path / "ciclo_backup.lock").exists()


class FailingEnd:
    """An object whose end hook fails, as a kill would between the last step and the loggers' end flush."""

    def __loop_callback__(self, loop_state):
        return {}, loop_state.state

    def on_end(self, loop_state, error):
        raise Crash("end hook")


def test_the_finished_backup_is_written_after_the_loggers_flushed(tmp_path):
    import csv

    def csv_steps():
        with open(tmp_path / "log.csv") as file:
            return [int(row["step"]) for row in csv.DictReader(file)]

    def once(*extra):
        return ciclo.loop(
            0,
            range(12),
            {ciclo.every(1): [add, *extra, ciclo.csv_logger(tmp_path / "log.csv")]},
            backup=ciclo.backup(tmp_path / "backup", every=5),
        )

    with pytest.raises(Crash):
        once(FailingEnd())
    assert not any(json_finished(step) for step in _steps(tmp_path / "backup"))  # nothing claimed finished
    state, history, _ = once()
    assert state == sum(range(12))
    assert csv_steps() == list(range(12))  # each step once


def json_finished(step):
    import json

    return json.loads((step / "loop" / "metadata").read_text())["finished"]


# ----------------------------------------------------------------------------- the History, incrementally


def _chunks(directory):
    """The History chunk files of a backup directory, as (first, end) row ranges."""
    names = os.listdir(directory / "history")
    return sorted(tuple(int(x) for x in name[len("rows-") : -len(".json")].split("-")) for name in names)


def test_each_backup_writes_only_the_rows_since_the_one_before(tmp_path):
    run(tmp_path, stop=30, every=5)
    chunks = _chunks(tmp_path)
    assert chunks == [(i, i + 5) for i in range(0, 30, 5)]  # each row once, five per backup
    newest = _steps(tmp_path)[0] / "loop" / "metadata"
    assert '"chunks"' in newest.read_text() and len(newest.read_text()) < 2000  # no row in the document
    assert_same_run(run(tmp_path / "reference", stop=30), run(tmp_path, stop=30))


def test_a_bounded_history_backs_up_and_resumes_without_its_dropped_rows(tmp_path):
    def once(directory, *extra):
        return ciclo.loop(
            0,
            range(3000),
            {ciclo.every(1): [add, *extra]},
            history=ciclo.history(max_rows=10),
            backup=ciclo.backup(directory, every=500),
        )

    reference = once(tmp_path / "reference")
    with pytest.raises(Crash):
        once(tmp_path / "run", crash_at(2200))
    resumed = once(tmp_path / "run")
    assert resumed[0] == reference[0]
    assert resumed[1].collect("steps") == reference[1].collect("steps")
    assert resumed[1].dropped == reference[1].dropped > 0
    # Chunks wholly dropped by every kept backup are deleted: the files do not grow with the run.
    assert sum(end - first for first, end in _chunks(tmp_path / "run")) < 3 * 500 + 2 * 384


def test_a_resume_notes_the_optimizer_hyperparameters_that_changed(tmp_path, caplog):
    from ciclo import managed

    @managed.train_step
    def step(state, batch):
        return ciclo.logs().add_loss("loss", ((state.params - batch) ** 2).sum()), state

    def run(learning_rate, stop):
        tx = optax.inject_hyperparams(optax.sgd)(learning_rate=learning_rate)
        state = managed.ManagedState.create(params=jnp.zeros(2), tx=tx, strategy="jit")
        return ciclo.loop(state, [jnp.ones(2)] * 10, {ciclo.every(1): step}, stop=stop, backup=tmp_path)

    run(0.1, stop=2)
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        run(0.1, stop=3)
    assert "hyperparameters" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        state, _, _ = run(0.01, stop=4)
    assert (
        "other optimizer hyperparameters than this run's state has (learning_rate: 0.1 -> 0.01)"
        in caplog.text
    )
    assert float(state.opt_state.hyperparams["learning_rate"]) == pytest.approx(0.1)  # the backup's, as noted


class _Scale:
    """The smallest model for `ciclo.create_model_state`: a dot product."""

    def init(self, key, inputs):
        return {"w": jnp.ones((2,))}, None

    def apply(self, params, model_state, inputs, *, key, training):
        return inputs @ params["w"], model_state


_OPTION_DATA = [np.full((4, 2), 0.5, np.float32)] * 8


def _options_state(**options):
    return ciclo.create_model_state(
        _Scale(),
        inputs=jnp.ones((1, 2)),
        tx=optax.sgd(0.1),
        losses=lambda preds: jnp.mean(preds**2),
        **options,
    )


@pytest.mark.parametrize(
    ("before", "after", "message"),
    [
        (
            {"accumulate_steps": 4},
            {"accumulate_steps": 2},
            r"written with accumulate_steps=4, and this run's state has accumulate_steps=2: "
            r".*optax\.MultiSteps"
            r".*Resume with accumulate_steps=4, or give backup= another directory",
        ),
        (
            {"precision": "16-mixed"},
            {"precision": "32"},
            r"written with precision='16-mixed', and this run's state has precision='32': .*loss.*"
            r"Resume with precision='16-mixed'",
        ),
        (
            {},
            {"ema_decay": 0.5},
            r"written with ema_decay=None, and this run's state has ema_decay=0\.5: .*EMA.*"
            r"Resume with ema_decay=None",
        ),
    ],
)
def test_a_changed_option_the_state_s_arrays_depend_on_is_refused_naming_it(tmp_path, before, after, message):
    # accumulate_steps 4 -> 2 has the same structure (optax.MultiSteps' state): it used to resume silently.
    ciclo.train_loop(_options_state(**before), _OPTION_DATA, stop=2, backup=tmp_path)
    steps = _steps(tmp_path)
    with pytest.raises(ValueError, match=message):
        ciclo.train_loop(_options_state(**after), _OPTION_DATA, stop=3, backup=tmp_path)
    assert _steps(tmp_path) == steps  # refused before anything was read or deleted
    _, _, elapsed = ciclo.train_loop(_options_state(**before), _OPTION_DATA, stop=3, backup=tmp_path)
    assert elapsed.steps == 3


@pytest.mark.parametrize(
    ("before", "after", "note"),
    [
        ({"precision": "bf16-mixed"}, {"precision": "32"}, "precision: 'bf16-mixed' -> '32'"),
        ({"ema_decay": 0.99}, {"ema_decay": 0.5}, "ema_decay: 0.99 -> 0.5"),
    ],
)
def test_a_changed_option_the_state_can_go_on_with_is_noted(tmp_path, caplog, before, after, note):
    ciclo.train_loop(_options_state(**before), _OPTION_DATA, stop=2, backup=tmp_path)
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        ciclo.train_loop(_options_state(**before), _OPTION_DATA, stop=3, backup=tmp_path)
    assert "other options" not in caplog.text  # the same options: nothing to note
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        state, _, elapsed = ciclo.train_loop(_options_state(**after), _OPTION_DATA, stop=4, backup=tmp_path)
    assert f"was written with other options than this run's state has ({note})" in caplog.text
    assert elapsed.steps == 4
    assert state.resume_options()[next(iter(after))] == next(iter(after.values()))


def test_a_loop_of_your_own_backs_up_through_the_backup_callback(tmp_path):
    def own_loop(stop, kind="own_loop", *extra):
        phase = ciclo.types.Phase("train", [(ciclo.every(1), [sgd_step, *extra])])
        spec = ciclo.backup(tmp_path, every=5)
        return ciclo.run_phases(init(), batches(), [phase], stop=stop, callbacks=[spec.callback(kind)])

    reference = ciclo.loop(init(), batches(), {ciclo.every(1): sgd_step}, stop=30)
    with pytest.raises(Crash):
        own_loop(30, "own_loop", crash_at(13))
    assert_same_run(reference, own_loop(30))
    with pytest.raises(ValueError, match="written by 'own_loop', and this loop is 'other_loop'"):
        own_loop(30, "other_loop")


def test_orbax_s_chatter_filter_is_added_to_absl_s_logger_once_however_many_uses():
    from absl import logging as absl_logging

    from ciclo._src.resume import orbax_io

    orbax_io.orbax()
    filters = list(absl_logging.get_absl_logger().filters)
    orbax_io.orbax(), orbax_io.orbax()
    assert absl_logging.get_absl_logger().filters == filters


def test_a_dtype_refused_by_every_backup_is_said_once_in_a_short_error(tmp_path):
    # Each backup's differences used to be repeated: 2,519 characters for a float32 run resumed as bfloat16.
    names = [f"layer_{i}_with_a_rather_long_name" for i in range(12)]

    def add(state, batch):
        return ciclo.logs(), {name: leaf + batch for name, leaf in state.items()}

    floats = {name: jnp.zeros((3, 2)) for name in names}
    spec = ciclo.backup(tmp_path, every=1, keep=3)
    ciclo.loop(floats, [1.0] * 8, {ciclo.every(1): add}, stop=4, backup=spec)
    halves = {name: jnp.zeros((3, 2), jnp.bfloat16) for name in names}
    with pytest.raises(ValueError) as refused:
        ciclo.loop(halves, [1.0] * 8, {ciclo.every(1): add}, stop=6, backup=spec)
    message = str(refused.value)
    assert len(message) < 2000
    assert "the backup holds dtype float32 (shape (3, 2)), the target has dtype bfloat16" in message
    assert message.count("the target has dtype bfloat16") <= 8  # one backup's leaves, not each backup's
    assert "(3 backups share this)" in message
    assert len(_steps(tmp_path)) == 3  # none deleted
