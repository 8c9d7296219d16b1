"""ciclo-haiku specifics: the forms of haiku functions, their training flag, rngs and errors.

What every adapter must do (learning, batch norm, dropout, compiling once,
checkpoints, the package and the `ciclo.types.ModelAdapter` protocol) is checked by
the conformance suite, tests/conformance.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support import blobs as support_blobs

import ciclo
from ciclo_haiku import HaikuAdapter

# haiku's BatchNorm (its moving averages compute `decay**counter`, a Python float to an int32 power)
# and hk.dropout (a bool mask times float32 inputs) reject strict dtype promotion.
pytestmark = pytest.mark.usefixtures("standard_dtype_promotion")

FEATURES = 8
CLASSES = 4
HIDDEN = 32
BATCH = 16

LOSSES = {"loss": optax.softmax_cross_entropy_with_integer_labels}
METRICS = {"accuracy": lambda preds, target: preds.argmax(-1) == target}


blob_batches = functools.partial(support_blobs.blob_batches, features=FEATURES, classes=CLASSES, batch=BATCH)


def mlp(x: jax.Array) -> jax.Array:
    return hk.Linear(CLASSES)(jax.nn.relu(hk.Linear(HIDDEN)(x)))


def bn_dropout(x: jax.Array, is_training: bool) -> jax.Array:
    x = hk.Linear(HIDDEN)(x)
    x = hk.BatchNorm(create_scale=True, create_offset=True, decay_rate=0.9)(x, is_training=is_training)
    x = jax.nn.relu(x)
    if is_training:
        x = hk.dropout(hk.next_rng_key(), 0.3, x)
    return hk.Linear(CLASSES)(x)


def dropout_mlp(x: jax.Array, *, training: bool = False) -> jax.Array:
    x = hk.Linear(HIDDEN)(x)
    if training:
        x = hk.dropout(hk.next_rng_key(), 0.5, x)
    return hk.Linear(CLASSES)(x)


MODELS: dict[str, Callable[..., jax.Array]] = {
    "mlp": mlp,
    "bn_dropout": bn_dropout,
    "dropout_mlp": dropout_mlp,
}

WRAPPERS: dict[str, Callable[[Callable[..., Any]], Any]] = {
    "function": lambda f: f,
    "transform": hk.transform,
    "transform_with_state": hk.transform_with_state,
    "without_apply_rng": lambda f: hk.without_apply_rng(hk.transform_with_state(f)),
}
"""Every form `create_haiku_state` takes a function in."""


def make_state(kind: str, wrapper: str = "function", **kwargs: Any) -> ciclo.types.ModelState:
    settings: dict[str, Any] = {
        "inputs": jnp.zeros((1, FEATURES)),
        "tx": optax.adam(1e-2),
        "losses": LOSSES,
        "metrics": METRICS,
        **kwargs,
    }
    return ciclo.create_haiku_state(WRAPPERS[wrapper](MODELS[kind]), **settings)


def host(tree: Any) -> dict[str, np.ndarray]:
    """The leaves of a pytree as numpy arrays by path (random keys as their key data); statics left out."""

    def leaf(x: Any) -> np.ndarray:
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(x)

    return {jax.tree_util.keystr(path): leaf(x) for path, x in jax.tree_util.tree_leaves_with_path(tree)}


def assert_trees_equal(actual: Any, expected: Any) -> None:
    actual_leaves, expected_leaves = host(actual), host(expected)
    assert list(actual_leaves) == list(expected_leaves)
    for path, value in actual_leaves.items():
        np.testing.assert_array_equal(value, expected_leaves[path], err_msg=path)


def trees_equal(a: Any, b: Any) -> bool:
    try:
        assert_trees_equal(a, b)
    except AssertionError:
        return False
    return True


# --- transform and transform_with_state ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "wrapper", "has_model_state"),
    [
        ("mlp", "function", False),
        ("mlp", "transform", False),
        ("mlp", "transform_with_state", False),  # an empty haiku state is no model state
        ("mlp", "without_apply_rng", False),
        ("bn_dropout", "function", True),
        ("bn_dropout", "transform_with_state", True),
    ],
)
def test_forms_of_the_model(kind: str, wrapper: str, has_model_state: bool) -> None:
    state = make_state(kind, wrapper)
    assert (state.model_state is not None) == has_model_state
    assert set(state.params) >= {"linear", "linear_1"}
    logs, new_state = state.train_step(blob_batches(1)[0])
    assert np.isfinite(float(logs.losses.loss))
    assert not trees_equal(new_state.params, state.params)
    assert jax.tree.structure(new_state) == jax.tree.structure(state)


def test_without_apply_rng_takes_no_rng() -> None:
    assert not HaikuAdapter(hk.without_apply_rng(hk.transform(mlp))).takes_rng
    assert HaikuAdapter(hk.transform(mlp)).takes_rng


# --- model state and the rng ---------------------------------------------------------------------------


@pytest.mark.parametrize("wrapper", ["function", "transform_with_state"])
def test_model_state_is_the_haiku_state(wrapper: str) -> None:
    state = make_state("bn_dropout", wrapper)
    assert sorted(state.model_state) == ["batch_norm/~/mean_ema", "batch_norm/~/var_ema"]
    _, trained = state.train_step(blob_batches(1)[0])
    assert int(trained.model_state["batch_norm/~/mean_ema"]["counter"]) == 1


def test_predict_runs_the_function_with_its_training_flag_off() -> None:
    state = make_state("dropout_mlp")
    inputs = blob_batches(1)[0][0]
    no_dropout = hk.transform(dropout_mlp).apply(state.params, None, inputs, training=False)
    np.testing.assert_allclose(state.predict_step(inputs)[0].outputs.preds, no_dropout, rtol=1e-6)


# --- the training flag ---------------------------------------------------------------------------------


def _flag_marker(x: jax.Array, training: bool) -> jax.Array:
    """1.0 per sample in training, 0.0 otherwise; the linear layer gives the optimizer params."""
    return 0.0 * hk.Linear(1)(x)[:, 0] + (1.0 if training else 0.0)


def takes_is_training(x: jax.Array, is_training: bool) -> jax.Array:
    return _flag_marker(x, is_training)


def takes_training(x: jax.Array, *, training: bool = False) -> jax.Array:
    return _flag_marker(x, training)


def takes_train(x: jax.Array, train: bool = False) -> jax.Array:
    return _flag_marker(x, train)


def takes_deterministic(x: jax.Array, deterministic: bool = True) -> jax.Array:
    return _flag_marker(x, not deterministic)


def takes_mode(x: jax.Array, *, mode: bool = False) -> jax.Array:
    return _flag_marker(x, mode)


def takes_kwargs(x: jax.Array, **kwargs: bool) -> jax.Array:
    return _flag_marker(x, kwargs.get("is_training", False))


def flags_seen(model: Any, **kwargs: Any) -> tuple[float, float]:
    """The flag the model saw in a train step and in a test step, through a metric on its outputs."""
    state = ciclo.create_haiku_state(
        model,
        inputs=jnp.zeros((1, FEATURES)),
        tx=optax.sgd(0.1),
        losses={"loss": lambda preds: preds**2},
        metrics={"flag": lambda preds: preds},
        **kwargs,
    )
    batch = blob_batches(1)[0]
    train_logs, state = state.train_step(batch)
    test_logs, _ = state.reset_step().test_step(batch)
    return float(train_logs.metrics.flag), float(test_logs.metrics.flag)


@pytest.mark.parametrize("wrapper", list(WRAPPERS))
@pytest.mark.parametrize(
    ("model", "flag"),
    [
        (takes_is_training, "is_training"),
        (takes_training, "training"),
        (takes_train, "train"),
        (takes_deterministic, "deterministic"),
    ],
)
def test_training_flag_found(model: Callable[..., jax.Array], flag: str, wrapper: str) -> None:
    transformed = WRAPPERS[wrapper](model)
    if wrapper != "function":
        assert HaikuAdapter(transformed).flag == flag
    assert flags_seen(transformed) == (1.0, 0.0)


@pytest.mark.parametrize(
    ("model", "training_flag", "expected"),
    [
        (takes_mode, "mode", (1.0, 0.0)),
        (takes_mode, "auto", (0.0, 0.0)),  # `mode` is no flag name haiku functions use: not found
        (takes_training, None, (0.0, 0.0)),
        (takes_kwargs, "auto", (0.0, 0.0)),  # **kwargs says nothing of a flag
        (takes_kwargs, "is_training", (1.0, 0.0)),
        (functools.partial(takes_is_training, is_training=False), "auto", (1.0, 0.0)),
    ],
)
def test_training_flag_argument(
    model: Callable[..., jax.Array], training_flag: str | None, expected: tuple[float, float]
) -> None:
    assert flags_seen(model, training_flag=training_flag) == expected


def test_training_flag_the_function_does_not_take() -> None:
    with pytest.raises(TypeError, match=r"takes no keyword argument 'is_training': its arguments are \(x\)"):
        make_state("mlp", training_flag="is_training")


def test_training_flag_of_the_wrong_type() -> None:
    with pytest.raises(TypeError, match="training_flag must be 'auto', the name of an argument or None"):
        make_state("bn_dropout", training_flag=True)


# --- errors --------------------------------------------------------------------------------------------


class CallableObject:
    def __call__(self, x: jax.Array) -> jax.Array:
        return x


@pytest.mark.parametrize(
    ("model", "hint"),
    [
        (3, "implement ciclo.types.ModelAdapter"),
        (CallableObject(), "wrap another callable with hk.transform_with_state"),
        (hk.nets.MLP, r"lambda x: hk.nets.MLP\(\[64, 10\]\)\(x\)"),
        (hk.multi_transform(lambda: ((), (mlp,))), "an hk.multi_transform has several apply functions"),
    ],
    ids=["int", "callable_object", "module_class", "multi_transform"],
)
def test_model_of_the_wrong_kind(model: Any, hint: str) -> None:
    with pytest.raises(TypeError, match="takes a haiku function transformed by hk.transform") as error:
        ciclo.create_haiku_state(model, inputs=jnp.zeros((1, FEATURES)), tx=optax.adam(1e-3))
    assert error.match(hint)


def test_a_huge_wrong_model_gives_a_short_error() -> None:
    with pytest.raises(TypeError, match="takes a haiku function transformed by hk.transform") as error:
        ciclo.create_haiku_state(list(range(100_000)), inputs=jnp.zeros((1, FEATURES)), tx=optax.adam(1e-3))
    assert len(str(error.value)) < 2_000


def test_adapter_of_the_wrong_kind() -> None:
    with pytest.raises(TypeError, match="HaikuAdapter takes an hk.Transformed or an hk.TransformedWithState"):
        HaikuAdapter(mlp)  # type: ignore[arg-type]


def test_inputs_are_needed() -> None:
    with pytest.raises(TypeError, match="needs sample `inputs`"):
        ciclo.create_haiku_state(mlp, inputs=None, tx=optax.adam(1e-3))
