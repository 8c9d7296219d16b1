"""`state.model` of haiku states: what the transformed function's `init` gives, trained."""

from __future__ import annotations

import haiku as hk
import jax
import numpy as np
import optax
import pytest

import ciclo

# haiku's BatchNorm (`decay**counter`) and hk.dropout (bool mask times float32) need standard promotion.
pytestmark = pytest.mark.usefixtures("standard_dtype_promotion")

X = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
Y = np.arange(8, dtype=np.int32) % 3
SETTINGS = {"tx": optax.adam(1e-2), "losses": {"loss": optax.softmax_cross_entropy_with_integer_labels}}


def forward(x: jax.Array, is_training: bool) -> jax.Array:
    x = hk.BatchNorm(True, True, 0.9)(hk.Linear(16)(x), is_training=is_training)
    x = hk.dropout(hk.next_rng_key(), 0.5, x) if is_training else x
    return hk.Linear(3)(x)


def train(state: ciclo.types.ModelState) -> ciclo.types.ModelState:
    for _ in range(3):
        _, state = state.train_step((X, Y))
    return state


def test_with_state_gives_params_and_state() -> None:
    transformed = hk.transform_with_state(forward)
    initial = ciclo.create_haiku_state(transformed, inputs=X[:1], **SETTINGS)
    state = train(initial)
    params, haiku_state = state.model
    assert sorted(haiku_state) == ["batch_norm/~/mean_ema", "batch_norm/~/var_ema"]
    assert not np.allclose(
        haiku_state["batch_norm/~/mean_ema"]["average"],
        initial.model_state["batch_norm/~/mean_ema"]["average"],
    )
    outputs, _ = transformed.apply(params, haiku_state, jax.random.key(0), X, is_training=False)
    logs, _ = state.predict_step(X)
    np.testing.assert_allclose(outputs, logs.outputs.preds, rtol=1e-5, atol=1e-6)


def test_without_state_gives_params() -> None:
    transformed = hk.transform(lambda x: hk.nets.MLP([16, 3])(x))
    state = train(ciclo.create_haiku_state(transformed, inputs=X[:1], **SETTINGS))
    params = state.model
    assert sorted(params) == ["mlp/~/linear_0", "mlp/~/linear_1"]
    logs, _ = state.predict_step(X)
    np.testing.assert_allclose(transformed.apply(params, None, X), logs.outputs.preds, rtol=1e-5, atol=1e-6)


def test_a_function_without_haiku_state_gives_an_empty_one() -> None:
    transformed = hk.transform_with_state(lambda x: hk.Linear(3)(x))
    state = train(ciclo.create_haiku_state(transformed, inputs=X[:1], **SETTINGS))
    assert state.model_state is None
    params, haiku_state = state.model
    assert haiku_state == {}
    outputs, _ = transformed.apply(params, haiku_state, None, X)
    logs, _ = state.predict_step(X)
    np.testing.assert_allclose(outputs, logs.outputs.preds, rtol=1e-5, atol=1e-6)
