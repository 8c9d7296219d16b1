"""`ciclo.SpikeGuard`: skipping the optimizer steps whose loss or gradient norm spikes (`skip_spikes=`).

One tiny linear classifier and one guard for most cases, so that the steps compile once; a spike is a
batch whose inputs are multiplied by 100, planted at one step.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support.linear import FEATURES, Linear, batches

import ciclo
from ciclo import managed
from ciclo._src.callbacks._training_options import watch_training_options
from ciclo._src.state.training_options import TrainingOptions, spike_stats

GUARD = ciclo.SpikeGuard(window=4)  # judged from the 5th optimizer step on
SPIKE, NON_FINITE = 6, 9


def planted(data: list[Any], at: int, factor: float) -> list[Any]:
    inputs, target = data[at]
    return [*data[:at], (inputs * np.float32(factor), target), *data[at + 1 :]]


DATA = batches(12)
SPIKY = planted(planted(DATA, SPIKE, 100.0), NON_FINITE, np.nan)


def make(**options: Any) -> Any:
    return ciclo.create_model_state(
        Linear(),
        inputs=jnp.zeros((1, FEATURES)),
        tx=optax.adam(0.05),
        losses=optax.softmax_cross_entropy_with_integer_labels,
        **{"skip_spikes": GUARD, **options},
    )


def leaves(tree: Any) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def assert_same(a: Any, b: Any) -> None:
    for x, y in zip(leaves(a), leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def without_stats(opt_state: Any) -> Any:
    """The optimizer state but for the guard's statistics."""
    return optax.tree_utils.tree_get(opt_state, "SpikeState").inner


def test_a_planted_spike_and_a_non_finite_step_are_skipped_exactly() -> None:
    state = make()
    skipped = []
    for step, batch in enumerate(SPIKY):
        logs, new = state.train_step(batch)
        skipped.append(int(logs.metrics.skipped))
        if step in (SPIKE, NON_FINITE):
            assert_same(
                (new.params, without_stats(new.opt_state)), (state.params, without_stats(state.opt_state))
            )
            old, now = spike_stats(state.opt_state), spike_stats(new.opt_state)
            assert old is not None and now is not None
            assert_same((now.history, now.accepted), (old.history, old.accepted))  # nothing entered
        state = new
    assert skipped == [int(step in (SPIKE, NON_FINITE)) for step in range(len(SPIKY))]
    assert int(logs.metrics.skipped_steps) == 2 and bool(np.isfinite(state.params["w"]).all())
    stats = spike_stats(state.opt_state)
    assert stats is not None and int(stats.accepted) == len(SPIKY) - 2 and int(stats.skipped_in_a_row) == 0


@pytest.fixture(scope="module")
def skipped_on_jit() -> list[np.ndarray]:
    state = make()
    for batch in SPIKY:
        _, state = state.train_step(batch)
    return leaves((state.params, state.opt_state))


@pytest.mark.parametrize("strategy", ciclo.strategies.strategy_names())
def test_every_strategy_skips_the_same_steps(strategy: str, skipped_on_jit: list[np.ndarray]) -> None:
    state = make(strategy=strategy)
    for batch in SPIKY:
        logs, state = state.train_step(batch)
    assert int(logs.metrics.skipped_steps) == 2
    eager = state.with_strategy("eager")
    for actual, wanted in zip(leaves((eager.params, eager.opt_state)), skipped_on_jit, strict=True):
        np.testing.assert_allclose(actual, wanted, rtol=1e-5, atol=1e-6)


def test_steps_per_execution_skips_the_same_steps(skipped_on_jit: list[np.ndarray]) -> None:
    state, history, _ = ciclo.train_loop(make(), SPIKY, steps_per_execution=4)
    assert history.collect("skipped") == [int(step in (SPIKE, NON_FINITE)) for step in range(len(SPIKY))]
    for actual, wanted in zip(leaves((state.params, state.opt_state)), skipped_on_jit, strict=True):
        np.testing.assert_allclose(actual, wanted, rtol=1e-6, atol=1e-7)


def test_the_run_without_the_spike_takes_the_same_steps_as_the_run_that_skipped_it() -> None:
    skipping, plain = make(), make()
    for step, batch in enumerate(SPIKY):
        _, skipping = skipping.train_step(batch)
        if step not in (SPIKE, NON_FINITE):
            _, plain = plain.train_step(batch)
    assert_same(skipping.params, plain.params)
    assert_same(without_stats(skipping.opt_state), without_stats(plain.opt_state))


class _Crash(Exception):
    pass


def test_the_statistics_resume_bit_for_bit_through_a_backup(tmp_path: Any) -> None:
    def crash(elapsed: ciclo.types.Elapsed) -> None:
        if elapsed.steps == 5:  # after the backup at step 3, before the spike
            raise _Crash

    backup = ciclo.backup(tmp_path, every=3)
    with pytest.raises(_Crash):
        ciclo.train_loop(make(), SPIKY, tasks={ciclo.every(1): crash}, backup=backup)
    resumed, history, elapsed = ciclo.train_loop(make(), SPIKY, backup=backup)
    assert elapsed.steps == len(SPIKY)
    uninterrupted, reference, _ = ciclo.train_loop(make(), SPIKY)
    assert_same((resumed.params, resumed.opt_state), (uninterrupted.params, uninterrupted.opt_state))
    assert history.collect("skipped") == reference.collect("skipped")
    assert reference.collect("skipped")[SPIKE] == 1


def test_max_consecutive_stops_a_diverging_run_with_its_error() -> None:
    diverging = DATA[:6] + [(inputs * np.float32(100.0), target) for inputs, target in batches(24, seed=1)]
    seen = []
    with pytest.raises(RuntimeError) as raised:
        ciclo.train_loop(
            make(skip_spikes=ciclo.SpikeGuard(window=4, max_consecutive=3)),
            diverging,
            tasks={ciclo.every(1): lambda elapsed: seen.append(elapsed.steps)},
        )
    message = str(raised.value)
    # The look at step 20 reads the counts copied after step 10: steps 7 to 10 were skipped.
    assert "skipped the last 4 optimizer steps up to step 10, max_consecutive=3" in message
    assert "loss was" in message and "above its threshold" in message
    assert len(message) < 2000 and max(seen) < len(diverging)


def test_train_loop_watches_a_guard_only_with_a_limit() -> None:
    assert watch_training_options(make(), None) == []  # nothing runs for it at each step
    assert len(watch_training_options(make(skip_spikes=ciclo.SpikeGuard(max_consecutive=3)), None)) == 1


def test_a_run_that_ends_past_max_consecutive_stops_with_its_error_as_it_ends() -> None:
    diverging = DATA[:6] + [(inputs * np.float32(100.0), target) for inputs, target in DATA[6:]]
    with pytest.raises(RuntimeError, match="skipped the last 6 optimizer steps up to step 12"):
        ciclo.train_loop(make(skip_spikes=ciclo.SpikeGuard(window=4, max_consecutive=3)), diverging)


def test_under_accumulation_a_spike_skips_its_whole_optimizer_step() -> None:
    state = make(accumulate_steps=2, ema_decay=0.5, log_norms=True)
    losses = []
    for step, batch in enumerate(planted(DATA, 2 * 4, 100.0)):  # the first micro-batch of optimizer step 5
        if step == 2 * 4:
            before = state
        logs, state = state.train_step(batch)
        losses.append(float(logs.losses.loss))
        assert int(logs.metrics.skipped) == (step == 2 * 4 + 1)
        if step == 2 * 4 + 1:
            # params, EMA, norms and the optimizer's state as before the optimizer step; its
            # micro-batches dropped
            inner, old = without_stats(state.opt_state), without_stats(before.opt_state)
            assert_same(
                (state.params, state.ema_params, state.norms),
                (before.params, before.ema_params, before.norms),
            )
            assert_same(
                optax.tree_utils.tree_get(inner, "inner_opt_state"),
                optax.tree_utils.tree_get(old, "inner_opt_state"),
            )
            assert int(optax.tree_utils.tree_get(inner, "mini_step")) == 0
            assert not any(leaf.any() for leaf in leaves(optax.tree_utils.tree_get(inner, "acc_grads")))
            stats = spike_stats(state.opt_state)
            assert stats is not None
            # the loss judged is the optimizer step's: the mean of its micro-batches'
            np.testing.assert_allclose(stats.judged[0, 0], np.mean(losses[-2:]), rtol=1e-6)
    stats = spike_stats(state.opt_state)
    assert stats is not None and int(stats.skipped_steps) == 1 and int(stats.accepted) == len(DATA) // 2 - 1


def test_under_loss_scaling_a_non_finite_step_is_skipped_and_does_not_enter_the_statistics() -> None:
    precision = ciclo.types.Precision(
        jnp.float16, loss_scaling=True, initial_scale=2.0**4, growth_interval=100
    )
    state = make(precision=precision)
    data = planted(planted(DATA, SPIKE, 30.0), NON_FINITE, 1e6)  # float16 overflows at any scale
    skipped = []
    for step, batch in enumerate(data):
        logs, new = state.train_step(batch)
        skipped.append(int(logs.metrics.skipped))
        if step == NON_FINITE:
            assert_same(spike_stats(new.opt_state), spike_stats(state.opt_state))
            assert_same(new.params, state.params)
        state = new
    assert skipped == [int(step in (SPIKE, NON_FINITE)) for step in range(len(data))]
    assert int(logs.metrics.skipped_steps) == 2 and int(state.loss_scale.skipped_steps) == 1


def test_the_part_in_a_tx_of_ones_own_trains_as_the_keyword_does() -> None:
    guard = ciclo.SpikeGuard(window=2, on="grad_norm")
    by_hand = managed.ManagedState.create(
        params=jnp.zeros(2), tx=managed.skip_spikes(managed.accumulate(optax.sgd(0.1), 2), guard)
    )
    keywords = managed.ManagedState.create(
        params=jnp.zeros(2), tx=optax.sgd(0.1), accumulate_steps=2, skip_spikes=guard
    )
    for grads in (
        [1.0, 0.0],
        [1.0, 1.0],
        [0.0, 1.0],
        [1.0, 0.0],
        [1.0, 1.0],
        [9.0, 9.0],
        [1.0, 0.0],
        [0.0, 1.0],
    ):
        by_hand = by_hand.apply_gradients(grads=jnp.array(grads))
        keywords = keywords.apply_gradients(grads=jnp.array(grads))
    assert_same((by_hand.params, by_hand.opt_state), (keywords.params, keywords.opt_state))
    stats = spike_stats(keywords.opt_state)
    assert stats is not None and int(stats.skipped_steps) == 1


def test_judging_the_loss_needs_the_loss() -> None:
    state = managed.ManagedState.create(
        params=jnp.zeros(2), tx=optax.sgd(0.1), skip_spikes=ciclo.SpikeGuard()
    )
    with pytest.raises(ValueError, match="pass it as value="):
        state.apply_gradients(grads=jnp.ones(2))
    assert (
        int(spike_stats(state.apply_gradients(grads=jnp.ones(2), value=jnp.float32(1.0)).opt_state).accepted)
        == 1
    )


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"window": 1}, ValueError, "window must be an int >= 2"),
        ({"factor": 0}, ValueError, "factor must be a number > 0"),
        ({"factor": True}, ValueError, "factor must be a number > 0"),
        ({"on": ("loss", "accuracy")}, ValueError, "on must be 'loss', 'grad_norm' or both"),
        ({"on": ()}, ValueError, "on must be"),
        ({"warmup": 1}, ValueError, "warmup must be an int >= 2"),
        ({"max_consecutive": 0}, ValueError, "max_consecutive must be an int >= 1"),
        ({"max_consecutive": 2.0}, TypeError, "max_consecutive must be an int"),
    ],
)
def test_bad_guards_are_refused(options: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ciclo.SpikeGuard(**options)


def test_skip_spikes_takes_a_guard_and_an_optimizer() -> None:
    with pytest.raises(TypeError, match="skip_spikes must be a ciclo.SpikeGuard"):
        TrainingOptions(skip_spikes=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="skip_spikes=SpikeGuard.* acts on optimizer steps"):
        ciclo.create_model_state(Linear(), inputs=jnp.zeros((1, FEATURES)), skip_spikes=GUARD)


def test_a_resume_may_change_the_factor_but_not_what_the_statistics_hold() -> None:
    recorded = TrainingOptions(skip_spikes=GUARD).resume_options()["skip_spikes"]
    assert (
        TrainingOptions(skip_spikes=ciclo.SpikeGuard(window=4, factor=3.0, max_consecutive=5)).resume_refusal(
            "skip_spikes", recorded
        )
        is None
    )
    assert "hold the last 4 values of ['loss', 'grad_norm']" in str(
        TrainingOptions(skip_spikes=ciclo.SpikeGuard(window=8)).resume_refusal("skip_spikes", recorded)
    )
    assert "this state keeps a spike guard's statistics" in str(
        TrainingOptions(skip_spikes=GUARD).resume_refusal("skip_spikes", None)
    )
    assert "that this state does not keep" in str(TrainingOptions().resume_refusal("skip_spikes", recorded))


def test_a_backup_resumes_under_another_factor_with_a_note_and_refuses_another_window(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    ciclo.train_loop(make(), DATA, stop=3, backup=tmp_path)
    with pytest.raises(ValueError, match="hold the last 4 values of .*Resume with skip_spikes="):
        ciclo.train_loop(make(skip_spikes=ciclo.SpikeGuard(window=8)), DATA, stop=4, backup=tmp_path)
    with caplog.at_level("WARNING", logger="ciclo"):
        state, _, elapsed = ciclo.train_loop(
            make(skip_spikes=ciclo.SpikeGuard(window=4, factor=3.0)), DATA, stop=4, backup=tmp_path
        )
    assert "skip_spikes: " in caplog.text and elapsed.steps == 4
    stats = spike_stats(state.opt_state)
    assert stats is not None and stats.guard.factor == 3.0 and int(stats.accepted) == 4
