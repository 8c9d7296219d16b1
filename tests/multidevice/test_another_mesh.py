"""Checkpoints and backups written under `fsdp` on 4 devices, read back on 2, 4 and 1 device(s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from support import processes
from support.training import batches, mlp_state

import ciclo

WORKER = Path(__file__).with_name("another_mesh_worker.py")


def _worker(devices: int, strategy: str, checkpoint: Path, backup: Path, stop: int, out: Path) -> str:
    """Runs the worker on `devices` CPU devices; returns its stderr (the resume notes)."""
    env = processes.clean_env()  # the worker sets its device count and platform before importing jax
    command = [
        sys.executable,
        str(WORKER),
        str(devices),
        strategy,
        str(checkpoint),
        str(backup),
        str(stop),
        str(out),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stderr


def test_fsdp_on_4_devices_restores_onto_2_4_and_1(tmp_path: Path) -> None:
    checkpoint, backup = tmp_path / "checkpoint", tmp_path / "backup"
    state = mlp_state("fsdp")
    for batch in batches(3):
        _, state = state.train_step(batch)
    assert not state.params[1]["w"].sharding.is_fully_replicated  # the 64 x 64 weight is split over 4
    saver = ciclo.checkpoint(checkpoint)
    saver.save(3, state)
    saver.close()
    saved = [np.asarray(leaf) for leaf in jax.tree.leaves(state)]
    ciclo.train_loop(mlp_state("fsdp"), batches(6), stop=2, backup=backup)
    uninterrupted, _, _ = ciclo.train_loop(mlp_state("fsdp"), batches(6), stop=6)

    # data_parallel on the same 4 devices: every array replicated.
    target = mlp_state("data_parallel", key=1)
    restored = ciclo.restore_checkpoint(checkpoint, target)
    for leaf, want, value in zip(jax.tree.leaves(restored), jax.tree.leaves(target), saved, strict=True):
        assert leaf.sharding == want.sharding and leaf.sharding.is_fully_replicated
        np.testing.assert_array_equal(np.asarray(leaf), value)

    # fsdp on 2 devices, then jit on 1; the backup goes on from 4 to 2 devices, then from 2 to 1.
    notes = {}
    for devices, strategy, stop in [(2, "fsdp", 4), (1, "jit", 6)]:
        out = tmp_path / f"{devices}.npz"
        notes[devices] = _worker(devices, strategy, checkpoint, backup, stop, out)
        result = np.load(out)
        assert result["same_sharding"].all()
        for i, value in enumerate(saved):
            np.testing.assert_array_equal(result[f"checkpoint_{i}"], value)
        # The params' leaves: b, w of each layer; only the middle weight (64 x 64) is split, over 2.
        assert list(result["devices"]) == [devices] * 6
        assert list(result["replicated"]) == [True, True, True, devices == 1, True, True]
    assert "resuming a backup written on 4 devices onto 2: the run goes on" in notes[2]
    assert "resuming a backup written on 2 devices onto 1: the run goes on" in notes[1]
    assert "resumed train_loop from the backup at step 4" in notes[1]
    # Not bitwise (another device count sums in another order), but the same run to float32 rounding.
    for i, leaf in enumerate(jax.tree.leaves(uninterrupted.params)):
        np.testing.assert_allclose(result[f"resumed_{i}"], np.asarray(leaf), rtol=1e-5, atol=1e-6)


def _save(directory: Path, state: ciclo.types.ModelState) -> None:
    saver = ciclo.checkpoint(directory)
    saver.save(int(state.strategy.unplace(state).step), state)
    saver.close()


def test_a_pmap_checkpoint_restores_only_onto_pmap_on_its_device_count(tmp_path: Path) -> None:
    state = mlp_state("pmap")
    _, state = state.train_step(batches(1)[0])
    _save(tmp_path / "pmap", state)
    restored = ciclo.restore_checkpoint(tmp_path / "pmap", mlp_state("pmap", key=1))
    for leaf, value in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(value))

    # Another strategy on the same 4 devices (partial=True too: it would keep every leaf of the target).
    refusal = (
        r"holds a pmap state saved on 4 device\(s\).*step has shape \(4,\).*onto a state of strategy "
        r"{}.*Restore it onto strategy='pmap' on 4 device\(s\).*save from a data_parallel state"
    )
    for strategy, partial in [("data_parallel", False), ("data_parallel", True), ("jit", False)]:
        target = mlp_state(strategy)
        name = type(target.strategy).__name__
        with pytest.raises(ValueError, match=refusal.format(name)):
            ciclo.restore_checkpoint(tmp_path / "pmap", target, partial=partial)
    # The other way: a data_parallel checkpoint onto pmap.
    _save(tmp_path / "data_parallel", state.with_strategy("data_parallel"))
    with pytest.raises(ValueError, match=r"without pmap's device axis.*onto a pmap state on 4 device\(s\)"):
        ciclo.restore_checkpoint(tmp_path / "data_parallel", mlp_state("pmap"))
    # Saved from data_parallel, it restores anywhere: here onto jit.
    moved = ciclo.restore_checkpoint(tmp_path / "data_parallel", mlp_state("jit", key=1))
    np.testing.assert_array_equal(np.asarray(moved.params[0]["w"]), np.asarray(state.params[0]["w"][0]))

    # A backup's resume is refused alike (each of its steps, then the whole).
    ciclo.train_loop(mlp_state("pmap"), batches(2), stop=1, backup=tmp_path / "backup")
    with pytest.raises(ValueError, match=r"(?s)no backup in .*step 1: .*holds a pmap state saved on 4 dev"):
        ciclo.train_loop(mlp_state("data_parallel"), batches(2), stop=2, backup=tmp_path / "backup")

    # pmap on 2 devices, in a process of its own.
    env = processes.clean_env()  # the worker sets its 2 devices and the platform itself
    command = [sys.executable, str(WORKER), "2", "pmap", str(tmp_path / "pmap")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "holds a pmap state saved on 4 device(s)" in done.stdout
    assert "cannot be restored onto a pmap state on 2 device(s)" in done.stdout
