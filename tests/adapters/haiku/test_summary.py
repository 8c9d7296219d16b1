"""ciclo.summary of haiku states: one row per haiku module (the keys of its params)."""

from __future__ import annotations

import io

import haiku as hk
import jax
import numpy as np
import optax
import pytest
from support import summary

import ciclo

# haiku's BatchNorm computes `decay**counter`, which strict promotion rejects.
pytestmark = pytest.mark.usefixtures("standard_dtype_promotion")


def forward(x: jax.Array, is_training: bool) -> jax.Array:
    x = hk.BatchNorm(True, True, 0.9)(hk.Linear(16)(x), is_training=is_training)
    return hk.Linear(3)(x)


def test_haiku() -> None:
    transformed = hk.transform_with_state(forward)
    state = ciclo.create_haiku_state(transformed, inputs=np.zeros((1, 4), np.float32), tx=optax.adam(1e-3))
    rows = summary.parse(ciclo.summary(state, file=io.StringIO()))

    assert rows == summary.expected_rows(state, dict(state.params))
    assert list(rows)[:3] == ["batch_norm", "linear", "linear_1"]
    assert rows["linear"] == (4 * 16 + 16, 4 * (4 * 16 + 16))
    assert rows["batch_norm"] == (32, 128)  # scale and offset
    assert rows["model state"][1] == summary.count(state.model_state)[1] > 0
