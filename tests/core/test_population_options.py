"""The training options of a population's members, per member: testing with the EMA, spike skipping."""

from __future__ import annotations

import logging
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support.linear import FEATURES, Linear, batches

import ciclo

DATA, TEST = batches(12), batches(2, seed=3)
SPIKE = 6
GUARD = ciclo.SpikeGuard(window=4, on="loss")  # the gradient norm of step 6 is a spike by itself


def make(seed: int, learning_rate: float = 0.05, **options: Any) -> Any:
    return ciclo.create_model_state(
        Linear(),
        inputs=jnp.zeros((1, FEATURES)),
        key=seed,
        tx=optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate),
        losses=optax.softmax_cross_entropy_with_integer_labels,
        **options,
    )


def test_each_member_is_tested_with_its_own_ema_weights() -> None:
    rates = [0.05, 0.01]
    pop = ciclo.population(
        lambda seed, learning_rate: make(seed, learning_rate, ema_decay=0.5),
        seeds=[0, 1],
        hparams={"learning_rate": rates},
    )
    run = {"test_dataset": lambda: TEST, "epoch_duration": 4, "test_with_ema": True}
    pop, history, _ = ciclo.train_loop(pop, DATA[:8], **run)
    for i, (seed, rate) in enumerate(zip(pop.hparams["seed"], pop.hparams["learning_rate"], strict=True)):
        alone, reference, _ = ciclo.train_loop(make(seed, rate, ema_decay=0.5), DATA[:8], **run)
        np.testing.assert_allclose(
            history.member(i).collect("loss_test"), reference.collect("loss_test"), rtol=5e-6
        )
        member = pop.member(i)  # trained on with the trained weights, not the EMA
        np.testing.assert_allclose(member.params["w"], alone.params["w"], rtol=5e-6, atol=1e-7)
        np.testing.assert_allclose(member.ema_params["w"], alone.ema_params["w"], rtol=5e-6, atol=1e-7)


def test_test_with_ema_refuses_a_population_without_an_ema() -> None:
    pop = ciclo.population(make, seeds=[0, 1])
    with pytest.raises(ValueError, match="create it with ema_decay="):
        ciclo.train_loop(pop, DATA[:4], test_dataset=lambda: TEST, epoch_duration=2, test_with_ema=True)


def per_member(*datasets: list[Any]) -> list[Any]:
    """Each member its own batches (`batch_axis="member"`)."""
    steps = zip(*datasets, strict=True)
    return [tuple(np.stack(parts) for parts in zip(*step, strict=True)) for step in steps]


def test_a_spike_in_one_member_skips_that_members_step_only() -> None:
    inputs, target = DATA[SPIKE]
    spiky = [*DATA[:SPIKE], (inputs * np.float32(100.0), target), *DATA[SPIKE + 1 :]]
    pop = ciclo.population(lambda seed: make(seed, skip_spikes=GUARD), seeds=[0, 1], batch_axis="member")
    pop, history, _ = ciclo.train_loop(pop, per_member(DATA, spiky))
    skipped = history.collect("skipped")
    assert skipped[:, 0].tolist() == [0] * 12
    assert skipped[:, 1].tolist() == [int(step == SPIKE) for step in range(12)]
    for i, data in enumerate([DATA, spiky]):
        alone, _, _ = ciclo.train_loop(make(i, skip_spikes=GUARD), data)
        np.testing.assert_allclose(pop.member(i).params["w"], alone.params["w"], rtol=5e-6, atol=1e-7)


def test_max_consecutive_stops_a_population_naming_its_diverging_member() -> None:
    diverging = DATA[:6] + [(inputs * np.float32(100.0), target) for inputs, target in DATA[6:]]
    guard = ciclo.SpikeGuard(window=4, on="loss", max_consecutive=3)
    pop = ciclo.population(lambda seed: make(seed, skip_spikes=guard), seeds=[0, 1], batch_axis="member")
    with pytest.raises(RuntimeError, match="skipped the last 6 optimizer steps of member 1 up to step 12"):
        ciclo.train_loop(pop, per_member(DATA, diverging))


def test_max_skipped_steps_stops_a_population_with_a_stuck_member(caplog: pytest.LogCaptureFixture) -> None:
    overflowing = [(inputs * np.float32(1e6), target) for inputs, target in batches(60)]
    pop = ciclo.population(lambda seed: make(seed, precision="16-mixed"), seeds=[0, 1], batch_axis="member")
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        _, history, elapsed = ciclo.train_loop(pop, per_member(batches(60), overflowing), max_skipped_steps=5)
    assert elapsed.steps == 20  # the counts copied at step 10 are read at step 20
    assert history.collect("skipped_steps")[-1].tolist() == [0, 20]
    (message,) = [r.getMessage() for r in caplog.records if "were all skipped" in r.getMessage()]
    assert "the last 10 steps of member 1 up to step 10 were all skipped" in message
    assert "Stopping the loop: max_skipped_steps=5" in message


def test_unapplied_micro_batches_are_announced_for_a_population(caplog: pytest.LogCaptureFixture) -> None:
    pop = ciclo.population(lambda seed: make(seed, accumulate_steps=2), seeds=[0, 1])
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        ciclo.train_loop(pop, DATA[:5], stop=5)
    assert "will end at stop=5 steps, with 1 micro-batch(es) accumulated" in caplog.text
