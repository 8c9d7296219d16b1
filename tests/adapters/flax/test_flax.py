"""ciclo-flax specifics: linen training flags and collections, nnx splitting, dropout, clu metrics."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from support.flax_models import Nnx

import ciclo
import ciclo_flax
from ciclo_flax._linen import training_flag

X = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
Y = np.arange(8, dtype=np.int32) % 3
LOSSES = {"loss": optax.softmax_cross_entropy_with_integer_labels}


class Flagged(nn.Module):
    """Dropout + batch norm, switched by a `__call__` argument of a configurable name."""

    flag: str

    @nn.compact
    def __call__(self, x: jax.Array, **kwargs: bool) -> jax.Array:
        value = kwargs.get(self.flag, self.flag == "deterministic")
        training = not value if self.flag == "deterministic" else value
        x = nn.BatchNorm(use_running_average=not training)(nn.Dense(16)(x))
        return nn.Dense(3)(nn.Dropout(0.5, deterministic=not training)(x))


def _flagged(flag: str) -> nn.Module:
    # A subclass whose `__call__` names the flag explicitly, as a user's module would.
    namespace: dict[str, Any] = {}
    exec(
        f"def __call__(self, x, {flag}: bool = {flag == 'deterministic'}):\n"
        f"    return Flagged.__call__(self, x, {flag}={flag})\n",
        {"Flagged": Flagged},
        namespace,
    )
    return type(f"Flagged_{flag}", (Flagged,), {"__call__": namespace["__call__"]})(flag)


def make(kind: str, **overrides: Any) -> ciclo.types.ModelState:
    settings: dict[str, Any] = {"tx": optax.sgd(0.0), "losses": LOSSES, "strategy": "jit", **overrides}
    if kind == "nnx":
        return ciclo.create_flax_state(Nnx(nnx.Rngs(0)), **settings)
    return ciclo.create_flax_state(_flagged(kind), inputs=jnp.zeros((1, 4)), **settings)


FLAGS_NOT_IN_CONFORMANCE = ["train", "is_training", "deterministic"]
"""The linen training flags the conformance suite's models do not use (its linen model takes `training`)."""


@pytest.mark.parametrize("flag", ["training", "train", "is_training", "deterministic"])
def test_training_flag_is_found(flag: str) -> None:
    assert training_flag(_flagged(flag)) == flag
    assert training_flag(nn.Dense(2)) is None


@pytest.mark.parametrize("kind", FLAGS_NOT_IN_CONFORMANCE)
def test_dropout_is_on_in_training_only_and_statistics_update_in_training_only(kind: str) -> None:
    state = make(kind)
    stats = jax.tree.leaves(state.model_state)
    a, _ = state.train_step((X, Y))
    b, trained = state.train_step((X, Y))  # same state, same step: same key
    _, next_state = trained.train_step((X, Y))
    c, _ = trained.train_step((X, Y))
    assert float(a.losses.loss) == float(b.losses.loss)
    assert float(a.losses.loss) != float(c.losses.loss)  # a new step, a new dropout mask
    assert any(
        not np.allclose(s, t) for s, t in zip(stats, jax.tree.leaves(trained.model_state), strict=True)
    )

    first, tested = trained.predict_step(X)
    second, _ = trained.predict_step(X)
    np.testing.assert_array_equal(first.outputs.preds, second.outputs.preds)
    for before, after in zip(host_leaves(trained.model_state), host_leaves(tested.model_state), strict=True):
        np.testing.assert_array_equal(before, after)


def host_leaves(tree: Any) -> list[np.ndarray]:
    """The leaves as numpy arrays, rng keys as their key data."""
    leaves = jax.tree.leaves(tree)
    return [
        np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
        for x in leaves
    ]


def test_linen_without_model_state_has_none() -> None:
    state = ciclo.create_flax_state(nn.Dense(3), inputs=jnp.zeros((1, 4)), tx=optax.sgd(0.1), losses=LOSSES)
    assert state.model_state is None
    _, state = state.train_step((X, Y))
    assert int(state.step) == 1


def test_nnx_params_are_the_params_and_the_rest_is_model_state() -> None:
    state = make("nnx")
    assert {
        type(v).__name__ for v in jax.tree.leaves(state.params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    } == {"Param"}
    kinds = {
        type(v).__name__
        for v in jax.tree.leaves(state.model_state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    }
    assert "BatchStat" in kinds


def test_errors_say_what_is_accepted() -> None:
    with pytest.raises(TypeError, match="flax.linen.Module or a flax.nnx.Module, got function"):
        ciclo.create_flax_state(lambda x: x, inputs=X, tx=optax.sgd(0.1))
    with pytest.raises(TypeError, match="needs sample `inputs`"):
        ciclo.create_flax_state(nn.Dense(3), tx=optax.sgd(0.1))
    adapter, _ = ciclo_flax.NnxAdapter.split(Nnx(nnx.Rngs(0)))
    with pytest.raises(TypeError, match="initialised when it is built"):
        adapter.init(jax.random.key(0), X)


# clu's Average (and Accuracy) computes `total / count`, a float32 by an int32 count, which strict
# dtype promotion rejects.
@pytest.mark.usefixtures("standard_dtype_promotion")
def test_clu_metrics_work_unwrapped() -> None:
    from clu import metrics as clu_metrics  # clu needs flax, so it is tested here and not in core

    state = ciclo.create_flax_state(
        nn.Dense(3),
        inputs=jnp.zeros((1, 4)),
        tx=optax.sgd(0.0),
        losses=LOSSES,
        metrics={
            "clu_accuracy": clu_metrics.Accuracy,
            "accuracy": lambda preds, target: preds.argmax(-1) == target,
            "mean_loss": clu_metrics.Average.from_output("loss"),
        },
    )
    assert all(isinstance(metric, ciclo.metrics.Metric) for metric in state.metrics.values())
    batches = [(X, Y), (X[:4], Y[:4])]
    _, history, _ = ciclo.test_loop(state, batches)
    np.testing.assert_allclose(history.collect("clu_accuracy"), history.collect("accuracy"), rtol=1e-6)
    # clu's Average counts each batch's loss once; test_loop logs the loss weighted by samples.
    losses = [float(state.test_step(batch)[0].losses.loss) for batch in batches]
    np.testing.assert_allclose(history.collect("mean_loss"), np.cumsum(losses) / [1, 2], rtol=1e-5)
