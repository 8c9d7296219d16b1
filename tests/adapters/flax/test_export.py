"""`ciclo.export` of flax states (linen and nnx), served in a process where flax cannot be imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from support import processes
from support.flax_models import Linen, Nnx

import ciclo

X = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
Y = np.arange(8, dtype=np.int32) % 3
SETTINGS = {
    "tx": optax.adam(1e-2),
    "losses": optax.softmax_cross_entropy_with_integer_labels,
    "ema_decay": 0.5,
}


SERVE = """
import sys
for name in ("flax", "haiku", "equinox"):
    sys.modules[name] = None  # importing any of them raises ImportError
import numpy as np
import ciclo
try:
    import flax
except ImportError:
    pass
else:
    raise AssertionError("flax was importable")
names, inputs, out = sys.argv[1].split(","), np.load(sys.argv[2]), sys.argv[3]
predictions = {}
for name in names:
    predict = ciclo.load_exported(name + ".jax")
    for size in (1, 7):
        predictions[f"{name}-{size}"] = np.asarray(predict(inputs[f"x{size}"]))
np.savez(out, **predictions)
"""


def test_a_served_flax_model_predicts_what_predict_step_does(tmp_path: Path) -> None:
    states = {
        "linen": ciclo.create_flax_state(Linen(), inputs=jnp.zeros((1, 4)), **SETTINGS),
        "nnx": ciclo.create_flax_state(Nnx(nnx.Rngs(0)), **SETTINGS),
    }
    inputs = {
        f"x{size}": np.random.default_rng(size).normal(size=(size, 4)).astype(np.float32) for size in (1, 7)
    }
    expected = {}
    for kind, state in states.items():
        for _ in range(3):
            _, state = state.train_step((X, Y))
        for name, served in {kind: state, f"{kind}_ema": state.with_ema_params()}.items():
            ciclo.export(state, X[:2], tmp_path / f"{name}.jax", use_ema=name.endswith("_ema"))
            for size in (1, 7):
                logs, _ = served.predict_step(inputs[f"x{size}"])
                expected[f"{name}-{size}"] = np.asarray(logs.outputs["preds"])
    np.savez(tmp_path / "inputs.npz", **inputs)
    names = ",".join(f"{kind}{ema}" for kind in states for ema in ("", "_ema"))
    command = [sys.executable, "-c", SERVE, names, "inputs.npz", "out.npz"]
    done = subprocess.run(
        command,
        cwd=tmp_path,
        env=processes.clean_env(JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with np.load(tmp_path / "out.npz") as archive:
        served = dict(archive)
    assert sorted(served) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(served[name], value, rtol=1e-6, atol=1e-6)
    assert not np.allclose(served["linen-7"], served["linen_ema-7"])  # the EMA file holds other weights
