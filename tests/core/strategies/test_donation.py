"""Donating strategies donate only in training steps: the state a test pass reads stays valid."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from support import training

import ciclo


@pytest.mark.parametrize("strategy", ["jit", "jit_donate"])
def test_train_loop_with_a_test_pass_under_donation(strategy: str) -> None:
    state = training.managed_state("linear", strategy)
    state, history, elapsed = ciclo.train_loop(
        state,
        training.batches(),
        {ciclo.on_train_step: training.train_step, ciclo.on_test_step: training.eval_step},
        test_dataset=lambda: training.batches(2, seed=1),
        epoch_duration=5,
        stop=10,
    )
    assert elapsed.steps == 10
    assert len(history.collect("mse_test")) == 2
    expected = training.reference_params("linear", training.batches()[:10])
    training.assert_trees_close(state.with_strategy("eager").params, expected)
    assert np.isfinite(np.asarray(state.params["w"])).all()  # still readable


@pytest.mark.parametrize("strategy", ["jit", "jit_donate"])
def test_restore_best_weights_returns_live_weights_under_donation(strategy: str) -> None:
    # The best state was the input of the next, donated, step: "Array has been deleted" on first use.
    state, expected = training.best_weights_run(training.managed_state("linear", strategy))
    training.assert_trees_close(state.with_strategy("eager").params, expected)
    assert all(not leaf.is_deleted() for leaf in jax.tree.leaves(state))
