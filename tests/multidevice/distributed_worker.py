"""One process of the 2-process `jax.distributed` test: trains, then saves what it ended with.

Usage: python distributed_worker.py PROCESS_ID PORT STRATEGY MODEL OUT_NPZ [prefetch | options | BACKUP_DIR]

STRATEGY `mesh` is `MESH`: 4 devices per process, the tensor axis inside each process and the
data axis across the two; it then also trains `MODEL` 3 steps with a backup to BACKUP_DIR. With
`prefetch`, the batches come through `ciclo.prefetch_to_device`: each process's
rows are made global arrays ahead of the step, which then moves nothing. With
`options`, MODEL is ignored: a `ciclo.types.ModelState` with every training option
(`training.TRAINING_OPTIONS`) trains on `training.class_batches()`.
"""

from __future__ import annotations

import os
import sys

from support.processes import device_flags

# Before jax is imported: each process has 2 CPU devices (4 for the mesh), whatever the parent set.
DEVICES = 4 if sys.argv[3] == "mesh" else 2
os.environ["XLA_FLAGS"] = device_flags(DEVICES)

# A multi-host script imports everything first, then initializes jax.distributed: importing
# ciclo (here through the test helpers) must not start the XLA backend.
import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from support import training  # noqa: E402

import ciclo  # noqa: E402
from ciclo import managed  # noqa: E402

# training.init_mlp's layers 8 -> 64 -> 64 -> 1, split Megatron-style: the first kernel by its output
# (its bias along), the second by its input; the rest (fallback "fsdp", no such axis) replicated.
MESH_RULES = [(r"^0/w$", P(None, "tensor")), (r"^0/b$", P("tensor")), (r"^1/w$", P("tensor", None))]
MESH = ciclo.strategies.MeshParallel(axes={"data": 2, "tensor": 4}, rules=MESH_RULES)

jax.config.update("jax_cpu_collectives_implementation", "gloo")


def train_with_options(process_id: int, strategy: str, out: str) -> None:
    rows = slice(process_id * training.BATCH // 2, (process_id + 1) * training.BATCH // 2)
    state = training.options_state(strategy)
    for x, y in training.class_batches():
        _, state = state.train_step((x[rows], y[rows]))
    state = state.with_strategy("eager")
    trees = {"params": state.params, "ema": state.ema_params, "scale": state.loss_scale}
    np.savez(
        out,
        **{
            f"{name}_{i}": np.asarray(leaf)
            for name, tree in trees.items()
            for i, leaf in enumerate(jax.tree.leaves(tree))
        },
    )


def backup_loop(state: managed.ManagedState, rows: slice, backup: str | None) -> list[int]:
    """3 steps with a backup at the end, each process writing the shards its devices hold.

    Returns the samples counted by that run and by one fed through `prefetch_to_device`.
    """
    data = [(x[rows], y[rows]) for x, y in training.batches(6)]
    train = {ciclo.every(1): training.train_step}
    _, _, elapsed = ciclo.loop(state, data, train, stop=3, backup=backup)
    _, _, prefetched = ciclo.loop(
        state, ciclo.prefetch_to_device(data, strategy=state.strategy), train, stop=3
    )
    return [elapsed.samples, prefetched.samples]


def main(process_id: int, port: int, strategy: str, model: str, out: str, option: str | None) -> None:
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=2,
        process_id=process_id,
        initialization_timeout=120,
    )
    assert jax.process_count() == 2 and jax.local_device_count() == DEVICES
    if option == "options":
        train_with_options(process_id, strategy, out)
        jax.distributed.shutdown()
        return
    prefetch = option == "prefetch"

    rows = slice(process_id * training.BATCH // 2, (process_id + 1) * training.BATCH // 2)
    state = training.managed_state(model, MESH if strategy == "mesh" else strategy)
    samples: list[int] = []
    if strategy == "mesh":
        # The tensor axis lies inside this process: its row of the mesh is its own devices.
        assert {device.process_index for device in MESH.mesh.devices[process_id]} == {process_id}
        samples = backup_loop(state, rows, option)
    # Each process feeds only its own rows of the global batch.
    batches = [(x[rows], y[rows]) for x, y in training.batches()]
    feed = ciclo.prefetch_to_device(batches, size=2, strategy=state.strategy) if prefetch else batches
    for batch in feed:
        if prefetch:  # a global array already: the step moves nothing
            assert not batch[0].is_fully_addressable and batch[0].shape[0] == training.BATCH
        with jax.transfer_guard("disallow" if prefetch else "allow"):
            logs, state = training.train_step(state, batch)
    x, y = training.batches(1, seed=1)[0]
    eval_logs, state = training.eval_step(state, (x[rows], y[rows]))

    params = state.with_strategy("eager").params
    leaves = {f"param_{i}": np.asarray(leaf) for i, leaf in enumerate(jax.tree.leaves(params))}
    np.savez(
        out,
        **leaves,
        loss=float(logs.losses.mse),
        preds=np.asarray(eval_logs.outputs.preds),
        sharded=[str(leaf.sharding.spec) for leaf in jax.tree.leaves(state.params)],
        samples=samples,
    )
    jax.distributed.shutdown()


if __name__ == "__main__":
    pid, port, strategy, model, out, *options = sys.argv[1:]
    main(int(pid), int(port), strategy, model, out, options[0] if options else None)
