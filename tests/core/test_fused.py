"""Fused execution: K steps per dispatch give K single steps' results, with exact elapsed and schedules."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import STRATEGIES
from support import training

import ciclo

K = 4


def hand_written_step() -> tuple[Any, Any]:
    apply = training.apply_mlp
    tx = training.optimizer()

    @jax.jit
    def train_step(state: Any, batch: Any) -> tuple[ciclo.types.Logs, Any]:
        params, opt_state = state
        loss, grads = jax.value_and_grad(lambda p: training.mse(apply, p, batch))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        preds = apply(params, batch[0])
        logs = ciclo.logs().add_loss("mse", loss).add_output("preds", preds)
        return logs, (optax.apply_updates(params, updates), opt_state)

    params = training.init_mlp(jax.random.key(0))
    return train_step, (params, tx.init(params))


def test_fused_hand_written_step_equals_single_steps() -> None:
    train_step, state0 = hand_written_step()
    data = training.batches()
    single, single_history, _ = ciclo.loop(state0, data, {ciclo.every(1): train_step})
    fused, history, elapsed = ciclo.loop(
        state0, ciclo.stacked(data, K), {ciclo.every(1): ciclo.fuse(train_step)}
    )

    training.assert_trees_close(fused, single)
    assert elapsed.steps == training.STEPS and elapsed.samples == training.STEPS * training.BATCH
    # One entry per step, as unfused steps give: the same steps, samples, losses and outputs.
    assert history.collect("steps", "samples") == single_history.collect("steps", "samples")
    assert history.collect("mse") == pytest.approx(single_history.collect("mse"), rel=1e-5)
    preds = history.collect("preds")
    assert [p.shape for p in preds] == [(training.BATCH, 1)] * training.STEPS
    np.testing.assert_allclose(
        np.concatenate(preds), np.concatenate(single_history.collect("preds")), rtol=1e-5, atol=1e-6
    )


def test_fused_logs_are_the_last_steps_with_every_step_stacked() -> None:
    train_step, state0 = hand_written_step()
    group = next(ciclo.stacked(training.batches(), K))
    logs, _ = ciclo.fuse(train_step)(state0, group)
    assert isinstance(logs, ciclo.types.StackedLogs)
    assert logs.per_step.losses.mse.shape == (K,) and logs.per_step.outputs.preds.shape == (
        K,
        training.BATCH,
        1,
    )
    assert float(logs.losses.mse) == float(logs.per_step.losses.mse[-1])


def test_schedules_fire_when_a_group_crosses_their_points() -> None:
    calls: list[tuple[int, int]] = []
    step = ciclo.fuse(lambda state, batch: (ciclo.logs(), state + batch.sum()))
    data = [np.ones(2, np.float32)] * 20
    state, _, elapsed = ciclo.loop(
        jnp.float32(0),
        ciclo.stacked(data, 3),
        {
            ciclo.every(1): step,
            ciclo.every(5): lambda state, batch, elapsed: calls.append((elapsed.steps, elapsed.samples)),
        },
    )
    assert float(state) == 40.0 and elapsed.steps == 20 and elapsed.samples == 40
    # Groups start at 0, 3, 6, ..., 18 (the last holds 2 batches); every(5) fires once per crossing.
    assert calls == [(0, 0), (6, 12), (12, 24), (15, 30)]


@pytest.mark.parametrize("strategy", [name for name in STRATEGIES if name != "pmap"])
def test_managed_steps_fuse_stacked_batches(strategy: str) -> None:
    data = training.batches()
    state = training.managed_state("mlp", strategy)
    for group in ciclo.stacked(data, K):
        logs, state = training.train_step(state, group)
    assert int(state.with_strategy("eager").step) == training.STEPS
    training.assert_trees_close(state.with_strategy("eager").params, training.reference_params("mlp", data))
    logs, _ = training.eval_step(state, next(ciclo.stacked(data, K)))
    assert logs.outputs.preds.shape == (training.BATCH, 1)  # the last step's
    assert logs.per_step.outputs.preds.shape == (K, training.BATCH, 1)
    assert len(training.train_step._fused) >= 1


def test_pmap_refuses_fused_steps() -> None:
    state = training.managed_state("linear", "pmap")
    with pytest.raises(ValueError, match="'pmap' does not run fused steps"):
        training.train_step(state, next(ciclo.stacked(training.batches(), K)))


def test_train_loop_with_stacked_batches_keeps_epochs_exact() -> None:
    state = training.managed_state("linear", "jit")
    epochs: list[int] = []

    class Epochs:
        def on_epoch_end(self, state: Any, batch: Any, elapsed: ciclo.types.Elapsed) -> None:
            epochs.append(elapsed.steps)

    state, history, elapsed = ciclo.train_loop(
        state.replace(),
        ciclo.stacked(training.batches(40), K),
        {ciclo.on_train_step: training.train_step},
        callbacks=[Epochs()],
        epoch_duration=8,
        stop=40,
    )
    # The hook sees the counts after the group that completes each epoch of 8 steps.
    assert elapsed.steps == 40 and epochs == [8, 16, 24, 32, 40]
    assert len(history.collect("losses.mse")) == 40  # one entry per step


def test_fused_steps_compile_once() -> None:
    traces = []

    def step(state: jax.Array, batch: jax.Array) -> tuple[ciclo.types.Logs, jax.Array]:
        traces.append(1)
        return ciclo.logs().add_metric("s", state), state + batch.sum()

    fused = ciclo.fuse(step)
    state = jnp.float32(0)
    for group in ciclo.stacked([np.ones(3, np.float32)] * 12, K):
        _, state = fused(state, group)
    assert len(traces) == 1 and float(state) == 36.0
    _, state = fused(state, np.ones(3, np.float32))  # a plain batch runs unfused
    assert float(state) == 39.0 and repr(fused) == "ciclo.fuse(step)"


@pytest.mark.parametrize("steps", [0, -1, 1.5])
def test_stacked_needs_a_positive_step_count(steps: Any) -> None:
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        list(ciclo.stacked([1, 2], steps))


def test_fuse_refuses_what_is_not_a_step() -> None:
    with pytest.raises(TypeError, match=r"fuse takes a step function \(state, batch\) -> .*, got 42"):
        ciclo.fuse(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="donate must be True or False, got 'yes'"):
        ciclo.fuse(lambda state, batch: state, donate="yes")  # type: ignore[arg-type]


def test_stacked_keeps_jax_arrays_on_device_and_counts_custom_sizes() -> None:
    (group,) = ciclo.stacked([{"x": jnp.ones((2, 3))}] * 2, 2, batch_size_fn=lambda batch: 5)
    assert isinstance(group.batches["x"], jax.Array) and group.batches["x"].shape == (2, 2, 3)
    assert group.samples == 10
