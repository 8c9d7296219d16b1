"""`state.model` of flax states: the linen variables dict and a merged nnx module, trained."""

from __future__ import annotations

import flax.linen as nn
import numpy as np
import optax
from flax import nnx
from support.flax_models import Linen, Nnx

import ciclo
from ciclo_flax import LinenAdapter, NnxAdapter

X = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
Y = np.arange(8, dtype=np.int32) % 3
SETTINGS = {"tx": optax.adam(1e-2), "losses": {"loss": optax.softmax_cross_entropy_with_integer_labels}}


def train(state: ciclo.types.ModelState) -> ciclo.types.ModelState:
    for _ in range(3):
        _, state = state.train_step((X, Y))
    return state


def test_linen_gives_the_variables_dict() -> None:
    module = Linen()
    initial = ciclo.create_flax_state(module, inputs=X[:1], **SETTINGS)
    state = train(initial)
    variables = state.model
    assert isinstance(state.adapter, ciclo.types.SupportsToModel) and isinstance(state.adapter, LinenAdapter)
    assert sorted(variables) == ["batch_stats", "params"]
    assert not np.allclose(
        variables["batch_stats"]["BatchNorm_0"]["mean"],
        initial.model_state["batch_stats"]["BatchNorm_0"]["mean"],
    )
    logs, _ = state.predict_step(X)
    np.testing.assert_allclose(
        module.apply(variables, X, training=False), logs.outputs.preds, rtol=1e-5, atol=1e-6
    )


def test_linen_without_model_state_gives_params_only() -> None:
    state = train(ciclo.create_flax_state(nn.Dense(3), inputs=X[:1], **SETTINGS))
    variables = state.model
    assert list(variables) == ["params"]
    logs, _ = state.predict_step(X)
    np.testing.assert_allclose(nn.Dense(3).apply(variables, X), logs.outputs.preds, rtol=1e-5, atol=1e-6)


def test_nnx_gives_a_new_trained_module() -> None:
    original = Nnx(nnx.Rngs(0))
    before = np.asarray(original.out.kernel[...])
    state = train(ciclo.create_flax_state(original, **SETTINGS))
    model = state.model
    assert isinstance(model, Nnx) and model is not original
    assert isinstance(state.adapter, NnxAdapter)
    assert not np.allclose(model.out.kernel[...], before)  # trained
    assert not np.allclose(model.norm.mean[...], 0.0)  # the batch statistics came along
    model.eval()
    logs, _ = state.predict_step(X)
    np.testing.assert_allclose(model(X), logs.outputs.preds, rtol=1e-5, atol=1e-6)
    # A new module every time: using one leaves the state's variables alone.
    model.out.kernel[...] = 0.0
    assert not np.allclose(state.model.out.kernel[...], 0.0)
