"""What every framework adapter must do, under every strategy.

The contract itself is checked by `ciclo.testing`, the kit framework authors run
on their own adapters: one `AdapterTests` class per adapter of the table and
model (`TestContract_<adapter>_<model>`). What follows them is what the kit does
not check: the packages and their entry points, the other built-in strategies,
float16 loss scaling, norms, metrics and checkpoints restored into another state.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conformance.adapters import TABLE, Adapter
from conformance.conftest import (
    BATCH,
    CLASSES,
    FEATURES,
    INSTALLED,
    KINDS,
    STRATEGIES,
    TX,
    accuracy,
    blobs,
    build,
)
from support.optional import optional

import ciclo
from ciclo._src.testing.kit import matmul_dtypes

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


# --- the contract, through ciclo.testing --------------------------------------------------------


class ConformanceTests(ciclo.testing.AdapterTests):
    """The kit's clauses for model `kind` of adapter `row` (one subclass each, below)."""

    row: ClassVar[Adapter]
    kind: ClassVar[str]
    adapter_name: ClassVar[str]  # read by conftest's dtype promotion fixture
    inputs = np.zeros((1, FEATURES), np.float32)

    @property
    def strategies(self) -> list[str]:  # type: ignore[override]
        # bn_dropout's layers are a superset of the MLP's (batch statistics and dropout keys on top):
        # it agrees with jit under every strategy; the MLP under fsdp, its parameters sharded.
        return STRATEGIES if self.kind == "bn_dropout" else ["jit", "fsdp"]

    def built(self) -> ciclo.types.ModelState:
        return build(self.row.load(), self.kind, strategy="jit")

    def make_adapter(self) -> ciclo.types.ModelAdapter:
        return self.built().adapter

    @property
    def variables(self) -> tuple[Any, Any] | None:  # type: ignore[override]
        if not self.row.load().INITIALISED:
            return None
        state = self.built()
        return state.params, state.model_state

    @property
    def uses_key(self) -> bool | None:  # type: ignore[override]
        return True if self.kind == "bn_dropout" else None  # the kit finds out that the MLP has no dropout

    @property
    def has_model_state(self) -> bool:  # type: ignore[override]
        return self.kind == "bn_dropout"

    @property
    def call_model(self) -> Callable[[Any, Any], Any] | None:  # type: ignore[override]
        return self.row.load().call_model(self.kind, classes=CLASSES)


for _row in INSTALLED:
    for _kind in KINDS:
        _name = f"TestContract_{_row.name}_{_kind}"
        globals()[_name] = type(
            _name, (ConformanceTests,), {"row": _row, "kind": _kind, "adapter_name": _row.name}
        )


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


# --- training, evaluation and prediction ------------------------------------------------------


@pytest.mark.parametrize("strategy", ["jit"])  # the kit checks that the other strategies agree with jit
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


# --- training options: mixed precision, gradient accumulation, EMA of the weights --------------

# "16-mixed" starting at a scale under which these gradients fit float16: "16-mixed" itself starts at
# 2**16, where the first steps overflow and are skipped until the scale has come down.
FLOAT16_MIXED = ciclo.types.Precision(jnp.float16, loss_scaling=True, initial_scale=2.0**8)


@pytest.mark.parametrize("strategy", ["jit", "fsdp"])
def test_16_mixed_skips_a_step_that_overflows(make_state: MakeState) -> None:
    state = make_state(precision=FLOAT16_MIXED)
    assert matmul_dtypes(state, TRAIN[0][0]) == {"float16"}
    logs, state = state.train_step(TRAIN[0])
    assert (float(logs.metrics.loss_scale), int(logs.metrics.skipped_steps)) == (2.0**8, 0)
    inputs, target = TRAIN[1]
    logs, skipped = state.train_step((inputs * 1e6, target))  # beyond float16's range: inf, then NaN
    assert not np.isfinite(float(logs.losses.loss))
    assert (float(logs.metrics.loss_scale), int(logs.metrics.skipped_steps)) == (2.0**7, 1)
    before, after = state.with_strategy("eager"), skipped.with_strategy("eager")
    # The loss scale (opt_state.loss_scale) halves; the rest of opt_state, the optimizer's, stays.
    assert_leaves_equal((after.params, after.opt_state.inner), (before.params, before.opt_state.inner))
    assert int(after.step) == 2
    logs, state = skipped.train_step(TRAIN[2])
    assert np.isfinite(float(logs.losses.loss)) and int(logs.metrics.skipped_steps) == 1
    assert not np.array_equal(
        float_leaves(state.with_strategy("eager").params)[0], float_leaves(after.params)[0]
    )


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


# One strategy: the metrics' agreement under every strategy is tests/core/test_managed.py's (and
# multidevice's); what depends on the adapter is that its state creator takes and keeps Metric objects.
@pytest.mark.parametrize("strategy", ["jit"])
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


@pytest.mark.parametrize("strategy", ["jit", "fsdp"])  # counted over the whole batch when it is sharded
def test_metrics_accumulate_until_reset(make_state: MakeState) -> None:
    state = make_state(metrics={"seen": lambda target: jnp.ones(target.shape)})
    for batch in TEST[:3]:
        logs, state = state.test_step(batch)
    assert float(logs.metrics.seen) == 1.0
    assert float(state.with_strategy("eager").metrics["seen"].count) == 3 * BATCH
    assert float(state.reset_step().with_strategy("eager").metrics["seen"].count) == 0


# --- compilation and checkpoints --------------------------------------------------------------


# jit, and fsdp's sharded arrays restored onto the target's sharding; data_parallel and pmap checkpoints,
# and moves between meshes, are tests/multidevice/test_another_mesh.py's.
@pytest.mark.parametrize("strategy", ["jit", "fsdp"])
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
