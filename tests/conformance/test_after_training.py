"""After training, per adapter: the best checkpoint, restored partially in a new process, predicts."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import numpy as np
from conformance.conftest import CLASSES, FEATURES, blobs, build

import ciclo

TRAIN, TEST = blobs(4, seed=0), blobs(1, seed=1)

FRESH_PROCESS = textwrap.dedent(
    """
    import json, sys
    import jax, numpy as np, pytest
    import ciclo
    from conformance.adapters import TABLE

    directory, name, inputs_file, out = sys.argv[1:]
    (row,) = [row for row in TABLE if row.name == name]
    adapter = row.load()
    inputs = np.load(inputs_file)
    # Only the model and its inputs: no tx, losses, metrics, precision or EMA.
    state = adapter.make_state("mlp", features={features}, classes={classes}, key=jax.random.key(1))
    restored, report = ciclo.restore_checkpoint(directory, state, step="best", partial=True, report=True)
    ema = ciclo.restore_checkpoint(directory, state, step="best", partial=True, params_from="ema_params")
    with pytest.raises(ValueError) as refusal:
        restored.train_step((inputs, np.zeros(len(inputs), np.int32)))
    np.savez(
        out,
        preds=restored.predict_step(inputs)[0].outputs.preds,
        ema=ema.predict_step(inputs)[0].outputs.preds,
    )
    print(json.dumps({{"kept": report.kept, "refusal": str(refusal.value)}}))
    """
)


def test_a_new_process_predicts_with_the_best_checkpoint_and_its_ema_weights(
    adapter: ModuleType, tmp_path: Path
) -> None:
    state = build(adapter, strategy="jit", precision="16-mixed", ema_decay=0.5)
    ckpt = ciclo.checkpoint(tmp_path / "ckpt", monitor="loss", keep=1)
    ciclo.train_loop(state, TRAIN, callbacks=[ckpt], epoch_duration=1, stop=4)
    best = ckpt.restore(state, step="best")
    assert ckpt.best_step() is not None
    # The state for inference computes in float32: the trained state's parameters, without mixed precision.
    best = best.replace(options=dataclasses.replace(best.options, precision=ciclo.types.Precision.of("32")))
    inputs = TEST[0][0]
    np.save(tmp_path / "inputs.npy", inputs)
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    script = FRESH_PROCESS.format(features=FEATURES, classes=CLASSES)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            str(tmp_path / "ckpt"),
            adapter.NAME,
            str(tmp_path / "inputs.npy"),
            str(tmp_path / "out.npz"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["kept"] == []
    creator = adapter.ENTRY_POINT or "create_model_state"
    assert "created without tx= (for inference)" in result["refusal"]
    assert f"to {creator} to train it" in result["refusal"]
    assert "restored the checkpoint" in done.stderr  # the one-line summary
    out = np.load(tmp_path / "out.npz")
    np.testing.assert_array_equal(out["preds"], np.asarray(best.predict_step(inputs)[0].outputs.preds))
    np.testing.assert_array_equal(
        out["ema"], np.asarray(best.with_ema_params().predict_step(inputs)[0].outputs.preds)
    )
    assert not np.array_equal(out["preds"], out["ema"])
