"""`ciclo.optuna_trials`: a real in-memory Optuna study driving a population, one trial per member."""

from __future__ import annotations

import sys
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support.linear import FEATURES, Linear, batches

import ciclo

optuna = pytest.importorskip("optuna")
TrialState = optuna.trial.TrialState
DATA, TEST = batches(12), batches(2, seed=3)
STEPS = [2, 4, 6, 8, 10, 12]  # each epoch's end: where the trials are reported to


def make(learning_rate: float) -> Any:
    return ciclo.create_model_state(
        Linear(),
        inputs=jnp.zeros((1, FEATURES)),
        tx=optax.inject_hyperparams(optax.sgd)(learning_rate=learning_rate),
        losses=optax.softmax_cross_entropy_with_integer_labels,
    )


def rate(trial: Any) -> dict[str, float]:
    return {"learning_rate": trial.suggest_float("learning_rate", 0.0, 1.0)}


def run(study: Any, rates: list[float], **options: Any) -> tuple[Any, Any, Any]:
    for value in rates:  # the trials' parameters, as the test says
        study.enqueue_trial({"learning_rate": value})
    search = ciclo.optuna_trials(study, rate, len(rates), monitor="loss_test", **options)
    pop, history, _ = ciclo.train_loop(
        search.population(make), DATA, test_dataset=lambda: TEST, epoch_duration=2, callbacks=[search]
    )
    return search, pop, history


def test_trials_are_reported_pruned_and_told_as_the_pruner_decides() -> None:
    study = optuna.create_study(pruner=optuna.pruners.MedianPruner(n_startup_trials=0, n_warmup_steps=0))
    # No trial has completed yet: the median pruner prunes none of the first population.
    first, pop, history = run(study, [0.3, 0.1, 0.03, 0.01])
    assert [trial.state for trial in study.trials] == [TrialState.COMPLETE] * 4
    assert pop.active.tolist() == [True] * 4
    losses = history.collect("loss_test")
    for i, trial in enumerate(study.trials):
        assert trial.params == {"learning_rate": first.hparams[i]["learning_rate"]}
        assert trial.intermediate_values == dict(zip(STEPS, losses[:, i].tolist(), strict=True))
        assert trial.value == losses[-1, i]

    medians = np.median(losses, axis=1)  # what MedianPruner compares each step's value with
    second, pop, history = run(study, [0.2, 0.0, 0.3, 0.001])
    later = history.collect("loss_test")
    trials = study.trials[4:]
    for i, trial in enumerate(trials):
        worse = [
            step for step, value, median in zip(STEPS, later[:, i], medians, strict=True) if value > median
        ]
        if worse:  # pruned at the first report worse than the median: frozen, told PRUNED, no more reports
            assert trial.state == TrialState.PRUNED and not pop.active[i]
            assert max(trial.intermediate_values) == worse[0]
        else:
            assert trial.state == TrialState.COMPLETE and pop.active[i]
            assert trial.value == later[-1, i]
        reported = trial.intermediate_values
        assert reported == {step: later[STEPS.index(step), i] for step in reported}
    assert {trial.state for trial in trials} == {TrialState.PRUNED, TrialState.COMPLETE}


def test_every_reports_at_every_nth_check_and_a_member_with_no_value_fails() -> None:
    study = optuna.create_study()
    search = ciclo.optuna_trials(study, rate, 2, monitor="loss_test", every=3)
    pop, history, _ = ciclo.train_loop(
        search.population(make), DATA, test_dataset=lambda: TEST, epoch_duration=2, callbacks=[search]
    )
    assert [sorted(trial.intermediate_values) for trial in study.trials] == [[6, 12], [6, 12]]
    untried = ciclo.optuna_trials(study, rate, 1)
    untried.on_end(None, None)  # type: ignore[arg-type]  # the run ended before any check
    assert study.trials[-1].state == TrialState.FAIL


def test_bad_uses_are_refused() -> None:
    study = optuna.create_study()
    with pytest.raises(ValueError, match="must return the same names for every trial"):
        ciclo.optuna_trials(study, lambda trial: {f"x{trial.number}": 1.0}, 2)
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        ciclo.optuna_trials(study, rate, 0)
    search = ciclo.optuna_trials(study, rate, 2)
    with pytest.raises(TypeError, match="drives the population of its 2 trials"):
        search(ciclo.types.Elapsed.create(), make(0.1), ciclo.logs())


def test_without_optuna_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(ImportError, match=r'pip install "ciclo-core\[optuna\]"'):
        ciclo.optuna_trials(object(), rate, 1)
