"""What every framework adapter must do, under every strategy: one suite, parametrized over both."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from conformance.adapters import TABLE
from conformance.conftest import BATCH, CLASSES, STRATEGIES, accuracy, blobs
from jax_metrics.metrics import Accuracy

import ciclo

MakeState = Callable[..., ciclo.ModelState]

TRAIN, TEST = blobs(150, seed=0), blobs(8, seed=1)


def float_leaves(tree: Any) -> list[np.ndarray]:
    """The floating-point leaves of a state moved to the host (rng keys and counters left out)."""
    leaves = jax.tree.leaves(tree)
    return [np.asarray(x) for x in leaves if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)]


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
    assert set(STRATEGIES) <= set(ciclo.strategy_names())


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


def test_batch_norm_and_dropout_train_and_update_statistics(make_state: MakeState) -> None:
    state = make_state("bn_dropout")
    initial = float_leaves(state.model_state)
    assert initial, "the model has no batch statistics"

    logs, evaluated = state.test_step(TEST[0])
    assert all(
        np.array_equal(a, b) for a, b in zip(initial, float_leaves(evaluated.model_state), strict=True)
    )

    state, history, _ = ciclo.train_loop(state, TRAIN[:60])
    trained = float_leaves(state.model_state)
    assert any(not np.allclose(a, b) for a, b in zip(initial, trained, strict=True))
    losses = history.collect("loss")
    assert np.mean(losses[-10:]) < np.mean(losses[:10])

    # Evaluation is deterministic: dropout is off and the statistics are read, not updated.
    first, _ = state.predict_step(TEST[0])
    second, after = state.predict_step(TEST[0])
    np.testing.assert_array_equal(np.asarray(first.outputs.preds), np.asarray(second.outputs.preds))
    assert all(np.array_equal(a, b) for a, b in zip(trained, float_leaves(after.model_state), strict=True))


def test_predict_step_returns_predictions_of_the_right_shape(make_state: MakeState) -> None:
    state = make_state()
    _, history, _ = ciclo.predict_loop(state, TEST[:3])
    preds = history.collect("preds")
    assert [np.shape(p) for p in preds] == [(BATCH, CLASSES)] * 3
    inputs_only, _ = state.predict_step(TEST[0][0])
    assert np.shape(inputs_only.outputs.preds) == (BATCH, CLASSES)


def test_jax_metrics_accuracy_and_a_plain_callable_agree(make_state: MakeState) -> None:
    state = make_state(metrics={"jax_metrics": Accuracy(), "callable": accuracy})
    state, history, _ = ciclo.train_loop(state, TRAIN[:20])
    np.testing.assert_allclose(history.collect("jax_metrics"), history.collect("callable"), rtol=1e-6)
    _, history, _ = ciclo.test_loop(state, TEST)
    np.testing.assert_allclose(history.collect("jax_metrics"), history.collect("callable"), rtol=1e-6)


def test_metrics_accumulate_until_reset(make_state: MakeState) -> None:
    state = make_state(metrics={"seen": lambda target: jnp.ones(target.shape)})
    for batch in TEST[:3]:
        logs, state = state.test_step(batch)
    assert float(logs.metrics.seen) == 1.0
    assert float(state.with_strategy("eager").metrics["seen"].count) == 3 * BATCH
    assert float(state.reset_step().with_strategy("eager").metrics["seen"].count) == 0


def test_train_step_compiles_once(make_state: MakeState, strategy: str) -> None:
    traces: list[int] = []

    def loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
        traces.append(1)
        return jnp.mean(-jax.nn.log_softmax(logits)[jnp.arange(labels.shape[0]), labels])

    state = make_state(losses={"loss": loss})
    for batch in TRAIN[:4]:
        _, state = state.train_step(batch)
    assert len(traces) == (4 if strategy == "eager" else 1)


def test_checkpoint_round_trip(make_state: MakeState, tmp_path: Any) -> None:
    state = make_state("bn_dropout")
    state, _, _ = ciclo.train_loop(
        state, TRAIN[:10], callbacks=[ciclo.checkpoint(tmp_path)], epoch_duration=10
    )
    restored = ciclo.restore_checkpoint(tmp_path, make_state("bn_dropout"))
    for a, b in zip(float_leaves(state.params), float_leaves(restored.params), strict=True):
        np.testing.assert_array_equal(a, b)
    logs, _ = restored.train_step(TRAIN[10])
    assert np.isfinite(float(logs.losses.loss))
