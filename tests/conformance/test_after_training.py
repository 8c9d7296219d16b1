"""After training, per adapter: the best checkpoint, restored partially in a new process, predicts.

One new process restores every installed adapter's checkpoint (a process per adapter would import
JAX, ciclo and orbax once each): `nox -s conformance` (`--dist loadgroup`) runs this module's tests
on one pytest-xdist worker, where the session-scoped fixture trains each adapter and starts that process once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import numpy as np
import pytest
from conformance.conftest import CLASSES, FEATURES, INSTALLED, STANDARD_PROMOTION, blobs, build

import ciclo

pytestmark = pytest.mark.xdist_group("after_training")

TRAIN, TEST = blobs(4, seed=0), blobs(1, seed=1)

FRESH_PROCESS = textwrap.dedent(
    """
    import json, sys, traceback
    import jax, numpy as np, pytest
    import ciclo
    from conformance.adapters import TABLE

    inputs_file, jobs = sys.argv[1], json.loads(sys.argv[2])
    inputs = np.load(inputs_file)
    results = {{}}
    for name, directory, out in jobs:
        print(f"=== adapter {{name}} ===", file=sys.stderr, flush=True)  # its part of stderr
        try:
            (row,) = [row for row in TABLE if row.name == name]
            adapter = row.load()
            # Only the model and its inputs: no tx, losses, metrics, precision or EMA.
            state = adapter.make_state("mlp", features={features}, classes={classes}, key=jax.random.key(1))
            best = dict(step="best", partial=True)
            restored, report = ciclo.restore_checkpoint(directory, state, **best, report=True)
            ema = ciclo.restore_checkpoint(directory, state, **best, params_from="ema_params")
            with pytest.raises(ValueError) as refusal:
                restored.train_step((inputs, np.zeros(len(inputs), np.int32)))
            np.savez(
                out,
                preds=restored.predict_step(inputs)[0].outputs.preds,
                ema=ema.predict_step(inputs)[0].outputs.preds,
            )
            results[name] = {{"kept": report.kept, "refusal": str(refusal.value)}}
        except Exception:
            results[name] = {{"error": traceback.format_exc()}}
        sys.stderr.flush()
    print(json.dumps(results))
    """
)


@dataclasses.dataclass
class Restored:
    """One adapter's best checkpoint as trained here, and what the new process made of it."""

    best: Any  # the best state, restored here; an exception where training failed
    result: dict[str, Any]  # the new process's report: `kept` and `refusal`, or `error`
    stderr: str  # the new process's stderr while it restored this adapter's checkpoint
    out: Path  # its predictions, `preds` and `ema`


def promotion(name: str) -> contextlib.AbstractContextManager[Any]:
    """The dtype promotion each adapter's tests run with (conftest's `STANDARD_PROMOTION`)."""
    return jax.numpy_dtype_promotion("standard") if name in STANDARD_PROMOTION else contextlib.nullcontext()


# Session scope: on a pytest-xdist worker the items of other modules run between this module's, and a
# module-scoped fixture would be torn down and built again (twice in a fresh-clone run, 19 s each).
@pytest.fixture(scope="session")
def restored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Restored]:
    """Every installed adapter trained to a best checkpoint, each restored in one new process."""
    tmp_path = tmp_path_factory.mktemp("after_training")
    inputs = TEST[0][0]
    np.save(tmp_path / "inputs.npy", inputs)
    trained: dict[str, Any] = {}
    for row in INSTALLED:
        adapter = row.load()
        try:
            with promotion(row.name):
                state = build(adapter, strategy="jit", precision="16-mixed", ema_decay=0.5)
                ckpt = ciclo.checkpoint(tmp_path / row.name, monitor="loss", keep=1)
                ciclo.train_loop(state, TRAIN, callbacks=[ckpt], epoch_duration=1, stop=4)
                assert ckpt.best_step() is not None
                trained[row.name] = ckpt.restore(state, step="best")
        except Exception as error:  # the adapter's own test raises it
            trained[row.name] = error
    jobs = [
        (name, str(tmp_path / name), str(tmp_path / f"{name}.npz"))
        for name, best in trained.items()
        if not isinstance(best, Exception)
    ]
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    script = FRESH_PROCESS.format(features=FEATURES, classes=CLASSES)
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "inputs.npy"), json.dumps(jobs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    split = re.split(r"^=== adapter (\S+) ===$", done.stderr, flags=re.MULTILINE)
    parts = dict(zip(split[1::2], split[2::2], strict=True))
    return {
        name: Restored(best, results.get(name, {}), parts.get(name, ""), tmp_path / f"{name}.npz")
        for name, best in trained.items()
    }


def test_a_new_process_predicts_with_the_best_checkpoint_and_its_ema_weights(
    adapter: ModuleType, restored: dict[str, Restored]
) -> None:
    mine = restored[adapter.NAME]
    if isinstance(mine.best, Exception):
        raise mine.best
    assert "error" not in mine.result, mine.result["error"]
    # The state for inference computes in float32: the trained state's parameters, without mixed precision.
    best = mine.best.replace(
        options=dataclasses.replace(mine.best.options, precision=ciclo.types.Precision.of("32"))
    )
    inputs = TEST[0][0]
    assert mine.result["kept"] == []
    creator = adapter.ENTRY_POINT or "create_model_state"
    assert "created without tx= (for inference)" in mine.result["refusal"]
    assert f"to {creator} to train it" in mine.result["refusal"]
    assert "restored the checkpoint" in mine.stderr  # the one-line summary
    out = np.load(mine.out)
    np.testing.assert_array_equal(out["preds"], np.asarray(best.predict_step(inputs)[0].outputs.preds))
    np.testing.assert_array_equal(
        out["ema"], np.asarray(best.with_ema_params().predict_step(inputs)[0].outputs.preds)
    )
    assert not np.array_equal(out["preds"], out["ema"])
