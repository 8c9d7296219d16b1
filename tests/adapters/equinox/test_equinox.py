"""ciclo-equinox specifics: partitioning, eqx.nn.State, vmap and keys, and errors.

What every adapter must do (learning, batch norm, dropout, compiling once,
checkpoints, the package and the `ciclo.types.ModelAdapter` protocol) is checked by
the conformance suite, tests/conformance.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support import blobs as support_blobs

import ciclo
from ciclo_equinox import EquinoxAdapter

FEATURES = 8
CLASSES = 4
HIDDEN = 32
BATCH = 16

LOSSES = {"loss": optax.softmax_cross_entropy_with_integer_labels}
METRICS = {"accuracy": lambda preds, target: preds.argmax(-1) == target}


blob_batches = functools.partial(support_blobs.blob_batches, features=FEATURES, classes=CLASSES, batch=BATCH)


def mlp(key: int = 0) -> eqx.Module:
    k1, k2 = jax.random.split(jax.random.key(key))
    return eqx.nn.Sequential(
        [
            eqx.nn.Linear(FEATURES, HIDDEN, key=k1),
            eqx.nn.Lambda(jax.nn.relu),
            eqx.nn.Linear(HIDDEN, CLASSES, key=k2),
        ]
    )


def bn_dropout(key: int = 0, axis_name: str = "batch") -> tuple[eqx.Module, eqx.nn.State]:
    k1, k2 = jax.random.split(jax.random.key(key))
    return eqx.nn.make_with_state(eqx.nn.Sequential)(
        [
            eqx.nn.Linear(FEATURES, HIDDEN, key=k1),
            eqx.nn.BatchNorm(HIDDEN, axis_name=axis_name, mode="batch"),
            eqx.nn.Lambda(jax.nn.relu),
            eqx.nn.Dropout(0.3),
            eqx.nn.Linear(HIDDEN, CLASSES, key=k2),
        ]
    )


def dropout_mlp(key: int = 0) -> eqx.Module:
    k1, k2 = jax.random.split(jax.random.key(key))
    return eqx.nn.Sequential(
        [eqx.nn.Linear(FEATURES, HIDDEN, key=k1), eqx.nn.Dropout(0.5), eqx.nn.Linear(HIDDEN, CLASSES, key=k2)]
    )


MODELS: dict[str, Callable[[], Any]] = {"mlp": mlp, "bn_dropout": bn_dropout}
"""Model builders by name: a module, or the (module, state) pair of eqx.nn.make_with_state."""


def make_state(kind: str, **kwargs: Any) -> ciclo.types.ModelState:
    settings: dict[str, Any] = {"tx": optax.adam(1e-2), "losses": LOSSES, "metrics": METRICS, **kwargs}
    return ciclo.create_equinox_state(MODELS[kind](), **settings)


# --- the adapter -------------------------------------------------------------------------------


def test_adapters_compare_by_identity():
    adapter, _ = EquinoxAdapter.split(mlp())
    assert adapter == adapter
    assert adapter != EquinoxAdapter.split(mlp())[0]  # one compilation per state


@pytest.mark.parametrize("as_pair", [False, True], ids=["state=", "pair"])
def test_model_state_is_the_eqx_state(as_pair: bool):
    model, state = bn_dropout()
    model_arg = (model, state) if as_pair else model
    train_state = ciclo.create_equinox_state(model_arg, state=None if as_pair else state, tx=optax.sgd(0.1))
    jax.tree.map(np.testing.assert_array_equal, train_state.model_state, state)
    assert train_state.adapter.stateful


def test_batch_norm_with_another_axis_name():
    model, state = bn_dropout(axis_name="examples")
    train_state = ciclo.create_equinox_state(
        model, state=state, tx=optax.sgd(0.1), losses=LOSSES, batch_axis_name="examples"
    )
    logs, _ = train_state.train_step(blob_batches(1)[0])
    assert np.isfinite(float(logs.losses.loss))


def test_predict_runs_the_model_in_inference_mode():
    state = ciclo.create_equinox_state(dropout_mlp(), tx=optax.sgd(0.0), losses=LOSSES)
    inputs = blob_batches(1)[0][0]
    expected = jax.vmap(eqx.nn.inference_mode(dropout_mlp()))(jnp.asarray(inputs))
    logs, _ = state.predict_step(inputs)
    np.testing.assert_allclose(logs.outputs.preds, expected, rtol=1e-5, atol=1e-6)


def test_each_example_gets_its_own_dropout_key():
    adapter, (params, model_state) = EquinoxAdapter.split(dropout_mlp())
    same_rows = jnp.ones((4, FEATURES))
    outputs, _ = adapter.apply(params, model_state, same_rows, key=jax.random.key(0), training=True)
    assert len({tuple(np.asarray(row).tolist()) for row in outputs}) == 4
    outputs, _ = adapter.apply(params, model_state, same_rows, key=jax.random.key(0), training=False)
    assert len({tuple(np.asarray(row).tolist()) for row in outputs}) == 1


class WithFrozenLeaves(eqx.Module):
    """A linear model with leaves that must not be trained: an integer array, a bool array, a float."""

    weight: jax.Array
    permutation: jax.Array
    mask: jax.Array
    scale: float

    def __init__(self) -> None:
        self.weight = jnp.zeros((FEATURES, CLASSES))
        self.permutation = jnp.arange(FEATURES)[::-1]
        self.mask = jnp.ones(CLASSES, bool)
        self.scale = 2.0

    def __call__(self, x: jax.Array, *, key: jax.Array | None = None) -> jax.Array:
        return jnp.where(self.mask, self.scale * (x[self.permutation] @ self.weight), -jnp.inf)


def test_only_float_arrays_are_trained():
    model = WithFrozenLeaves()
    state = ciclo.create_equinox_state(model, tx=optax.adam(1e-2), losses=LOSSES)
    assert [leaf.dtype for leaf in jax.tree.leaves(state.params)] == [jnp.float32]
    assert state.params.permutation is None and state.params.mask is None

    for batch in blob_batches(3):
        _, state = state.train_step(batch)
    assert not np.array_equal(state.params.weight, model.weight)
    trained = eqx.combine(state.params, state.adapter.static)
    np.testing.assert_array_equal(trained.permutation, model.permutation)
    np.testing.assert_array_equal(trained.mask, model.mask)
    assert trained.scale == 2.0


class WholeBatch(eqx.Module):
    """A model that takes the whole batch and records the rank of what it is given."""

    linear: eqx.nn.Linear

    def __init__(self) -> None:
        self.linear = eqx.nn.Linear(FEATURES, CLASSES, key=jax.random.key(0))

    def __call__(self, x: jax.Array, *, key: jax.Array | None = None) -> jax.Array:
        if x.ndim != 2:
            raise ValueError(f"expected a batch, got shape {x.shape}")
        return jax.vmap(self.linear)(x)


class OneExample(eqx.Module):
    """A model without a key argument that acts on one example."""

    linear: eqx.nn.Linear

    def __init__(self) -> None:
        self.linear = eqx.nn.Linear(FEATURES, CLASSES, key=jax.random.key(0))

    def __call__(self, x: jax.Array) -> jax.Array:
        if x.ndim != 1:
            raise ValueError(f"expected one example, got shape {x.shape}")
        return self.linear(x)


@pytest.mark.parametrize(("model", "vmap"), [(WholeBatch, False), (OneExample, True)])
def test_batching_and_keys(model: Callable[[], eqx.Module], vmap: bool):
    state = ciclo.create_equinox_state(model(), tx=optax.sgd(0.1), losses=LOSSES, vmap=vmap)
    assert state.adapter.takes_key == (model is WholeBatch)
    logs, state = state.train_step(blob_batches(1)[0])
    logs, _ = state.predict_step(blob_batches(1)[0][0])
    assert logs.outputs.preds.shape == (BATCH, CLASSES)


def test_stateful_model_without_vmap():
    class BatchedNorm(eqx.Module):
        inner: eqx.nn.Sequential

        def __init__(self) -> None:
            self.inner = eqx.nn.Sequential(
                [
                    eqx.nn.Linear(FEATURES, CLASSES, key=jax.random.key(0)),
                    eqx.nn.BatchNorm(CLASSES, axis_name="rows", mode="batch"),
                ]
            )

        def __call__(
            self, x: jax.Array, state: eqx.nn.State, *, key: jax.Array
        ) -> tuple[jax.Array, eqx.nn.State]:
            return jax.vmap(self.inner, axis_name="rows", in_axes=(0, None), out_axes=(0, None))(x, state)

    model, model_state = eqx.nn.make_with_state(BatchedNorm)()
    state = ciclo.create_equinox_state(model, state=model_state, tx=optax.sgd(0.1), losses=LOSSES, vmap=False)
    _, trained = state.train_step(blob_batches(1)[0])
    assert int(jax.tree.leaves(trained.model_state)[0]) == 1


# --- errors ------------------------------------------------------------------------------------


def _pair_and_state_again() -> tuple[Any, dict[str, Any]]:
    model, state = bn_dropout()
    return (model, state), {"state": state}


WRONG_ARGUMENTS: dict[str, tuple[Callable[[], tuple[Any, dict[str, Any]]], str]] = {
    "function": (lambda: (lambda x: x, {}), "takes an equinox.Module"),
    "dict": (lambda: ({"w": jnp.zeros(2)}, {}), "takes an equinox.Module"),
    "bad-state": (lambda: (mlp(), {"state": {"counter": 0}}), "must be the eqx.nn.State"),
    "missing-state": (lambda: (bn_dropout()[0], {}), "make_with_state"),
    "state-twice": (_pair_and_state_again, "state twice"),
    "bad-vmap": (lambda: (mlp(), {"vmap": "yes"}), "vmap must be a bool"),
}


@pytest.mark.parametrize("case", list(WRONG_ARGUMENTS))
def test_wrong_arguments_raise_type_errors(case: str):
    build, match = WRONG_ARGUMENTS[case]
    model, kwargs = build()
    with pytest.raises(TypeError, match=match):
        ciclo.create_equinox_state(model, tx=optax.sgd(0.1), **kwargs)


def test_init_points_to_split():
    adapter, variables = EquinoxAdapter.split(mlp())
    with pytest.raises(TypeError, match="initialised when it is built"):
        ciclo.create_model_state(adapter, inputs=jnp.ones((1, FEATURES)), tx=optax.sgd(0.1))
    state = ciclo.create_model_state(adapter, variables=variables, tx=optax.sgd(0.1))
    assert state.adapter is adapter


def test_inputs_without_batch_axis():
    state = ciclo.create_equinox_state(mlp(), tx=optax.sgd(0.1), strategy="eager")
    with pytest.raises(ValueError, match="no batch axis"):
        state.predict_step(jnp.float32(1.0))
