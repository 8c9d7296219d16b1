"""An Optuna study driving a population: one trial per member, reported to, pruned and told."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, final

import numpy as np

from ciclo._src.base.checks import check_int
from ciclo._src.base.elapsed import Elapsed
from ciclo._src.base.reprs import short
from ciclo._src.base.types import CallbackOutput
from ciclo._src.callbacks._loggers._base import import_extra
from ciclo._src.callbacks._monitor import stop_members
from ciclo._src.engine.callback import Callback
from ciclo._src.engine.loop_state import LoopState
from ciclo._src.logs.logs import LogsLike
from ciclo._src.logs.monitor import monitored_value
from ciclo._src.logs.step_output import NO_LOGS
from ciclo._src.state.population import Population, population


@final
class OptunaTrials(Callback):
    """One trial of an Optuna study per member of a population; see `ciclo.optuna_trials`."""

    hook: ClassVar[str | None] = "on_epoch_end"

    def __init__(
        self, study: Any, suggest: Callable[[Any], Mapping[str, Any]], n: int, monitor: str, every: int
    ) -> None:
        self._states = import_extra("optuna", "optuna", "ciclo.optuna_trials").trial.TrialState
        check_int(n, "n", 1, " (trials: one per member)")
        check_int(every, "every", 1, " (checks between two reports)")
        self.study, self.monitor, self.every = study, monitor, every
        self.trials = [study.ask() for _ in range(n)]
        """The members' trials, member `i`'s at `i`."""
        self.hparams = [dict(suggest(trial)) for trial in self.trials]
        if any(h.keys() != self.hparams[0].keys() for h in self.hparams):
            raise ValueError(
                "the members of a population share one program, so suggest(trial) must return the same "
                f"names for every trial; got {short([sorted(h) for h in self.hparams])}"
            )
        self.checks = 0
        self._last = [math.nan] * n  # each member's newest monitored value
        self._told = [False] * n

    def population(self, make_state: Callable[..., Any], *, batch_axis: str | None = None) -> Population:
        """The population of `make_state(**suggest(trial))`, one member per trial (`ciclo.population`)."""
        table = {name: [h[name] for h in self.hparams] for name in self.hparams[0]}
        return population(make_state, hparams=table, batch_axis=batch_axis)

    def __call__(self, elapsed: Elapsed, state: Population, logs: LogsLike) -> Population:
        """Reports each active member's value to its trial; freezes the members their trials prune."""
        if not isinstance(state, Population) or state.size != len(self.trials):
            raise TypeError(
                f"optuna_trials drives the population of its {len(self.trials)} trials, made by its "
                f".population(make_state); got {short(state)}"
            )
        values = monitored_value(logs, self.monitor, state.size, "optuna_trials")
        self.checks += 1
        active, pruned = np.asarray(state.active), np.zeros(state.size, bool)
        for i, trial in enumerate(self.trials):
            if not active[i] or self._told[i]:
                continue
            self._last[i] = float(values[i])
            if self.checks % self.every == 0:
                trial.report(self._last[i], elapsed.steps)
                pruned[i] = self._told[i] = trial.should_prune()
                if pruned[i]:
                    self.study.tell(trial, state=self._states.PRUNED)
        return stop_members(state, pruned) if pruned.any() else state

    def __loop_callback__(self, loop_state: LoopState[Any]) -> CallbackOutput[Any]:
        return NO_LOGS, self(loop_state.elapsed, loop_state.state, loop_state.accumulated_logs)

    def on_end(self, loop_state: LoopState[Any], error: BaseException | None, /) -> None:
        """The run ended by itself: each trial not pruned is told its member's newest value."""
        if error is not None:
            return
        for i, trial in enumerate(self.trials):
            if not self._told[i]:
                value = self._last[i]
                failed = math.isnan(value)  # no check ran, or the member diverged
                self.study.tell(trial, None if failed else value, self._states.FAIL if failed else None)
                self._told[i] = True


def optuna_trials(
    study: Any, suggest: Callable[[Any], Mapping[str, Any]], n: int, *, monitor: str = "loss", every: int = 1
) -> OptunaTrials:
    """An Optuna study driving a population: one trial per member (`pip install "ciclo-core[optuna]"`).

    It asks the study for `n` trials; `suggest(trial)` gives a trial's
    hyperparameters (`trial.suggest_float(...)`), and `.population(make_state)`
    makes one member of each. In `train_loop(callbacks=[...])`, at the end of
    each epoch, each active member's `monitor` goes to its trial
    (`trial.report(value, step)`, at every `every`-th check); a member whose
    trial `should_prune()` is frozen and its trial told `PRUNED`. When the
    run ends, each other trial is told its member's newest value. See
    docs/populations.md, "Optuna".

    Args:
        study: an `optuna.Study` (one objective; its direction is the monitor's).
        suggest: `trial -> {name: value}`, the same names for every trial: `make_state`'s keywords.
        n: the trials, one per member.
        monitor: entry name or full path, e.g. `"loss_test"`, one value per member.
        every: report at every `every`-th check.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax, optuna
        >>> def make_state(learning_rate):
        ...     tx = optax.inject_hyperparams(optax.sgd)(learning_rate=learning_rate)
        ...     return ciclo.managed.ManagedState.create(params=jnp.zeros(1), tx=tx)
        >>> study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        >>> rates = lambda trial: {"learning_rate": trial.suggest_float("learning_rate", 1e-3, 1e-1)}
        >>> search = ciclo.optuna_trials(study, rates, n=3)
        >>> search.population(make_state).size, [trial.number for trial in search.trials]
        (3, [0, 1, 2])
    """
    return OptunaTrials(study, suggest, n, monitor, every)
