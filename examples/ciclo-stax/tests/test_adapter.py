"""ciclo-stax's own tests: ciclo's adapter kit (ciclo.testing) checks every clause of the adapter contract."""

from __future__ import annotations

import jax.numpy as jnp
import optax
from ciclo_stax import StaxAdapter
from jax.example_libraries import stax

import ciclo
import ciclo.testing


def mlp(mode: str) -> tuple:
    """A small classifier with dropout, built for `mode` ("train" or "test")."""
    return stax.serial(stax.Dense(32), stax.Relu, stax.Dropout(0.8, mode), stax.Dense(4))


class TestStax(ciclo.testing.AdapterTests):
    """One test per clause of the contract: `pytest -v` lists them."""

    inputs = jnp.zeros((1, 8))

    def make_adapter(self) -> StaxAdapter:
        return StaxAdapter(mlp)


def test_a_model_without_dropout_passes_the_kit() -> None:
    report = ciclo.testing.check_adapter(StaxAdapter(stax.serial(stax.Dense(4))), inputs=jnp.zeros((1, 8)))
    assert isinstance(report, ciclo.testing.AdapterReport)


def test_create_stax_state_is_found_through_the_entry_point() -> None:
    state = ciclo.create_stax_state(
        mlp, inputs=jnp.zeros((1, 8)), tx=optax.sgd(0.1), losses={"loss": optax.l2_loss}
    )
    assert isinstance(state.adapter, StaxAdapter)
