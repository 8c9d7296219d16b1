"""flax nnx's training objects: an `nnx.Optimizer` in, `nnx.MultiMetric`s, and `to_nnx` out, bit for bit."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import ciclo
from ciclo_flax import NnxMetric, to_nnx

X = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
Y = np.arange(8, dtype=np.int32) % 3
LOSS = optax.softmax_cross_entropy_with_integer_labels


class Net(nnx.Module):
    """Batch statistics but no dropout: nnx by hand and ciclo take the same steps."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.dense = nnx.Linear(4, 16, rngs=rngs)
        self.norm = nnx.BatchNorm(16, rngs=rngs)
        self.out = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(nnx.relu(self.norm(self.dense(x))))


@nnx.jit
def nnx_step(model: Net, optimizer: nnx.Optimizer, x: jax.Array, y: jax.Array) -> None:  # type: ignore[type-arg]
    grads = nnx.grad(lambda model: LOSS(model(x), y).mean())(model)
    optimizer.update(model, grads)


def trained_by_hand(steps: int) -> tuple[Net, nnx.Optimizer]:  # type: ignore[type-arg]
    model = Net(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    model.train()
    for _ in range(steps):
        nnx_step(model, optimizer, X, Y)
    return model, optimizer


def assert_same(model: Net, optimizer: nnx.Optimizer, other: Net, other_optimizer: nnx.Optimizer) -> None:  # type: ignore[type-arg]
    for mine, theirs in [
        (nnx.state(model), nnx.state(other)),
        (optimizer.opt_state, other_optimizer.opt_state),
    ]:
        assert jax.tree.structure(nnx.as_pure(mine)) == jax.tree.structure(nnx.as_pure(theirs))
        for a, b in zip(jax.tree.leaves(mine), jax.tree.leaves(theirs), strict=True):
            np.testing.assert_array_equal(a, b)  # bit for bit
    assert int(optimizer.step[...]) == int(other_optimizer.step[...])


def test_an_nnx_optimizer_goes_in_and_comes_back_unchanged() -> None:
    model, optimizer = trained_by_hand(2)
    state = ciclo.create_flax_state(model, tx=optimizer, losses=LOSS)
    assert int(state.step) == 2
    back, back_optimizer = to_nnx(state)
    assert back is not model and back_optimizer.tx is optimizer.tx
    assert_same(back, back_optimizer, model, optimizer)


def test_three_ciclo_steps_are_three_nnx_steps() -> None:
    # Both compiled (an eager step rounds otherwise, and adam magnifies the rounding of zero gradients).
    model, optimizer = trained_by_hand(2)  # entering with optimizer state: adam's moments and count
    state = ciclo.create_flax_state(model, tx=optimizer, losses=LOSS)
    for _ in range(3):
        _, state = state.train_step((X, Y))
    expected, expected_optimizer = trained_by_hand(5)
    assert_same(*to_nnx(state), expected, expected_optimizer)


def test_a_model_and_optimizer_is_model_and_tx() -> None:
    model, optimizer = trained_by_hand(1)
    both = nnx.ModelAndOptimizer(model, optimizer.tx)
    nnx.update(both.opt_state, nnx.state(optimizer.opt_state))
    state = ciclo.create_flax_state(both, losses=LOSS)
    assert_same(*to_nnx(state), model, both)
    with pytest.raises(TypeError, match="brings its optimizer: leave tx= out"):
        ciclo.create_flax_state(both, tx=optax.sgd(0.1))


def test_options_that_wrap_the_optimizer() -> None:
    model, optimizer = trained_by_hand(1)
    with pytest.raises(ValueError, match="does not hold: leave these options out, or pass tx=optimizer.tx"):
        ciclo.create_flax_state(model, tx=optimizer, accumulate_steps=2)
    state = ciclo.create_flax_state(model, tx=optimizer.tx, losses=LOSS, ema_decay=0.9)
    _, state = state.train_step((X, Y))
    with pytest.raises(ValueError, match="which an nnx.Optimizer cannot hold: use state.model"):
        to_nnx(state)


def test_an_optimizer_of_another_model_is_refused() -> None:
    _, optimizer = trained_by_hand(0)
    with pytest.raises(ValueError, match=r"does not fit the model's nnx.Params.*wrt=nnx.Param"):
        ciclo.create_flax_state(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), tx=optimizer)


def test_to_nnx_needs_an_nnx_state_with_an_optimizer() -> None:
    for state in [
        ciclo.create_flax_state(nn.Dense(3), inputs=X[:1], tx=optax.sgd(0.1)),
        ciclo.create_flax_state(Net(nnx.Rngs(0))),
    ]:
        with pytest.raises(TypeError, match="takes the state of an nnx module with an optimizer"):
            to_nnx(state)


def test_nnx_metrics_are_logged_like_ciclo_metrics() -> None:
    metrics: dict[str, Any] = {
        "nnx": nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), mean_loss=nnx.metrics.Average("loss")),
        "mean_accuracy": lambda preds, target: preds.argmax(-1) == target,
    }
    state = ciclo.create_flax_state(Net(nnx.Rngs(0)), tx=optax.adam(1e-2), losses=LOSS, metrics=metrics)
    assert isinstance(state.metrics["nnx"], NnxMetric)
    losses = []
    for _ in range(3):
        logs, state = state.train_step((X, Y))
        losses.append(float(logs.losses.loss))
    assert float(logs.metrics.accuracy) == float(logs.metrics.mean_accuracy)
    assert float(logs.metrics.mean_loss) == pytest.approx(np.mean(losses))
    nnx_metric = state.metrics["nnx"].to_nnx()
    assert isinstance(nnx_metric, nnx.MultiMetric) and int(nnx_metric.mean_loss.count[...]) == 3
    assert int(state.reset_step().metrics["nnx"].to_nnx().mean_loss.count[...]) == 0
    # A MultiMetric alone is the state's metrics; a test loop logs its running values.
    state = ciclo.create_flax_state(Net(nnx.Rngs(0)), losses=LOSS, metrics=metrics["nnx"])
    assert list(state.metrics) == ["metrics"]
    _, history, _ = ciclo.test_loop(state, [(X, Y), (X[:4], Y[:4])])
    logs, _ = state.predict_step(X)
    right = np.asarray(logs.outputs.preds).argmax(-1) == Y
    expected = [right.mean(), np.concatenate([right, right[:4]]).mean()]  # running: over 8, then 12 rows
    assert history.collect("accuracy") == pytest.approx(expected)


def test_nnx_metrics_merge_and_reduce_as_sums() -> None:
    average = NnxMetric(*nnx.split(nnx.metrics.Average("loss"))).reset()
    a, b = average.update(loss=jnp.array([1.0, 2.0])), average.update(loss=jnp.array([6.0]))
    assert float(a.merge(b).compute()) == 3.0
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), a, b)  # as jax.lax.all_gather gives them
    assert float(stacked.reduce().compute()) == 3.0
