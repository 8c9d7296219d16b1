"""A population against separate runs of its members: the check every framework's population test makes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import ciclo
from ciclo import managed

SEEDS, RATES = [0, 1], [0.01, 0.001]


class Regression(managed.ManagedState):
    """A plain managed state: least squares, its loss `mse` in training and in evaluation."""

    @managed.train_step
    def train_step(self, batch: Any) -> Any:
        x, y = batch
        return ciclo.logs().add_loss("mse", jnp.mean((x @ self.params["w"] - y) ** 2)), self

    @managed.step
    def test_step(self, batch: Any) -> Any:
        x, y = batch
        return ciclo.logs().add_loss("mse", jnp.mean((x @ self.params["w"] - y) ** 2)), self


def adam(learning_rate: float) -> optax.GradientTransformation:
    """adam with its learning rate injected: what a population's learning-rate sweep needs."""
    return optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate)


def assert_matches_separate_runs(
    make: Callable[..., Any], data: list[Any], loss: str, steps: int = 50
) -> None:
    """Seeds x learning rates trained as one population: each member as `make` trained alone, to rounding."""
    pop = ciclo.population(make, seeds=SEEDS, hparams={"learning_rate": RATES})
    batches = [data[i % len(data)] for i in range(steps)]
    pop, history, _ = ciclo.train_loop(pop, batches, stop=steps)
    assert pop.hparams == {"seed": (0, 0, 1, 1), "learning_rate": (*RATES, *RATES)}
    assert np.shape(history.collect(loss)) == (steps, 4)
    for i, (seed, rate) in enumerate(zip(pop.hparams["seed"], pop.hparams["learning_rate"], strict=True)):
        alone, _, _ = ciclo.train_loop(make(seed=seed, learning_rate=rate), batches, stop=steps)
        member = pop.member(i)
        assert type(member) is type(alone)
        for got, want in zip(jax.tree.leaves(member), jax.tree.leaves(alone), strict=True):
            np.testing.assert_allclose(_data(got), _data(want), rtol=5e-6, atol=1e-6)


def _data(leaf: jax.Array) -> np.ndarray:
    typed_key = jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    return np.asarray(jax.random.key_data(leaf) if typed_key else leaf)
