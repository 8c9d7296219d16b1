"""Parameters with a leaf that is not an array are refused with ciclo's error, before optax runs."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
import pytest

import ciclo
from ciclo import managed


def test_a_function_leaf_in_params_is_refused_before_optax(strategy: str) -> None:
    params = {"w": jnp.ones(2), "activation": jax.nn.relu}
    # Without the check optax fails inside zeros_like ("... got custom_jvp").
    with pytest.raises(TypeError, match=r"params/activation is .*not an array.*static field"):
        managed.ManagedState.create(params=params, tx=optax.adam(1e-3), strategy=strategy)


def test_the_error_counts_the_other_leaves() -> None:
    params = [jnp.ones(2), "relu", len]
    with pytest.raises(TypeError, match=r"params/1 is 'relu' \(and 1 more leaves\)"):
        managed.ManagedState.create(params=params, tx=optax.sgd(0.1))


def test_an_adapter_that_returns_a_function_leaf_is_refused(strategy: str) -> None:
    class WithActivation:
        def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Any, Any]:
            return {"w": jnp.zeros(inputs.shape[-1]), "activation": jnp.tanh}, None

        def apply(self, params, model_state, inputs, *, key, training):
            return params["activation"](inputs @ params["w"]), model_state

    with pytest.raises(TypeError, match=r"params/activation is"):
        ciclo.create_model_state(
            WithActivation(), inputs=jnp.ones((1, 2)), tx=optax.sgd(0.1), strategy=strategy
        )


def test_numbers_and_arrays_are_parameters() -> None:
    state = managed.ManagedState.create(
        params={"w": jnp.ones(2), "b": 0.5}, tx=optax.sgd(0.1), strategy="eager"
    )
    state = state.apply_gradients(grads={"w": jnp.ones(2), "b": 1.0})
    assert float(state.params["b"]) == pytest.approx(0.4)


class WithActivation(managed.ManagedState):
    activation: Any = managed.field(static=True)


@managed.train_step
def activated_step(state: WithActivation, batch: jax.Array) -> ciclo.types.Logs:
    return ciclo.logs().add_loss("loss", jnp.mean(state.activation(batch @ state.params["w"]) ** 2))


def test_a_function_in_a_static_field_is_kept_out_of_placement(strategy: str) -> None:
    # What the error recommends: the arrays as params, the function in a static field.
    state = WithActivation.create(
        params={"w": jnp.ones(2)}, activation=jax.nn.relu, tx=optax.sgd(0.1), strategy=strategy
    )
    assert state.activation is jax.nn.relu
    for _ in range(3):
        logs, state = activated_step(state, jnp.ones((4, 2)))
    assert state.activation is jax.nn.relu and int(state.with_strategy("eager").step) == 3
    assert float(logs.losses.loss) < 4.0
