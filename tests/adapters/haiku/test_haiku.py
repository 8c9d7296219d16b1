"""ciclo-haiku: the adapter, `create_haiku_state`, and training haiku functions with ciclo."""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support import blobs as support_blobs

import ciclo
import ciclo_haiku
from ciclo_haiku import HaikuAdapter

FEATURES = 8
CLASSES = 4
HIDDEN = 32
BATCH = 16

LOSSES = {"loss": optax.softmax_cross_entropy_with_integer_labels}
METRICS = {"accuracy": lambda preds, target: preds.argmax(-1) == target}


blobs = functools.partial(support_blobs.blobs, features=FEATURES, classes=CLASSES)
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


def make_state(kind: str, wrapper: str = "function", **kwargs: Any) -> ciclo.ModelState:
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


# --- the package ---------------------------------------------------------------------------------------


def test_entry_point_resolves_to_the_package_function() -> None:
    (point,) = [
        p for p in importlib.metadata.entry_points(group="ciclo.frameworks") if p.name == "create_haiku_state"
    ]
    assert point.value == "ciclo_haiku:create_haiku_state"
    assert ciclo.create_haiku_state is ciclo_haiku.create_haiku_state


def test_public_api() -> None:
    assert ciclo_haiku.__all__ == sorted(ciclo_haiku.__all__)
    for name in ciclo_haiku.__all__:
        assert getattr(ciclo_haiku, name) is not None
    # The packages release in lockstep.
    assert ciclo_haiku.__version__ == ciclo.__version__


def test_adapter_satisfies_the_protocol() -> None:
    _: ciclo.ModelAdapter = HaikuAdapter(hk.transform(mlp))


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


@pytest.mark.parametrize("kind", ["mlp", "bn_dropout"])
def test_steps_trace_once(kind: str) -> None:
    # haiku runs the Python function only while tracing: a retrace (a model state that changes
    # structure between steps, say) would call it again.
    calls = []
    model = MODELS[kind]

    def counted(x: jax.Array, is_training: bool) -> jax.Array:
        calls.append(is_training)
        return model(x, is_training) if kind == "bn_dropout" else model(x)

    state = ciclo.create_haiku_state(
        counted, inputs=jnp.zeros((1, FEATURES)), tx=optax.adam(1e-2), losses=LOSSES
    )
    batches = blob_batches(4)
    _, state = state.train_step(batches[0])
    traced = len(calls)
    for batch in batches[1:]:
        _, state = state.train_step(batch)
    assert len(calls) == traced


@pytest.mark.parametrize("kind", ["mlp", "bn_dropout"])
def test_trains_under_each_strategy(kind: str, strategy: str) -> None:
    state = make_state(kind, strategy=strategy)
    for batch in blob_batches(25):
        logs, state = state.train_step(batch)
    state = state.reset_step()
    inputs, labels = blobs(256, seed=1)
    logs, state = state.test_step((inputs, labels))
    assert float(logs.metrics.accuracy) >= 0.95


# --- model state and the rng ---------------------------------------------------------------------------


@pytest.mark.parametrize("wrapper", ["function", "transform_with_state"])
def test_batch_norm_statistics_change_in_training_only(wrapper: str) -> None:
    state = make_state("bn_dropout", wrapper)
    initial = state.model_state
    assert sorted(initial) == ["batch_norm/~/mean_ema", "batch_norm/~/var_ema"]
    batch = blob_batches(1)[0]

    _, tested = state.test_step(batch)
    assert_trees_equal(tested.model_state, initial)
    _, predicted = state.predict_step(batch)
    assert_trees_equal(predicted.model_state, initial)

    _, trained = state.train_step(batch)
    mean_ema = trained.model_state["batch_norm/~/mean_ema"]
    assert int(mean_ema["counter"]) == 1
    assert not np.allclose(mean_ema["average"], initial["batch_norm/~/mean_ema"]["average"])


def test_dropout_differs_between_train_steps_and_is_off_in_test_and_predict() -> None:
    # sgd(0) keeps the params, so a different loss can only come from a different dropout mask.
    state = make_state("dropout_mlp", tx=optax.sgd(0.0))
    batch = blob_batches(1)[0]
    first, state = state.train_step(batch)
    second, state = state.train_step(batch)
    assert float(first.losses.loss) != float(second.losses.loss)

    tested = [float(state.test_step(batch)[0].losses.loss) for _ in range(2)]
    predicted = [state.predict_step(batch)[0].outputs.preds for _ in range(2)]
    no_dropout = hk.transform(dropout_mlp).apply(state.params, None, batch[0], training=False)
    assert tested[0] == tested[1]
    np.testing.assert_array_equal(predicted[0], predicted[1])
    np.testing.assert_allclose(predicted[0], no_dropout, rtol=1e-6)


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
        (3, "implement ciclo.ModelAdapter"),
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


def test_adapter_of_the_wrong_kind() -> None:
    with pytest.raises(TypeError, match="HaikuAdapter takes an hk.Transformed or an hk.TransformedWithState"):
        HaikuAdapter(mlp)  # type: ignore[arg-type]


def test_inputs_are_needed() -> None:
    with pytest.raises(TypeError, match="needs sample `inputs`"):
        ciclo.create_haiku_state(mlp, inputs=None, tx=optax.adam(1e-3))


# --- checkpoints and loops -----------------------------------------------------------------------------


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    state = make_state("bn_dropout")
    batches = blob_batches(6)
    for batch in batches[:5]:
        _, state = state.train_step(batch)
    ckpt = ciclo.checkpoint(tmp_path / "ckpt")
    ckpt(ciclo.Elapsed.create(steps=5), state)
    ckpt.close()

    restored = ciclo.restore_checkpoint(tmp_path / "ckpt", make_state("bn_dropout", key=1))
    assert_trees_equal(restored, state)
    # The restored state goes on exactly as the original: same params, batch statistics and dropout key.
    logs, after = state.train_step(batches[5])
    restored_logs, restored_after = restored.train_step(batches[5])
    assert float(restored_logs.losses.loss) == float(logs.losses.loss)
    assert_trees_equal(restored_after, after)


def test_train_loop_learns_and_checkpoints_the_best(tmp_path: Path) -> None:
    test_batches = blob_batches(8, seed=1)
    ckpt = ciclo.checkpoint(tmp_path / "best", monitor="accuracy_test", mode="max")
    state, history, elapsed = ciclo.train_loop(
        make_state("bn_dropout"),
        blob_batches(60),
        callbacks=[ckpt],
        test_dataset=lambda: test_batches,
        epoch_duration=20,
        stop=60,
    )
    steps, accuracy = history.collect("steps", "accuracy_test")
    assert elapsed.steps == 60
    assert len(steps) == 3
    assert accuracy[-1] >= 0.95

    best = ciclo.restore_checkpoint(tmp_path / "best", state, step="best")
    best = best.reset_step()
    for batch in test_batches:
        logs, best = best.test_step(batch)
    assert float(logs.metrics.accuracy) == max(accuracy)
