"""ciclo.summary of flax states: one row per top-level linen submodule or nnx attribute."""

from __future__ import annotations

import io

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from support import summary

import ciclo


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array, training: bool = False) -> jax.Array:
        x = nn.Conv(4, (3, 3))(x)
        x = nn.BatchNorm(use_running_average=not training)(x)
        return nn.Dense(10)(x.reshape((x.shape[0], -1)))


def test_linen() -> None:
    state = ciclo.create_flax_state(CNN(), inputs=jnp.zeros((1, 8, 8, 1)), tx=optax.adam(1e-3))
    rows = summary.parse(ciclo.summary(state, file=io.StringIO()))

    assert rows == summary.expected_rows(state, dict(state.params))
    assert list(rows)[:3] == ["BatchNorm_0", "Conv_0", "Dense_0"]
    assert rows["Conv_0"] == (3 * 3 * 1 * 4 + 4, 4 * (3 * 3 * 4 + 4))
    assert rows["Dense_0"][0] == 8 * 8 * 4 * 10 + 10
    assert rows["model state"] == (None, 4 * 2 * 4)  # batch_stats: mean and var of 4 channels
    assert rows["optimizer state"] == (None, 2 * rows["params"][1] + 4)  # adam: mu, nu and a count


class Mlp(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(3, 5, rngs=rngs)
        self.out = nnx.Linear(5, 2, use_bias=False, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(nnx.relu(self.hidden(x)))


def test_nnx() -> None:
    state = ciclo.create_flax_state(Mlp(nnx.Rngs(0)), tx=optax.sgd(0.1))
    rows = summary.parse(ciclo.summary(state, file=io.StringIO()))

    assert {name: rows[name] for name in ("hidden", "out")} == {"hidden": (20, 80), "out": (10, 40)}
    assert rows["params"] == summary.count(state.params) == (30, 120)
    assert rows["total"] == (30, summary.count(state)[1])
