"""One process of the another-mesh test: restores a checkpoint and resumes a backup on its own devices.

Usage: python another_mesh_worker.py DEVICES STRATEGY CHECKPOINT_DIR BACKUP_DIR STOP OUT_NPZ
   or: python another_mesh_worker.py DEVICES pmap CHECKPOINT_DIR (prints the refusal of a pmap restore)

Restores the checkpoint into a target made under STRATEGY (another key, so that
only a restore gives the saved values), resumes the backup's training up to STOP
steps, and saves both (`checkpoint_<i>`, `resumed_<i>`), with `same_sharding`:
whether each restored array has its target's sharding, and `devices`: the devices
each restored parameter lies on.
"""

from __future__ import annotations

import os
import sys

from support.processes import device_flags

# Before jax is imported: the device count is fixed per process.
os.environ["XLA_FLAGS"] = device_flags(int(sys.argv[1]))
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from support.training import batches, mlp_state  # noqa: E402

import ciclo  # noqa: E402


def main(devices: int, strategy: str, checkpoint: str, backup: str, stop: int, out: str) -> None:
    assert jax.device_count() == devices, jax.devices()
    target = mlp_state(strategy, key=1)
    restored = ciclo.restore_checkpoint(checkpoint, target)
    leaves, wanted = jax.tree.leaves(restored), jax.tree.leaves(target)
    resumed, _, _ = ciclo.train_loop(mlp_state(strategy), batches(6), stop=stop, backup=backup)
    np.savez(
        out,
        same_sharding=[leaf.sharding == want.sharding for leaf, want in zip(leaves, wanted, strict=True)],
        devices=[len(leaf.sharding.device_set) for leaf in jax.tree.leaves(restored.params)],
        replicated=[leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(restored.params)],
        **{f"checkpoint_{i}": np.asarray(leaf) for i, leaf in enumerate(leaves)},
        **{f"resumed_{i}": np.asarray(leaf) for i, leaf in enumerate(jax.tree.leaves(resumed.params))},
    )


def pmap_refusal(devices: int, checkpoint: str) -> None:
    """Prints why the checkpoint does not restore onto a pmap state on this process's devices."""
    assert jax.device_count() == devices, jax.devices()
    try:
        ciclo.restore_checkpoint(checkpoint, mlp_state("pmap"))
    except ValueError as error:
        print(error)
    else:
        print("restored")


if __name__ == "__main__":
    if sys.argv[2] == "pmap":
        pmap_refusal(int(sys.argv[1]), sys.argv[3])
        sys.exit()
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
