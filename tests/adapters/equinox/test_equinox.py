"""ciclo-equinox: the adapter, `create_equinox_state`, and training equinox modules with ciclo."""

from __future__ import annotations

import functools
import importlib.metadata
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
import ciclo_equinox
from ciclo_equinox import EquinoxAdapter

FEATURES = 8
CLASSES = 4
HIDDEN = 32
BATCH = 16

LOSSES = {"loss": optax.softmax_cross_entropy_with_integer_labels}
METRICS = {"accuracy": lambda preds, target: preds.argmax(-1) == target}


blobs = functools.partial(support_blobs.blobs, features=FEATURES, classes=CLASSES)
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


def make_state(kind: str, **kwargs: Any) -> ciclo.ModelState:
    settings: dict[str, Any] = {"tx": optax.adam(1e-2), "losses": LOSSES, "metrics": METRICS, **kwargs}
    return ciclo.create_equinox_state(MODELS[kind](), **settings)


# --- packaging and public API ------------------------------------------------------------------


def test_ciclo_resolves_the_entry_point():
    assert ciclo.create_equinox_state is ciclo_equinox.create_equinox_state
    points = importlib.metadata.entry_points(group="ciclo.frameworks")
    assert points["create_equinox_state"].load() is ciclo_equinox.create_equinox_state


def test_public_api_is_sorted_and_resolves():
    assert ciclo_equinox.__all__ == sorted(ciclo_equinox.__all__)
    for name in ciclo_equinox.__all__:
        assert getattr(ciclo_equinox, name) is not None


def test_version_is_in_lockstep_with_core():
    assert ciclo_equinox.__version__ == importlib.metadata.version("ciclo-equinox")
    assert ciclo_equinox.__version__ == ciclo.__version__
    requirements = importlib.metadata.requires("ciclo-equinox") or []
    assert f"ciclo-core=={ciclo.__version__}" in requirements


def test_adapter_is_a_hashable_model_adapter():
    adapter, _ = EquinoxAdapter.split(mlp())
    _: ciclo.ModelAdapter = adapter
    assert hash(adapter) == hash(adapter) and adapter == adapter
    assert adapter != EquinoxAdapter.split(mlp())[0]  # compared by identity: one compilation per state


# --- training ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(MODELS))
def test_learns_under_every_strategy(kind: str, strategy: str):
    state = make_state(kind, strategy=strategy)
    for batch in blob_batches(40):
        logs, state = state.train_step(batch)
    state = state.reset_step()
    logs, state = state.test_step(blobs(64, seed=1))
    assert float(logs.metrics.accuracy) >= 0.95
    assert float(logs.losses.loss) < 0.5


@pytest.mark.parametrize("as_pair", [False, True], ids=["state=", "pair"])
def test_model_state_is_the_eqx_state(as_pair: bool):
    model, state = bn_dropout()
    model_arg = (model, state) if as_pair else model
    train_state = ciclo.create_equinox_state(model_arg, state=None if as_pair else state, tx=optax.sgd(0.1))
    jax.tree.map(np.testing.assert_array_equal, train_state.model_state, state)
    assert train_state.adapter.stateful


def test_batch_norm_statistics_change_in_training_only():
    train_state = make_state("bn_dropout")
    before = train_state.model_state
    shapes = [leaf.shape for leaf in jax.tree.leaves(before)]

    _, tested = train_state.test_step(blob_batches(1)[0])
    _, predicted = train_state.predict_step(blob_batches(1)[0][0])
    for unchanged in (tested.model_state, predicted.model_state):
        jax.tree.map(np.testing.assert_array_equal, unchanged, before)

    _, trained = train_state.train_step(blob_batches(1)[0])
    after = trained.model_state
    # One state for the whole batch, not one per example.
    assert [leaf.shape for leaf in jax.tree.leaves(after)] == shapes
    changed = [
        not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before), strict=True)
    ]
    assert all(changed)


def test_batch_norm_with_another_axis_name():
    model, state = bn_dropout(axis_name="examples")
    train_state = ciclo.create_equinox_state(
        model, state=state, tx=optax.sgd(0.1), losses=LOSSES, batch_axis_name="examples"
    )
    logs, _ = train_state.train_step(blob_batches(1)[0])
    assert np.isfinite(float(logs.losses.loss))


def test_dropout_differs_between_steps_and_is_off_in_evaluation():
    # A learning rate of zero keeps the params, so only the dropout masks change the losses.
    state = ciclo.create_equinox_state(dropout_mlp(), tx=optax.sgd(0.0), losses=LOSSES)
    batch = blob_batches(1)[0]
    train_losses = []
    for _ in range(2):
        logs, state = state.train_step(batch)
        train_losses.append(float(logs.losses.loss))
    assert train_losses[0] != train_losses[1]

    test_losses = [float(state.test_step(batch)[0].losses.loss) for _ in range(2)]
    assert test_losses[0] == test_losses[1]

    expected = jax.vmap(eqx.nn.inference_mode(dropout_mlp()))(jnp.asarray(batch[0]))
    logs, _ = state.predict_step(batch[0])
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


def test_compiles_once():
    traces = []

    class Counting(eqx.Module):
        linear: eqx.nn.Linear

        def __call__(self, x: jax.Array, *, key: jax.Array) -> jax.Array:
            traces.append(None)
            return self.linear(x)

    model = Counting(eqx.nn.Linear(FEATURES, CLASSES, key=jax.random.key(0)))
    state = ciclo.create_equinox_state(model, tx=optax.adam(1e-2), losses=LOSSES)
    for batch in blob_batches(3):
        _, state = state.train_step(batch)
    assert len(traces) == 1


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


# --- checkpoints and loops ---------------------------------------------------------------------


def test_checkpoint_round_trip(tmp_path: Any):
    state = make_state("bn_dropout")
    for batch in blob_batches(5):
        _, state = state.train_step(batch)
    ckpt = ciclo.checkpoint(tmp_path, async_save=False)
    ckpt.save(int(state.step), state)
    ckpt.close()

    # The target is a fresh state: its arrays are replaced, its static fields (adapter, tx) kept.
    target = make_state("bn_dropout")
    restored = ciclo.restore_checkpoint(tmp_path, target)
    assert restored.adapter is target.adapter
    jax.tree.map(
        np.testing.assert_array_equal, jax.random.key_data(restored.key), jax.random.key_data(state.key)
    )
    for name in ("params", "model_state", "opt_state", "step"):
        jax.tree.map(np.testing.assert_array_equal, getattr(restored, name), getattr(state, name))

    inputs = blob_batches(1, seed=3)[0][0]
    np.testing.assert_array_equal(
        restored.predict_step(inputs)[0].outputs.preds, state.predict_step(inputs)[0].outputs.preds
    )
    _, resumed = restored.train_step(blob_batches(1)[0])
    assert int(resumed.step) == 6


def test_train_loop_learns():
    state = make_state("bn_dropout")
    test_batches = blob_batches(4, seed=1)
    state, history, elapsed = ciclo.train_loop(
        state,
        blob_batches(60),
        test_dataset=lambda: test_batches,
        epoch_duration=20,
        stop=60,
    )
    assert elapsed.steps == 60
    accuracies = history.collect("accuracy_test")
    assert len(accuracies) == 3
    assert accuracies[-1] >= 0.95
