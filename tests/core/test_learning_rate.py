"""Managed steps log an injected learning rate and pass the loss to optimizers that take it."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support import training

import ciclo
from ciclo import managed

SCHEDULE = optax.linear_schedule(0.05, 0.01, transition_steps=training.STEPS)


def plateau_tx() -> optax.GradientTransformation:
    # patience=1: any step whose loss is not the best so far halves the rate (noisy batches do that).
    return optax.chain(
        optax.inject_hyperparams(optax.sgd)(learning_rate=0.05),
        optax.contrib.reduce_on_plateau(patience=1, factor=0.5, accumulation_size=1),
    )


def linear_state(tx: optax.GradientTransformation, strategy: str) -> managed.ManagedState:
    return managed.ManagedState.create(
        params=training.init_linear(jax.random.key(0)),
        tx=tx,
        apply_fn=training.apply_linear,
        strategy=strategy,
    )


def reference(tx: optax.GradientTransformation, data: list[Any]) -> tuple[Any, list[float]]:
    """Params and each update's rate by hand: the loss passed as `value=`, the rate read from the state."""
    params = training.init_linear(jax.random.key(0))
    opt_state = tx.init(params)

    @jax.jit  # one program a step: reduce_on_plateau's lax.cond run eagerly is lowered again each step
    def step(params: Any, opt_state: Any, batch: Any) -> tuple[Any, Any]:
        loss, grads = jax.value_and_grad(lambda p: training.mse(training.apply_linear, p, batch))(params)
        updates, opt_state = tx.update(grads, opt_state, params, value=loss)
        return optax.apply_updates(params, updates), opt_state

    rates = []
    for batch in data:
        params, opt_state = step(params, opt_state, batch)
        # inject_hyperparams alone, or chained with reduce_on_plateau.
        injected, plateau = (opt_state, None) if hasattr(opt_state, "hyperparams") else opt_state
        rate = float(injected.hyperparams["learning_rate"])
        if plateau is not None:
            rate *= float(plateau.scale)
        rates.append(rate)
    return params, rates


def test_an_injected_schedule_is_logged_every_step(strategy: str) -> None:
    data = training.batches()
    tx = optax.inject_hyperparams(optax.adam)(learning_rate=SCHEDULE)
    state = linear_state(tx, strategy)
    rates = []
    for batch in data:
        logs, state = training.train_step(state, batch)
        rates.append(float(logs.metrics.learning_rate))

    np.testing.assert_allclose(rates, [float(SCHEDULE(step)) for step in range(training.STEPS)], rtol=1e-6)
    assert rates[0] > rates[-1]
    params, _ = reference(tx, data)
    training.assert_trees_close(state.with_strategy("eager").params, params)


# optax 0.2.8's reduce_on_plateau averages the loss as `count * avg_value` (int32 times float32).
@pytest.mark.usefixtures("standard_dtype_promotion")
def test_reduce_on_plateau_gets_the_loss_and_lowers_the_logged_rate(strategy: str) -> None:
    data = training.batches()
    state = linear_state(plateau_tx(), strategy)
    rates = []
    for batch in data:
        logs, state = training.train_step(state, batch)
        rates.append(float(logs.metrics.learning_rate))

    params, expected = reference(plateau_tx(), data)
    np.testing.assert_allclose(rates, expected, rtol=1e-6)
    assert rates[0] == pytest.approx(0.05) and rates[-1] < rates[0] / 2  # lowered at least twice
    training.assert_trees_close(state.with_strategy("eager").params, params)


def test_fused_steps_log_each_steps_rate() -> None:
    data = training.batches(8)
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=SCHEDULE)
    _, history, _ = ciclo.loop(
        linear_state(tx, "jit"), ciclo.stacked(data, 4), {ciclo.every(1): [training.train_step]}
    )
    steps, rates = history.collect("steps", "learning_rate")
    assert steps == list(range(8))
    np.testing.assert_allclose(rates, [float(SCHEDULE(step)) for step in range(8)], rtol=1e-6)


@pytest.mark.usefixtures("standard_dtype_promotion")  # reduce_on_plateau, as above
def test_rates_and_scales_found_in_nested_optimizers() -> None:
    params = {"a": jnp.zeros(2), "b": jnp.zeros(2)}
    grads = {"a": jnp.ones(2), "b": jnp.ones(2)}
    by_group = optax.multi_transform(
        {
            "a": optax.inject_hyperparams(optax.sgd)(learning_rate=0.1),
            "b": optax.MultiSteps(optax.inject_hyperparams(optax.adam)(learning_rate=0.2), 1),
        },
        {"a": "a", "b": "b"},
    )
    state = managed.ManagedState.create(params=params, tx=by_group)
    state = state.apply_gradients(grads=grads)
    assert _rates(state) == {"learning_rate_0": 0.1, "learning_rate_1": 0.2}

    only_plateau = optax.chain(optax.sgd(0.1), optax.contrib.reduce_on_plateau())
    state = managed.ManagedState.create(params=params, tx=only_plateau)
    assert _rates(state.apply_gradients(grads=grads, value=jnp.float32(1.0))) == {"learning_rate_scale": 1.0}
    assert _rates(managed.ManagedState.create(params=params, tx=optax.adam(0.1))) == {}


def _rates(state: managed.ManagedState) -> dict[str, float]:
    from ciclo._src.state.learning_rate import learning_rate_logs

    return {name: round(float(value), 6) for name, value in learning_rate_logs(state.opt_state).items()}


@managed.train_step
def logs_its_own_rate(state: managed.ManagedState, batch: Any) -> ciclo.types.Logs:
    return (
        ciclo.logs().add_loss("loss", jnp.sum(state.params**2)).add_output("learning_rate", jnp.float32(-1))
    )


def test_a_rate_the_step_logs_is_kept() -> None:
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)
    logs, _ = logs_its_own_rate(managed.ManagedState.create(params=jnp.ones(2), tx=tx), None)
    assert "metrics" not in logs
    assert float(logs.outputs.learning_rate) == -1.0


def test_optimizers_without_a_rate_log_none() -> None:
    logs, _ = training.train_step(training.managed_state("linear", "jit"), training.batches(1)[0])
    assert set(logs) == {"losses", "metrics"} and set(logs.metrics) == {"mse"}


def test_an_apply_gradients_that_cannot_take_the_loss_is_refused_at_the_first_step() -> None:
    class OwnApply(managed.ManagedState):
        def apply_gradients(self, *, grads: Any) -> OwnApply:  # type: ignore[override]
            return self

    state = OwnApply.create(params=jnp.ones(()), tx=optax.sgd(0.1))
    # managed.train_step passes the loss as `value=`: Python's own error names the method.
    with pytest.raises(
        TypeError, match=r"OwnApply.apply_gradients\(\) got an unexpected keyword argument 'value'"
    ):
        logs_its_own_rate(state, None)


class IgnoresTheLoss(managed.ManagedState):
    """A state whose apply_gradients takes `value` and ignores it."""

    def apply_gradients(self, *, grads: Any, value: Any = None, **changes: Any) -> IgnoresTheLoss:
        updates, opt_state = self.tx.update(grads, self.opt_state, self.params)
        return dataclasses.replace(
            self, params=optax.apply_updates(self.params, updates), opt_state=opt_state, step=self.step + 1
        )


def test_an_apply_gradients_of_ones_own_trains() -> None:
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=0.5)
    state = IgnoresTheLoss.create(params=jnp.ones(()), tx=tx)
    logs, state = logs_its_own_rate(state, None)
    assert float(state.params) == 0.0  # 1 - 0.5 * d(p**2)/dp


def test_model_state_logs_the_rate() -> None:
    class Linear:
        def init(self, key: jax.Array, inputs: jax.Array) -> tuple[jax.Array, None]:
            return jnp.zeros(inputs.shape[-1]), None

        def apply(self, params: Any, model_state: Any, inputs: Any, *, key: Any, training: bool) -> Any:
            return inputs @ params, model_state

    state = ciclo.create_model_state(
        Linear(),
        inputs=jnp.ones((1, 2)),
        tx=optax.inject_hyperparams(optax.sgd)(learning_rate=optax.constant_schedule(0.25)),
        losses={"mse": lambda preds, target: (preds - target) ** 2},
    )
    logs, state = state.train_step((jnp.eye(2), jnp.ones(2)))
    assert float(logs.metrics.learning_rate) == 0.25
    logs, _ = state.test_step((jnp.eye(2), jnp.ones(2)))
    assert "learning_rate" not in logs.get("metrics", {})


@pytest.mark.usefixtures("standard_dtype_promotion")  # reduce_on_plateau, as above
def test_reduce_on_plateau_gets_the_loss_under_accumulation() -> None:
    data = training.batches()
    state = managed.ManagedState.create(
        params=training.init_linear(jax.random.key(0)),
        tx=plateau_tx(),
        apply_fn=training.apply_linear,
        accumulate_steps=2,
    )
    for batch in data:
        _, state = training.train_step(state, batch)

    # By hand: optax.MultiSteps passes each micro-batch's loss on to the optimizer it wraps.
    tx = optax.MultiSteps(plateau_tx(), every_k_schedule=2)
    params = training.init_linear(jax.random.key(0))
    opt_state = tx.init(params)
    loss_and_grad = jax.jit(jax.value_and_grad(lambda p, b: training.mse(training.apply_linear, p, b)))
    update = jax.jit(tx.update)
    for batch in data:
        loss, grads = loss_and_grad(params, batch)
        updates, opt_state = update(grads, opt_state, params, value=loss)
        params = optax.apply_updates(params, updates)
    assert float(opt_state.inner_opt_state[1].scale) < 1  # the plateau lowered the rate
    training.assert_trees_close(state.params, params)
