"""Pruning a population: freeze its worst members at a schedule (successive halving)."""

from __future__ import annotations

import math
from typing import Any, ClassVar, final

import numpy as np

from ciclo._src.base.checks import check_int
from ciclo._src.base.elapsed import Elapsed
from ciclo._src.base.reprs import short
from ciclo._src.base.types import CallbackOutput
from ciclo._src.callbacks._monitor import snapshot_fields, stop_members
from ciclo._src.engine.callback import Callback
from ciclo._src.engine.loop_state import LoopState
from ciclo._src.logs.logs import LogsLike
from ciclo._src.logs.monitor import ModeLike, monitored_value, ranked_members, resolve_mode
from ciclo._src.logs.step_output import NO_LOGS
from ciclo._src.state.population import Population

_STATE_KEYS = ("checks", "pruned")


@final
class Prune(Callback):
    """Freezes a population's worst members at every `every`-th check; see `ciclo.prune`."""

    hook: ClassVar[str | None] = "on_epoch_end"

    def __init__(self, every: int, keep: int | float, monitor: str, mode: ModeLike) -> None:
        check_int(every, "every", 1, " (checks between prunings)")
        if isinstance(keep, float):
            if not 0 < keep < 1:
                raise ValueError(
                    f"keep as a float is the fraction of the members kept, in (0, 1); got {keep}"
                )
        else:
            check_int(keep, "keep", 1, " (members kept) or a float in (0, 1) (the fraction kept)")
        if not isinstance(monitor, str) or not monitor:
            raise TypeError(f"monitor must be the name of a logged entry, got {short(monitor)}")
        self.every, self.keep, self.monitor = every, keep, monitor
        self.mode = resolve_mode(mode, monitor)
        self.checks = 0
        self.pruned: list[int] = []
        """The members this callback froze, in the order it froze them."""

    def __call__(self, elapsed: Elapsed, state: Population, logs: LogsLike) -> Population:
        """Counts a check; at every `every`-th, returns `state` with its worst active members frozen."""
        if not isinstance(state, Population):
            raise TypeError(
                f"prune ranks the members of a population (ciclo.population), got {short(state)}; "
                "for one model, use ciclo.early_stopping or ciclo.checkpoint(monitor=...)"
            )
        self.checks += 1
        active = np.asarray(state.active)
        values = monitored_value(logs, self.monitor, state.size, "prune")
        ranked = [i for i in ranked_members(values, self.mode) if active[i]]
        kept = math.ceil(self.keep * len(ranked)) if isinstance(self.keep, float) else self.keep
        if self.checks % self.every or len(ranked) <= kept:
            return state
        self.pruned += ranked[kept:]
        return stop_members(state, np.isin(np.arange(state.size), ranked[kept:]))

    def __loop_callback__(self, loop_state: LoopState[Any]) -> CallbackOutput[Any]:
        return NO_LOGS, self(loop_state.elapsed, loop_state.state, loop_state.accumulated_logs)

    def state_dict(self) -> dict[str, Any]:
        """The checks counted and the members pruned, for `load_state_dict`."""
        return {"checks": self.checks, "pruned": list(self.pruned)}

    def load_state_dict(self, state: Any, /) -> None:
        """Takes back a `state_dict()` snapshot."""
        fields = snapshot_fields(state, _STATE_KEYS, "prune")
        self.checks, self.pruned = int(fields["checks"]), [int(i) for i in fields["pruned"]]


def prune(
    every: int = 1, keep: int | float = 0.5, *, monitor: str = "loss", mode: ModeLike = "auto"
) -> Prune:
    """Stops (freezes) a population's worst members at a schedule: successive halving.

    In `train_loop(callbacks=[...])` it checks at the end of each epoch; at
    every `every`-th check it ranks the active members by `monitor` (NaN
    last) and freezes all but the best `keep`. Frozen members stay in the
    population, unchanged. See docs/populations.md.

    Args:
        every: prune at every `every`-th check.
        keep: the active members kept at each pruning: a count (int), or a
            fraction (float in (0, 1), rounded up: `0.5` halves).
        monitor: entry name or full path, e.g. `"loss_test"`, one value per member.
        mode: `"auto"` (from the name of `monitor`), `"min"` or `"max"`.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> def make_state(seed):
        ...     return ciclo.managed.ManagedState.create(params=jnp.zeros(1), tx=optax.sgd(0.1))
        >>> pop = ciclo.population(make_state, seeds=range(4))
        >>> pruner = ciclo.prune(keep=0.5, monitor="loss")
        >>> logs = ciclo.logs().add_loss("loss", jnp.array([0.3, 0.1, 0.4, 0.2]))
        >>> pop = pruner(ciclo.types.Elapsed.create(), pop, logs)
        >>> pop.active.tolist(), pruner.pruned
        ([False, True, False, True], [0, 2])
    """
    return Prune(every, keep, monitor, mode)
