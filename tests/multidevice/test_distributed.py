"""Two processes on 127.0.0.1 train under `jax.distributed` and agree with a one-process run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from support import processes, training

import ciclo

WORKER = Path(__file__).with_name("distributed_worker.py")
TIMEOUT = 300


@pytest.mark.parametrize(
    ("strategy", "options"),
    [("data_parallel", []), ("fsdp", []), ("data_parallel", ["prefetch"])],
    ids=["data_parallel", "fsdp", "data_parallel-prefetch"],
)
def test_two_processes_match_one(strategy: str, options: list[str], tmp_path: Path) -> None:
    port = processes.free_port()
    outs = [tmp_path / f"process_{i}.npz" for i in range(2)]
    commands = [
        [sys.executable, str(WORKER), str(i), str(port), strategy, "mlp", str(outs[i]), *options]
        for i in range(2)
    ]
    # The worker sets its own device count (2 per process).
    codes, output = processes.run_together(
        commands, env=processes.clean_env(), logs=tmp_path, timeout=TIMEOUT
    )
    assert codes == [0, 0], "\n\n".join(output)

    results = [np.load(out) for out in outs]
    expected = jax.tree.leaves(training.reference_params("mlp", training.batches()))
    for i, leaf in enumerate(expected):
        # Both processes hold the same parameters, equal to a one-process run on the same global batches.
        np.testing.assert_array_equal(results[0][f"param_{i}"], results[1][f"param_{i}"])
        np.testing.assert_allclose(results[0][f"param_{i}"], leaf, rtol=1e-5, atol=1e-6)
    assert float(results[0]["loss"]) == float(results[1]["loss"])

    # Outputs come back to the process that fed the rows.
    x, _ = training.batches(1, seed=1)[0]
    params = training.reference_params("mlp", training.batches())
    preds = np.asarray(training.apply_mlp(params, x))
    half = training.BATCH // 2
    np.testing.assert_allclose(results[0]["preds"], preds[:half], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(results[1]["preds"], preds[half:], rtol=1e-5, atol=1e-6)

    specs = list(results[0]["sharded"])
    if strategy == "fsdp":
        assert specs[3] == "P('data',)" and specs.count("P()") == 5, specs  # only the 64 x 64 weight
    else:
        assert set(specs) == {"P()"}, specs


def test_two_processes_train_with_every_training_option_as_one(tmp_path: Path) -> None:
    port = processes.free_port()
    outs = [tmp_path / f"process_{i}.npz" for i in range(2)]
    commands = [
        [sys.executable, str(WORKER), str(i), str(port), "fsdp", "-", str(outs[i]), "options"]
        for i in range(2)
    ]
    codes, output = processes.run_together(
        commands, env=processes.clean_env(), logs=tmp_path, timeout=TIMEOUT
    )
    assert codes == [0, 0], "\n\n".join(output)
    first, second = (dict(np.load(out)) for out in outs)
    assert sorted(first) == sorted(second) and any(name.startswith("ema_") for name in first)
    for name in first:
        np.testing.assert_array_equal(first[name], second[name])
    state = training.options_state("jit")
    for batch in training.class_batches():
        _, state = state.train_step(batch)
    trees = {"params": state.params, "ema": state.ema_params, "scale": state.loss_scale}
    for name, tree in trees.items():
        for i, leaf in enumerate(jax.tree.leaves(tree)):
            # To float16 rounding (its epsilon, 1e-3, on weights of about 0.1): the processes sum their
            # rows' float16 gradients in another order.
            np.testing.assert_allclose(first[f"{name}_{i}"], np.asarray(leaf), rtol=2e-3, atol=5e-4)


def test_a_mesh_spanning_two_processes_trains_as_one_process_and_its_backup_resumes_in_one(
    tmp_path: Path,
) -> None:
    # axes {"data": 2, "tensor": 4} on 2 processes x 4 devices: tensor inside a process, data across.
    port = processes.free_port()
    outs = [tmp_path / f"process_{i}.npz" for i in range(2)]
    backup = tmp_path / "backup"
    commands = [
        [sys.executable, str(WORKER), str(i), str(port), "mesh", "mlp", str(outs[i]), str(backup)]
        for i in range(2)
    ]
    codes, output = processes.run_together(
        commands, env=processes.clean_env(), logs=tmp_path, timeout=TIMEOUT
    )
    assert codes == [0, 0], "\n\n".join(output)
    results = [np.load(out) for out in outs]
    assert list(results[0]["sharded"]) == [  # each layer's b, then w
        "P('tensor',)",  # 0/b: along its kernel's output
        "P(None, 'tensor')",  # 0/w: the kernel's output
        "P()",
        "P('tensor',)",  # 1/w: the kernel's input
        "P()",
        "P()",
    ]
    expected = jax.tree.leaves(training.reference_params("mlp", training.batches()))
    for i, leaf in enumerate(expected):
        # To float32 rounding (rtol 1e-5, atol 1e-6): the tensor split sums its partial products in
        # another order than one device does, each step carries that on.
        np.testing.assert_array_equal(results[0][f"param_{i}"], results[1][f"param_{i}"])
        np.testing.assert_allclose(results[0][f"param_{i}"], leaf, rtol=1e-5, atol=1e-6)
    x, _ = training.batches(1, seed=1)[0]
    preds = np.asarray(training.apply_mlp(training.reference_params("mlp", training.batches()), x))
    np.testing.assert_allclose(np.concatenate([r["preds"] for r in results]), preds, rtol=1e-5, atol=1e-6)

    # The backup of its step 3, written by both processes, resumes in this one process on one device.
    def loop(state: Any, **options: Any) -> Any:
        train = {ciclo.every(1): training.train_step}
        return ciclo.loop(state, training.batches(6), train, stop=6, **options)[0]

    # Counts are global: each process fed half of each batch, with or without prefetch, and the backup
    # resumes in one process fed whole batches.
    assert [list(r["samples"]) for r in results] == [[3 * training.BATCH] * 2] * 2
    resumed = loop(training.managed_state("mlp", "jit"), backup=backup)
    assert int(resumed.step) == 6
    training.assert_trees_close(resumed.params, loop(training.managed_state("mlp", "jit")).params)
