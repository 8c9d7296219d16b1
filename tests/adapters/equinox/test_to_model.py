"""`state.model` of equinox states: the trained module, or `(module, state)` for a stateful one."""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
import optax
import pytest

import ciclo

X = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
Y = np.arange(8, dtype=np.int32) % 3
SETTINGS = {"tx": optax.adam(1e-2), "losses": {"loss": optax.softmax_cross_entropy_with_integer_labels}}


def layers() -> list[eqx.Module]:
    k1, k2 = jax.random.split(jax.random.key(0))
    return [
        eqx.nn.Linear(4, 16, key=k1),
        eqx.nn.BatchNorm(16, axis_name="batch", mode="batch"),
        eqx.nn.Lambda(jax.nn.relu),
        eqx.nn.Dropout(0.5),
        eqx.nn.Linear(16, 3, key=k2),
    ]


def train(state: ciclo.types.ModelState) -> ciclo.types.ModelState:
    for _ in range(3):
        _, state = state.train_step((X, Y))
    return state


# eqx.nn.BatchNorm's inference computes `momentum**counter`, a Python float to an int32 power.
@pytest.mark.usefixtures("standard_dtype_promotion")
def test_a_stateful_module_comes_back_with_its_state() -> None:
    module, module_state = eqx.nn.make_with_state(eqx.nn.Sequential)(layers())
    state = train(ciclo.create_equinox_state(module, state=module_state, **SETTINGS))
    model, model_state = state.model
    assert isinstance(model, eqx.nn.Sequential) and isinstance(model_state, eqx.nn.State)
    assert not np.allclose(model.layers[4].weight, module.layers[4].weight)  # trained
    assert not model.layers[3].inference  # as built: the caller switches to inference
    assert any(  # the batch statistics came along
        not np.allclose(after, before)
        for after, before in zip(jax.tree.leaves(model_state), jax.tree.leaves(module_state), strict=True)
    )
    # Equinox modules act on one example: vmap over the batch, with the state shared.
    run = jax.vmap(eqx.nn.inference_mode(model), in_axes=(0, None), out_axes=(0, None), axis_name="batch")
    outputs, _ = run(X, model_state)
    logs, _ = state.predict_step(X)
    np.testing.assert_allclose(outputs, logs.outputs.preds, rtol=1e-5, atol=1e-6)


def test_a_module_without_state_comes_back_alone() -> None:
    k1, k2 = jax.random.split(jax.random.key(0))
    module = eqx.nn.MLP(4, 3, 16, 1, key=k1)
    state = train(ciclo.create_equinox_state(module, **SETTINGS))
    model = state.model
    assert isinstance(model, eqx.nn.MLP)
    assert not np.allclose(model.layers[0].weight, module.layers[0].weight)
    logs, _ = state.predict_step(X)
    np.testing.assert_allclose(jax.vmap(model)(X), logs.outputs.preds, rtol=1e-5, atol=1e-6)
