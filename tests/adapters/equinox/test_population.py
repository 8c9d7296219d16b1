"""Populations of equinox models (dropout) match separate runs."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import optax
from support.blobs import blob_batches
from support.population import adam, assert_matches_separate_runs

import ciclo

DATA = blob_batches(4, features=4, classes=3, batch=8)


def make(seed: int, learning_rate: float) -> Any:
    k1, k2 = jax.random.split(jax.random.key(seed))
    model = eqx.nn.Sequential(
        [
            eqx.nn.Linear(4, 8, key=k1),
            eqx.nn.Lambda(jax.nn.relu),
            eqx.nn.Dropout(0.3),
            eqx.nn.Linear(8, 3, key=k2),
        ]
    )
    return ciclo.create_equinox_state(
        model, key=seed, tx=adam(learning_rate), losses=optax.softmax_cross_entropy_with_integer_labels
    )


def test_an_equinox_population_matches_separate_runs() -> None:
    assert_matches_separate_runs(make, DATA, "loss")
