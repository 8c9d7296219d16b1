"""`ModelState.model`: the adapter's `to_model`, on the state's variables without any strategy's layout."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo


@dataclasses.dataclass(frozen=True, eq=False)
class Affine:
    """A linear model with a running mean of its inputs as model state; `to_model` gives a function."""

    def init(self, key, inputs):
        return {"w": jax.random.normal(key, (inputs.shape[-1], 2)), "b": jnp.zeros((1, 2))}, jnp.zeros((1, 3))

    def apply(self, params, model_state, inputs, *, key, training):
        if training:
            model_state = 0.9 * model_state + 0.1 * inputs.mean(0, keepdims=True)
        return (inputs - model_state) @ params["w"] + params["b"], model_state

    def to_model(self, params, model_state):
        return lambda inputs: (inputs - model_state) @ params["w"] + params["b"]


@dataclasses.dataclass(frozen=True, eq=False)
class WithoutToModel:
    def init(self, key, inputs):
        return jnp.ones(()), None

    def apply(self, params, model_state, inputs, *, key, training):
        return params * inputs, model_state


def trained(strategy: str) -> ciclo.types.ModelState:
    state = ciclo.create_model_state(
        Affine(),
        inputs=jnp.zeros((1, 3)),
        tx=optax.sgd(0.1),
        losses={"loss": lambda preds, target: (preds.sum(-1) - target) ** 2},
        strategy=strategy,
    )
    rng = np.random.default_rng(0)
    for _ in range(5):
        inputs = rng.normal(size=(4, 3)).astype(np.float32)
        _, state = state.train_step((inputs + 1.0, inputs.sum(-1)))
    return state


@pytest.mark.parametrize("strategy", ["eager", "jit", "data_parallel", "pmap"])
def test_the_model_predicts_as_predict_step(strategy: str) -> None:
    state = trained(strategy)
    inputs = np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32)
    logs, _ = state.predict_step(inputs)
    model = state.model
    assert bool(jnp.any(state.with_strategy("jit").model_state != 0))  # training moved the model state
    np.testing.assert_allclose(model(inputs), logs.outputs.preds, rtol=1e-6)


class Variables(Affine):
    def to_model(self, params, model_state):
        return params, model_state


def test_pmap_gives_the_variables_without_the_device_axis() -> None:
    state = trained("pmap").replace(adapter=Variables())
    assert state.params["w"].shape == (jax.local_device_count(), 3, 2)
    params, model_state = state.model
    assert params["w"].shape == (3, 2) and model_state.shape == (1, 3)


def test_an_adapter_without_to_model_says_what_to_add() -> None:
    state = ciclo.create_model_state(WithoutToModel(), inputs=jnp.ones(2), tx=optax.sgd(0.1))
    assert not isinstance(state.adapter, ciclo.types.SupportsToModel)
    with pytest.raises(AttributeError, match=r"WithoutToModel has no to_model\(params, model_state\)"):
        state.model  # noqa: B018
    assert not hasattr(state, "model")
    assert isinstance(Affine(), ciclo.types.SupportsToModel)
