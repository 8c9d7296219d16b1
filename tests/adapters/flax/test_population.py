"""Populations of flax models (linen and nnx, with batch statistics and dropout) match separate runs."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from support.blobs import blob_batches
from support.population import adam, assert_matches_separate_runs

import ciclo

DATA = blob_batches(4, features=4, classes=3, batch=8)
LOSS = optax.softmax_cross_entropy_with_integer_labels


class Linen(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array, *, training: bool = False) -> jax.Array:
        x = nn.BatchNorm(use_running_average=not training)(nn.Dense(8, use_bias=False)(x))
        x = nn.Dropout(0.3, deterministic=not training)(nn.relu(x))
        return nn.Dense(3)(x)


class Nnx(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.dense = nnx.Linear(4, 8, use_bias=False, rngs=rngs)
        self.norm = nnx.BatchNorm(8, rngs=rngs)
        self.dropout = nnx.Dropout(0.3, rngs=rngs)
        self.out = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(self.dropout(nnx.relu(self.norm(self.dense(x)))))


def make_linen(seed: int, learning_rate: float) -> Any:
    return ciclo.create_flax_state(
        Linen(), inputs=jnp.zeros((1, 4)), key=seed, tx=adam(learning_rate), losses=LOSS
    )


def make_nnx(seed: int, learning_rate: float) -> Any:
    return ciclo.create_flax_state(Nnx(nnx.Rngs(seed)), key=seed, tx=adam(learning_rate), losses=LOSS)


def test_a_linen_population_matches_separate_runs() -> None:
    assert_matches_separate_runs(make_linen, DATA, "loss")


def test_an_nnx_population_matches_separate_runs() -> None:
    assert_matches_separate_runs(make_nnx, DATA, "loss")
