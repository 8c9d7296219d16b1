"""A partial restore into an nnx state reports its leaves in one spelling, the one ciclo.summary uses."""

from __future__ import annotations

import io
from pathlib import Path

import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import ciclo


class Mlp(nnx.Module):
    def __init__(self, classes: int, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(3, 5, rngs=rngs)
        self.out = nnx.Linear(5, classes, rngs=rngs)

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        return self.out(nnx.relu(self.hidden(x)))


def test_kept_restored_and_unused_leaves_are_spelled_alike(tmp_path: Path) -> None:
    ckpt = ciclo.checkpoint(tmp_path)
    ckpt.save(1, ciclo.create_flax_state(Mlp(3, nnx.Rngs(0)), tx=optax.sgd(0.1)))
    ckpt.close()
    target = ciclo.create_flax_state(Mlp(4, nnx.Rngs(1)), tx=optax.sgd(0.1))
    _, report = ciclo.restore_checkpoint(tmp_path, target, partial=True, report=True)
    kept = dict(report.kept)
    # An nnx variable's last `value` is left out, as ciclo.summary and the mesh rules leave it out.
    assert "params/out/bias" in kept and "params/out/bias" in report.unused
    assert "params/hidden/kernel" in report.restored
    paths = [*kept, *report.restored, *report.unused]
    assert not [path for path in paths if any(mark in path for mark in "[].'") or path.endswith("value")]
    # A strict restore's structure error spells them alike.
    with pytest.raises(ValueError) as error:
        ciclo.restore_checkpoint(tmp_path, target)
    assert "\n  params/out/bias: the checkpoint holds shape (3,) float32, the target has shape (4,)" in str(
        error.value
    )
    assert not [mark for mark in ("['", ".value", "/value") if mark in str(error.value)]
    # The top-level names are the rows of ciclo.summary.
    table = ciclo.summary(target, file=io.StringIO())
    assert all(name in table for name in ("hidden", "out"))
