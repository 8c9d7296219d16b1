"""The callback-state hook: a fresh callback given another's snapshot goes on exactly as the other did.

Every case runs a loop for `SPLIT` steps with callback A and takes
`A.state_dict()`; A goes on to `TOTAL`; a fresh B built with the same
arguments takes the snapshot back and runs the same continuation from the same
state. A checkpointer's directory is copied at the snapshot, as a backup taken
then would find it.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import logging
import os
import shutil
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.docs import DOCS, python_blocks

import ciclo

LOSSES = [0.9, 0.3, 0.7, 0.8, 0.6, 0.5, 0.4, 0.35, 0.2, 0.45, 0.5, 0.55]
SPLIT = 4
TOTAL = len(LOSSES)


def train_step(state, batch, elapsed):
    loss = LOSSES[elapsed.steps]
    logs = ciclo.logs().add_metric("loss", loss).add_metric("accuracy", 1 - loss)
    return logs, {"w": state["w"] + loss, "steps": state["steps"] + 1}


def initial_state():
    return {"w": jnp.float32(0), "steps": jnp.int32(0)}


def run(callback, state, elapsed, stop):
    return ciclo.loop(
        state, itertools.repeat(None), {ciclo.every(1): [train_step, callback]}, stop=stop, elapsed=elapsed
    )


def committed_steps(directory):
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def host(tree):
    """A copy of `tree` with every leaf on the host, to compare values and keep them unchanged."""
    return jax.tree.map(lambda leaf: np.array(leaf), tree)


def same(a, b):
    if jax.tree.structure(a) != jax.tree.structure(b):
        return False
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


@dataclasses.dataclass(frozen=True)
class Case:
    """A stateful callback under test.

    Attributes:
        make: builds a fresh callback on a directory (used by checkpointers only).
        decisions: what the callback decided after a run, beyond the loop's result.
        writes_directory: the callback writes into its directory, which is copied
            at the snapshot.
        snapshot_matters: a fresh callback not given the snapshot decides otherwise
            on the continuation (the checkpointers rank what is in their directory).
    """

    make: Callable[[Path], Any]
    decisions: Callable[[Any, Path], Any]
    writes_directory: bool = False
    snapshot_matters: bool = True


def stopper_decisions(stopper, directory):
    return {"best": stopper.best, "wait": stopper.wait, "stopped": stopper.stopped}


def checkpoint_decisions(ckpt, directory):
    ckpt.wait()
    latest = ckpt.restore(initial_state()) if ckpt.all_steps() else None
    return {
        "kept": ckpt.all_steps(),
        "on_disk": committed_steps(directory),
        "best": ckpt.best_step(),
        "latest": latest,
    }


CASES = {
    # Best 0.3 at step 1, two checks without improvement at the snapshot: stops at step 5.
    "early_stopping": Case(lambda d: ciclo.early_stopping("loss", patience=3), stopper_decisions),
    # Counts from the step of the best check; stops at step 5 with the state of step 1.
    "early_stopping_period_restore_best": Case(
        lambda d: ciclo.early_stopping("loss", patience=ciclo.at(steps=4), restore_best_weights=True),
        stopper_decisions,
    ),
    # Nothing beats the baseline before the snapshot: wait 4, stops at step 5.
    "early_stopping_baseline": Case(
        lambda d: ciclo.early_stopping("loss", patience=5, baseline=0.25), stopper_decisions
    ),
    "early_stopping_max_min_delta": Case(
        lambda d: ciclo.early_stopping("accuracy", patience=3, mode="max", min_delta=0.05),
        stopper_decisions,
    ),
    "checkpoint_best": Case(
        lambda d: ciclo.checkpoint(d, keep=2, monitor="loss"),
        checkpoint_decisions,
        writes_directory=True,
        snapshot_matters=False,
    ),
    "checkpoint_latest": Case(
        lambda d: ciclo.checkpoint(d, keep=3),
        checkpoint_decisions,
        writes_directory=True,
        snapshot_matters=False,
    ),
    "checkpoint_all_max_sync": Case(
        lambda d: ciclo.checkpoint(d, keep=None, monitor="accuracy", mode="max", async_save=False),
        checkpoint_decisions,
        writes_directory=True,
        snapshot_matters=False,
    ),
}


def csv_decisions(logger, directory):
    logger.flush()
    return {"rows": (directory / "log.csv").read_text().splitlines()}


CASES["csv_logger"] = Case(
    lambda d: ciclo.csv_logger(d / "log.csv"), csv_decisions, writes_directory=True, snapshot_matters=False
)

CHECKPOINT_CASES = [name for name in CASES if name.startswith("checkpoint")]

STATELESS = {
    "InnerLoop": "aggregates within one call; its loop function is the user's",
    "KerasBar": "draws from the loop's elapsed; its clock and redraw marks belong to one process's display",
    "TqdmBar": "the same, through tqdm",
    "TerminateOnNaN": "a resumed run starts from a finite state: nothing found so far is worth keeping",
    "NoOp": "does nothing",
    "Throughput": "measures one process's host clock over a window that starts again in each loop",
    "Profile": "traces steps of one process; a resumed run traces its own chosen steps",
    "DeviceStats": "reads the allocator's counters as they are now; a resumed run notes a CPU backend again",
    "SwapEMAWeights": "swaps within one test loop; the trained and the EMA weights are the state's own",
}
"""Public callbacks without the hook, and why they need none."""

STATEFUL = {"EarlyStopping": "early_stopping", "Checkpoint": "checkpoint", "Logger": "csv_logger"}
"""Public stateful callback classes, and the prefix of their cases in `CASES`."""


@dataclasses.dataclass(frozen=True)
class Run:
    """A callback, its directory, and where a loop driving it ended."""

    callback: Any
    directory: Path
    state: Any
    elapsed: Any

    def outcome(self, decisions):
        return {
            "steps": self.elapsed.steps,
            "state": host(self.state),
            "decisions": decisions(self.callback, self.directory),
            "state_dict": host(self.callback.state_dict()),
        }


def start(case, directory):
    """Runs a fresh callback for `SPLIT` steps; returns the run and its snapshot."""
    callback = case.make(directory)
    state, _, elapsed = run(callback, initial_state(), None, SPLIT)
    return Run(callback, directory, state, elapsed), callback.state_dict()


def go_on(split, callback, directory, stop=TOTAL):
    """Runs `callback` (on `directory`) from where `split` ended, up to `stop`."""
    state, _, elapsed = run(callback, split.state, split.elapsed, stop)
    return Run(callback, directory, state, elapsed)


def resume(split, case, directory, snapshot):
    """A fresh callback on `directory`, given `snapshot` unless None, runs the continuation of `split`."""
    callback = case.make(directory)
    if snapshot is not None:
        callback.load_state_dict(snapshot)
    return go_on(split, callback, directory)


def fork(split, tmp_path, name):
    """The directory a second callback works in: a copy of `split`'s as it is now, for checkpointers."""
    if not os.path.isdir(split.directory):
        return tmp_path / name
    return Path(shutil.copytree(split.directory, tmp_path / name))


@pytest.mark.parametrize("stored", [False, True], ids=["as_taken", "as_arrays"])
@pytest.mark.parametrize("name", list(CASES))
def test_restored_callback_goes_on_like_the_original(tmp_path, name, stored):
    case = CASES[name]
    split, snapshot = start(case, tmp_path / "a")
    copy = fork(split, tmp_path, "b")
    if stored:  # as storage may give it back: every number a 0-d array
        snapshot = jax.tree.map(np.asarray, snapshot)
    original = go_on(split, split.callback, split.directory)
    resumed = resume(split, case, copy, snapshot)
    assert same(resumed.outcome(case.decisions), original.outcome(case.decisions))


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case.snapshot_matters])
def test_without_the_snapshot_a_fresh_callback_decides_otherwise(tmp_path, name):
    case = CASES[name]
    split, _ = start(case, tmp_path / "a")
    original = go_on(split, split.callback, split.directory)
    fresh = resume(split, case, fork(split, tmp_path, "b"), None)
    assert fresh.elapsed.steps != original.elapsed.steps or not same(fresh.state, original.state)


def test_early_stopping_restores_the_best_weights_of_before_the_snapshot(tmp_path):
    case = CASES["early_stopping_period_restore_best"]
    split, snapshot = start(case, tmp_path)
    resumed = resume(split, case, tmp_path, snapshot)
    assert resumed.elapsed.steps == 6 and resumed.callback.stopped
    # The state after step 1, the best: the snapshot holds it, the resumed run never saw it.
    assert float(resumed.state["w"]) == pytest.approx(LOSSES[0] + LOSSES[1])
    assert int(resumed.state["steps"]) == 2


@pytest.mark.parametrize("name", list(CASES))
def test_a_snapshot_does_not_change_when_the_callback_goes_on(tmp_path, name):
    split, snapshot = start(CASES[name], tmp_path)
    frozen = host(snapshot)
    go_on(split, split.callback, split.directory)
    assert same(snapshot, frozen)
    assert not same(host(split.callback.state_dict()), frozen)  # the callback itself did go on


PLAIN = (jax.Array, np.ndarray, np.generic, bool, int, float, str)


@pytest.mark.parametrize("name", list(CASES))
def test_a_snapshot_is_a_pytree_of_plain_values(tmp_path, name):
    callback = CASES[name].make(tmp_path)
    assert isinstance(callback, ciclo.types.StatefulCallback)
    snapshots = [callback.state_dict()]  # before any step
    run(callback, initial_state(), None, SPLIT)
    snapshots.append(callback.state_dict())
    for snapshot in snapshots:
        assert isinstance(snapshot, dict)
        leaves = jax.tree.leaves(snapshot)
        assert all(isinstance(leaf, PLAIN) for leaf in leaves), leaves


def test_every_public_callback_is_classified():
    classes = {
        name: obj
        for name in ciclo.types.__all__
        if inspect.isclass(obj := getattr(ciclo.types, name))
        and obj.__module__.startswith(("ciclo._src.callbacks.", "ciclo._src.loops.evaluation"))
        and not typing.is_typeddict(obj)  # keyword sets such as RestoreOptions
    }
    assert set(classes) == set(STATEFUL) | set(STATELESS)
    for name, cls in classes.items():
        assert issubclass(cls, ciclo.Callback), name
        assert (cls.state_dict is not ciclo.Callback.state_dict) == (name in STATEFUL), name
    for prefix in STATEFUL.values():
        assert any(case.startswith(prefix) for case in CASES), prefix


# --- checkpoint: a directory that went on after the snapshot ------------------------------------------


@pytest.mark.parametrize("name", CHECKPOINT_CASES)
def test_checkpoint_resumes_on_a_directory_ahead_of_its_snapshot(tmp_path, name, caplog):
    """A run killed after its backup left newer checkpoints: the resumed run keeps them, silently."""
    case = CASES[name]
    split, _ = start(case, tmp_path / "reference")
    reference = go_on(split, split.callback, split.directory)

    split, snapshot = start(case, tmp_path / "killed")
    go_on(split, split.callback, split.directory, stop=8)
    split.callback.close()
    unrestored_directory = fork(split, tmp_path, "unrestored")

    with caplog.at_level(logging.WARNING, logger="ciclo"):
        resumed = resume(split, case, split.directory, snapshot)
    assert not caplog.records
    assert same(resumed.outcome(case.decisions), reference.outcome(case.decisions))
    resumed.callback.close()

    # Without the snapshot, the resumed run takes the checkpoints there for another run's: it refuses
    # to save among them (and deletes none).
    before = sorted(name for name in os.listdir(unrestored_directory) if name.isdigit())
    with pytest.raises(FileExistsError, match="another run"):
        resume(split, case, unrestored_directory, None)
    assert sorted(name for name in os.listdir(unrestored_directory) if name.isdigit()) == before


def test_checkpoint_snapshot_keeps_the_newest_step_the_directory_lacks(tmp_path):
    ckpt = ciclo.checkpoint(tmp_path / "a", keep=None)
    ckpt.save(5, initial_state())
    snapshot = ckpt.state_dict()
    ckpt.close()
    # A save still in flight when the run was killed never reached the directory.
    resumed = ciclo.checkpoint(tmp_path / "b", keep=None)
    resumed.load_state_dict(snapshot)
    assert resumed.state_dict() == {"newest_step": 5, "newest_at_start": None, "warned": False}
    resumed.save(5, initial_state())  # the snapshot's run saved step 5 already
    resumed.save(6, initial_state())
    assert resumed.all_steps() == [6]
    resumed.close()


# --- errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_a_snapshot_of_another_callback_is_refused(tmp_path, name):
    callback = CASES[name].make(tmp_path)
    if isinstance(callback, ciclo.types.Checkpoint):
        foreign = ciclo.early_stopping("loss").state_dict()
    else:
        foreign = {"newest_step": 3, "newest_at_start": None, "warned": False}
    with pytest.raises(ValueError, match=r"missing: \[.+unknown: \[."):
        callback.load_state_dict(foreign)
    with pytest.raises(TypeError, match="state_dict"):
        callback.load_state_dict([1, 2])


# --- the guide's example ----------------------------------------------------------------------------


def test_the_guide_example_runs():
    blocks = [code for code, _ in python_blocks(DOCS / "guide.md") if "load_state_dict" in code]
    assert len(blocks) == 1
    exec(
        compile(blocks[0], "guide.md[callback state]", "exec", dont_inherit=True), {"__name__": "docs_guide"}
    )


class _Counter(ciclo.Callback):
    def __init__(self, key: Any = "counter") -> None:
        self.key = key

    def state_dict(self) -> Any:
        return 0

    @property
    def state_key(self) -> Any:
        return self.key


@pytest.mark.parametrize(
    ("keys", "error", "match"),
    [
        (
            ["counter", "counter"],
            ValueError,
            "two stateful callbacks of this loop save their state under the key",
        ),
        ([""], TypeError, "the state_key of .* must be a non-empty str, got ''"),
    ],
)
def test_state_keys_are_refused_before_the_first_step(keys, error, match):
    steps: list[int] = []
    callbacks = [_Counter(key) for key in keys]
    with pytest.raises(error, match=match):
        ciclo.loop(None, range(3), {ciclo.every(1): [*callbacks, lambda: steps.append(1)]})
    assert steps == []
