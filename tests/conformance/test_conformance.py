"""What every framework adapter must do, under every strategy: one suite, parametrized over both."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conformance.adapters import TABLE
from conformance.conftest import BATCH, CLASSES, INSTALLED, KINDS, STRATEGIES, TX, accuracy, blobs, build
from support.optional import optional

import ciclo

MakeState = Callable[..., ciclo.types.ModelState]

TRAIN, TEST = blobs(150, seed=0), blobs(8, seed=1)

jax_metrics = optional("jax_metrics")

STATEFUL_ACCURACIES: dict[str, Callable[[], Any]] = {
    "mean": lambda: ciclo.metrics.Mean(accuracy),
    **({"jax_metrics": lambda: jax_metrics.metrics.Accuracy()} if jax_metrics else {}),
}
"""Stateful accuracy metrics, checked against the plain callable `accuracy` (jax_metrics where installed)."""

OTHER_STRATEGIES = [name for name in ciclo.strategies.strategy_names() if name not in STRATEGIES]
"""The built-in strategies the rest of the suite leaves out (jit_donate, pmap): each adapter still trains."""


def float_leaves(tree: Any) -> list[np.ndarray]:
    """The floating-point leaves of a state moved to the host (rng keys and counters left out)."""
    leaves = jax.tree.leaves(tree)
    return [np.asarray(x) for x in leaves if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)]


def host_leaves(tree: Any) -> list[np.ndarray]:
    """Every array leaf of a state moved to the host, random keys as their key data."""
    return [
        np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
        for x in map(jnp.asarray, jax.tree.leaves(tree))
    ]


def assert_leaves_equal(actual: Any, expected: Any) -> None:
    # Leaves only: the tree structures hold the static fields, which a restored state takes from its target.
    for a, b in zip(host_leaves(actual), host_leaves(expected), strict=True):
        np.testing.assert_array_equal(a, b)


# --- the table and the packages ---------------------------------------------------------------


def test_table_covers_every_installed_adapter_and_strategy() -> None:
    entry_points = {point.name for point in importlib.metadata.entry_points(group="ciclo.frameworks")}
    assert entry_points <= {row.entry_point for row in TABLE}
    for row in TABLE:
        if row.available:
            module = row.load()
            assert (module.NAME, module.REQUIRES, module.ENTRY_POINT) == (
                row.name,
                row.requires,
                row.entry_point,
            )
            if row.entry_point is not None:
                assert row.entry_point in entry_points, f"{row.entry_point} has no entry point"
    assert set(STRATEGIES) <= set(ciclo.strategies.strategy_names())


def test_each_installed_adapter_package_is_reached_through_its_entry_point() -> None:
    # A loop rather than a parametrization: with core alone there is no package, and nothing to skip.
    points = {point.name: point for point in importlib.metadata.entry_points(group="ciclo.frameworks")}
    for name in sorted({row.entry_point for row in INSTALLED if row.entry_point is not None}):
        point = points[name]
        package = importlib.import_module(point.module)
        assert getattr(ciclo, name) is getattr(package, name) is point.load()
        assert package.__all__ == sorted(package.__all__), point.module
        assert all(getattr(package, public) is not None for public in package.__all__), point.module
        # The packages release in lockstep, each adapter pinning the core of its own version.
        assert point.dist is not None
        assert package.__version__ == importlib.metadata.version(point.dist.name) == ciclo.__version__
        assert f"ciclo-core=={ciclo.__version__}" in (importlib.metadata.requires(point.dist.name) or [])


def protocol_call(method: Callable[..., Any]) -> tuple[list[str], dict[str, str]]:
    """Placeholder arguments of the shape ciclo calls a `ciclo.types.ModelAdapter` method with."""
    parameters = list(inspect.signature(method).parameters.values())[1:]  # without self
    args = [p.name for p in parameters if p.kind is inspect.Parameter.POSITIONAL_ONLY]
    kwargs = {p.name: p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert len(args) + len(kwargs) == len(parameters), "the protocol takes only positional-only or keywords"
    return args, kwargs


@pytest.mark.parametrize("kind", KINDS)
def test_adapter_implements_the_model_adapter_protocol(adapter: ModuleType, kind: str) -> None:
    # ciclo.types.ModelAdapter is not runtime_checkable (the core never calls isinstance on it), so its
    # methods are checked here: each takes the arguments ciclo passes, by position and by keyword.
    model_adapter = build(adapter, kind, strategy="jit").adapter
    for name in ("init", "apply"):
        method = getattr(model_adapter, name, None)
        assert callable(method), f"{type(model_adapter).__name__} has no method {name}"
        args, kwargs = protocol_call(getattr(ciclo.types.ModelAdapter, name))
        inspect.signature(method).bind(*args, **kwargs)
    # The adapter is a static field of the state: jit hashes it.
    assert hash(model_adapter) == hash(model_adapter)


# --- training, evaluation and prediction ------------------------------------------------------


def test_reaches_95_percent_on_a_separable_task(make_state: MakeState) -> None:
    state, history, _ = ciclo.train_loop(
        make_state(), TRAIN, test_dataset=lambda: TEST, epoch_duration=50, stop=100
    )
    accuracy_test = history.collect("accuracy_test")
    assert len(accuracy_test) == 2 and accuracy_test[-1] >= 0.95
    assert history.collect("loss_test")[-1] < history.collect("loss")[0]
    assert int(state.step) == 100
    # The test accuracy is the running metric's last value: the accuracy over the whole test set.
    _, predicted, _ = ciclo.predict_loop(state, TEST)
    preds = np.concatenate(predicted.collect("preds"))
    expected = np.mean(preds.argmax(-1) == np.concatenate([target for _, target in TEST]))
    np.testing.assert_allclose(accuracy_test[-1], expected, rtol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("strategy", OTHER_STRATEGIES)
def test_learns_under_the_other_built_in_strategies(adapter: ModuleType, strategy: str, kind: str) -> None:
    # Steps by hand: train_loop's test phase would run on the training state, which jit_donate donates.
    state = build(adapter, kind, strategy=strategy)
    for batch in TRAIN[:50]:
        _, state = state.train_step(batch)
    state = state.reset_step()
    for batch in TEST:
        logs, state = state.test_step(batch)
    assert int(state.with_strategy("eager").step) == 50
    assert float(logs.metrics.accuracy) >= 0.95


def test_batch_norm_and_dropout_train_and_update_statistics(make_state: MakeState) -> None:
    state = make_state("bn_dropout")
    initial = float_leaves(state.model_state)
    assert initial, "the model has no batch statistics"

    for evaluate in (state.test_step, state.predict_step):
        _, evaluated = evaluate(TEST[0])
        assert all(
            np.array_equal(a, b) for a, b in zip(initial, float_leaves(evaluated.model_state), strict=True)
        )

    state, history, _ = ciclo.train_loop(state, TRAIN[:60])
    trained = float_leaves(state.model_state)
    # One set of statistics for the whole batch, not one per example.
    assert [a.shape for a in trained] == [a.shape for a in initial]
    assert any(not np.allclose(a, b) for a, b in zip(initial, trained, strict=True))
    losses = history.collect("loss")
    assert np.mean(losses[-10:]) < np.mean(losses[:10])

    # Evaluation is deterministic: dropout is off and the statistics are read, not updated.
    first, _ = state.predict_step(TEST[0])
    second, after = state.predict_step(TEST[0])
    np.testing.assert_array_equal(np.asarray(first.outputs.preds), np.asarray(second.outputs.preds))
    assert all(np.array_equal(a, b) for a, b in zip(trained, float_leaves(after.model_state), strict=True))


def test_dropout_mask_changes_with_each_train_step_only(make_state: MakeState) -> None:
    # sgd(0) keeps the params, and training batch norm normalises with the batch's own statistics:
    # a different loss on the same batch can only come from a different dropout mask.
    state = make_state("bn_dropout", tx=optax.sgd(0.0))
    first, _ = state.train_step(TEST[0])
    again, trained = state.train_step(TEST[0])  # the same state: the same step's key
    second, _ = trained.train_step(TEST[0])
    assert float(first.losses.loss) == float(again.losses.loss)
    assert float(first.losses.loss) != float(second.losses.loss)
    tested = [float(trained.test_step(TEST[0])[0].losses.loss) for _ in range(2)]
    assert tested[0] == tested[1]


def test_predict_step_returns_predictions_of_the_right_shape(make_state: MakeState) -> None:
    state = make_state()
    _, history, _ = ciclo.predict_loop(state, TEST[:3])
    preds = history.collect("preds")
    assert [np.shape(p) for p in preds] == [(BATCH, CLASSES)] * 3
    inputs_only, _ = state.predict_step(TEST[0][0])
    assert np.shape(inputs_only.outputs.preds) == (BATCH, CLASSES)


# --- training options: mixed precision, gradient accumulation, EMA of the weights --------------

COMPILED = [name for name in STRATEGIES if name != "eager"]
"""The strategies the training options are checked under: `eager` runs the same step op by op, slowly
(tests/core/test_training_options.py runs it with the plain-JAX model)."""


def matmul_dtypes(state: ciclo.types.ModelState, batch: Any) -> set[str]:
    """The dtypes of the operands of every matrix product in the trace of a training forward pass."""
    jaxpr = jax.make_jaxpr(lambda params: state.replace(params=params)._run_model(batch, training=True)[0])(
        state.params
    )
    found: set[str] = set()

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
                found.update(str(var.aval.dtype) for var in eqn.invars)
            for param in eqn.params.values():
                for sub in param if isinstance(param, (tuple, list)) else [param]:
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jaxpr.jaxpr)
    return found


@pytest.mark.parametrize("strategy", COMPILED)
def test_bf16_mixed_computes_in_bfloat16_and_keeps_float32_params(make_state: MakeState) -> None:
    assert matmul_dtypes(make_state(precision="bf16-mixed"), TRAIN[0]) == {"bfloat16"}
    state = make_state("bn_dropout", precision="bf16-mixed")
    # Batch norms reduce half-precision activations in float32 on purpose (flax promotes them), which
    # strict promotion refuses: the users' default, standard promotion, is the one to check. (An nnx
    # BatchNorm also returns float32, from its float32 statistics, unless given dtype=bfloat16.)
    with jax.numpy_dtype_promotion("standard"):
        assert "bfloat16" in matmul_dtypes(state, TRAIN[0])
        for batch in TRAIN[:3]:
            logs, state = state.train_step(batch)
        preds, _ = state.predict_step(TEST[0])
    assert logs.losses.loss.dtype == logs.metrics.accuracy.dtype == jnp.float32
    assert np.isfinite(float(logs.losses.loss))
    trained = state.with_strategy("eager")
    assert {
        leaf.dtype for leaf in float_leaves((trained.params, trained.opt_state, trained.model_state))
    } == {np.dtype("float32")}
    assert preds.outputs.preds.dtype == jnp.float32


# "16-mixed" starting at a scale under which these gradients fit float16: "16-mixed" itself starts at
# 2**16, where the first steps overflow and are skipped until the scale has come down.
FLOAT16_MIXED = ciclo.types.Precision(jnp.float16, loss_scaling=True, initial_scale=2.0**8)


@pytest.mark.parametrize("strategy", COMPILED)
def test_16_mixed_skips_a_step_that_overflows(make_state: MakeState) -> None:
    state = make_state(precision=FLOAT16_MIXED)
    assert matmul_dtypes(state, TRAIN[0]) == {"float16"}
    logs, state = state.train_step(TRAIN[0])
    assert (float(logs.metrics.loss_scale), int(logs.metrics.skipped_steps)) == (2.0**8, 0)
    inputs, target = TRAIN[1]
    logs, skipped = state.train_step((inputs * 1e6, target))  # beyond float16's range: inf, then NaN
    assert not np.isfinite(float(logs.losses.loss))
    assert (float(logs.metrics.loss_scale), int(logs.metrics.skipped_steps)) == (2.0**7, 1)
    before, after = state.with_strategy("eager"), skipped.with_strategy("eager")
    assert_leaves_equal((after.params, after.opt_state), (before.params, before.opt_state))
    assert int(after.step) == 2
    logs, state = skipped.train_step(TRAIN[2])
    assert np.isfinite(float(logs.losses.loss)) and int(logs.metrics.skipped_steps) == 1
    assert not np.array_equal(
        float_leaves(state.with_strategy("eager").params)[0], float_leaves(after.params)[0]
    )


@pytest.mark.parametrize("strategy", COMPILED)
def test_accumulate_steps_equals_one_step_on_the_joined_batch(make_state: MakeState) -> None:
    tx = optax.sgd(0.5)
    inputs, target = TRAIN[0]
    micro = [(inputs[i : i + BATCH // 4], target[i : i + BATCH // 4]) for i in range(0, BATCH, BATCH // 4)]
    accumulating = make_state(tx=tx, accumulate_steps=4)
    initial = float_leaves(accumulating.with_strategy("eager").params)
    for index, batch in enumerate(micro):
        _, accumulating = accumulating.train_step(batch)
        params = float_leaves(accumulating.with_strategy("eager").params)
        if index < 3:  # parameters change only at the 4th micro-batch
            assert all(np.array_equal(a, b) for a, b in zip(params, initial, strict=True))
    _, joined = make_state(tx=tx).train_step(TRAIN[0])
    for a, b in zip(params, float_leaves(joined.with_strategy("eager").params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", COMPILED)
def test_ema_follows_its_recurrence_and_evaluates(make_state: MakeState) -> None:
    decay = 0.75
    state = make_state(ema_decay=decay)
    ema = float_leaves(state.with_strategy("eager").params)
    assert all(
        np.array_equal(a, b)
        for a, b in zip(float_leaves(state.with_strategy("eager").ema_params), ema, strict=True)
    )
    for batch in TRAIN[:3]:
        _, state = state.train_step(batch)
        params = float_leaves(state.with_strategy("eager").params)
        ema = [np.float32(decay) * e + np.float32(1 - decay) * p for e, p in zip(ema, params, strict=True)]
        for a, b in zip(float_leaves(state.with_strategy("eager").ema_params), ema, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    averaged = state.with_ema_params()
    logs, _ = averaged.reset_step().test_step(TEST[0])
    expected = accuracy(averaged.predict_step(TEST[0])[0].outputs.preds, TEST[0][1]).mean()
    np.testing.assert_allclose(float(logs.metrics.accuracy), float(expected), rtol=1e-6)
    assert logs.losses.loss != state.reset_step().test_step(TEST[0])[0].losses.loss


@pytest.mark.parametrize("strategy", ["jit", "fsdp"])
def test_log_norms_are_those_of_jax_grad_of_the_same_loss(make_state: MakeState) -> None:
    state = make_state(log_norms="modules")
    before = state.with_strategy("eager")
    inputs, target = TRAIN[0]

    def loss(params: Any) -> jax.Array:
        preds, _ = before.adapter.apply(
            params, before.model_state, inputs, key=before.step_key(), training=True
        )
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(preds, target))

    grads = jax.grad(loss)(before.params)
    updates, _ = TX.update(grads, TX.init(before.params), before.params)
    logs, state = state.train_step(TRAIN[0])
    modules: dict[str, list[Any]] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(grads):
        modules.setdefault(f"grad_norm/{jax.tree_util.keystr(path[:1], simple=True)}", []).append(leaf)
    expected = {
        "grad_norm": grads,
        "update_norm": updates,
        "param_norm": state.with_strategy("eager").params,
        **modules,
    }
    assert set(logs.norms) == set(expected)
    for name, tree in expected.items():
        wanted = np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree.leaves(tree)))
        np.testing.assert_allclose(float(logs.norms[name]), wanted, rtol=2e-5, err_msg=name)


# --- metrics ----------------------------------------------------------------------------------


@pytest.mark.parametrize("stateful", list(STATEFUL_ACCURACIES))
def test_a_stateful_metric_and_a_plain_callable_agree(make_state: MakeState, stateful: str) -> None:
    metric = STATEFUL_ACCURACIES[stateful]()
    assert isinstance(metric, ciclo.metrics.Metric)
    state = make_state(metrics={"stateful": metric, "callable": accuracy})
    assert all(isinstance(held, ciclo.metrics.Metric) for held in state.metrics.values())
    state, history, _ = ciclo.train_loop(state, TRAIN[:20])
    np.testing.assert_allclose(history.collect("stateful"), history.collect("callable"), rtol=1e-6)
    _, history, _ = ciclo.test_loop(state, TEST)
    np.testing.assert_allclose(history.collect("stateful"), history.collect("callable"), rtol=1e-6)


def test_metrics_accumulate_until_reset(make_state: MakeState) -> None:
    state = make_state(metrics={"seen": lambda target: jnp.ones(target.shape)})
    for batch in TEST[:3]:
        logs, state = state.test_step(batch)
    assert float(logs.metrics.seen) == 1.0
    assert float(state.with_strategy("eager").metrics["seen"].count) == 3 * BATCH
    assert float(state.reset_step().with_strategy("eager").metrics["seen"].count) == 0


# --- compilation and checkpoints --------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_train_step_compiles_once(make_state: MakeState, strategy: str, kind: str) -> None:
    # A retrace (a model state or key whose structure or dtype changes between steps, say) would
    # call the loss again.
    traces: list[int] = []

    def loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
        traces.append(1)
        return jnp.mean(-jax.nn.log_softmax(logits)[jnp.arange(labels.shape[0]), labels])

    state = make_state(kind, losses={"loss": loss})
    for batch in TRAIN[:4]:
        _, state = state.train_step(batch)
    assert len(traces) == (4 if strategy == "eager" else 1)


def test_checkpoint_round_trip(make_state: MakeState, tmp_path: Any) -> None:
    state = make_state("bn_dropout")
    state, _, _ = ciclo.train_loop(
        state, TRAIN[:10], callbacks=[ciclo.checkpoint(tmp_path)], epoch_duration=10
    )
    target = make_state("bn_dropout", key=jax.random.key(1))
    restored = ciclo.restore_checkpoint(tmp_path, target)
    # Every array comes back (params, batch statistics, optimizer state, step, key, metrics); the
    # static fields are the target's.
    assert_leaves_equal(restored.with_strategy("eager"), state.with_strategy("eager"))
    assert restored.adapter is target.adapter
    # The restored state goes on exactly as the original: the same dropout key and the same update.
    logs, after = state.train_step(TRAIN[10])
    restored_logs, restored_after = restored.train_step(TRAIN[10])
    assert float(restored_logs.losses.loss) == float(logs.losses.loss)
    assert_leaves_equal(restored_after.with_strategy("eager"), after.with_strategy("eager"))
    assert int(restored_after.step) == 11


class _Crash(Exception):
    pass


def test_backup_resumes_bit_for_bit(adapter: ModuleType, tmp_path: Any) -> None:
    # The model with batch statistics and dropout: an nnx model's rng streams are typed keys, stored
    # by orbax as their raw data, which the backup's structure check must compare as such.
    state = build(adapter, "bn_dropout", strategy="jit")
    expected, _, _ = ciclo.train_loop(state, TRAIN[:6])

    def crash(state: Any, batch: Any, elapsed: ciclo.types.Elapsed) -> None:
        if elapsed.steps == 4:
            raise _Crash

    backup = ciclo.backup(tmp_path, every=2)
    with pytest.raises(_Crash):
        ciclo.train_loop(state, TRAIN[:6], tasks={ciclo.every(1): crash}, backup=backup)
    resumed, _, elapsed = ciclo.train_loop(state, TRAIN[:6], backup=backup)
    assert elapsed.steps == 6
    assert_leaves_equal(resumed.with_strategy("eager"), expected.with_strategy("eager"))
