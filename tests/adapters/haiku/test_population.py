"""Populations of haiku models (batch statistics and dropout) match separate runs."""

from __future__ import annotations

from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp
import optax
import pytest
from support.blobs import blob_batches
from support.population import adam, assert_matches_separate_runs

import ciclo

# haiku's BatchNorm and hk.dropout reject strict dtype promotion (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("standard_dtype_promotion")

DATA = blob_batches(4, features=4, classes=3, batch=8)


def net(x: jax.Array, is_training: bool) -> jax.Array:
    x = hk.Linear(8, with_bias=False)(x)
    x = hk.BatchNorm(create_scale=True, create_offset=True, decay_rate=0.9)(x, is_training=is_training)
    if is_training:
        x = hk.dropout(hk.next_rng_key(), 0.3, x)
    return hk.Linear(3)(jax.nn.relu(x))


def make(seed: int, learning_rate: float) -> Any:
    return ciclo.create_haiku_state(
        net,
        inputs=jnp.zeros((1, 4)),
        key=seed,
        tx=adam(learning_rate),
        losses=optax.softmax_cross_entropy_with_integer_labels,
    )


def test_a_haiku_population_matches_separate_runs() -> None:
    assert_matches_separate_runs(make, DATA, "loss")
