"""`performance.compiles`: how many times the loop's managed steps were compiled, logged when it changes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, final

from ciclo._src.base.types import CallbackOutput, S
from ciclo._src.engine.callback import Callback
from ciclo._src.engine.loop_state import LoopState
from ciclo._src.logs.logs import Logs
from ciclo._src.logs.step_output import NO_LOGS
from ciclo._src.state.managed import ManagedStep

COLLECTION: Final = "performance"
"""The history collection of the count (loggers write it; progress bars do not show it)."""

ENTRY: Final = "compiles"
"""The history entry of the count."""


@final
class CompileCount(Callback):
    """Logs `performance.compiles`, the compiles of `steps` so far, at the first step and each that compiled.

    `train_loop` puts one after its managed training steps. Each step costs a
    read of each step's counter (`managed.ManagedStep.compiles`). While the
    loop runs, the steps warn of a recompile (`ciclo.types.RecompileWarning`).

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> @managed.train_step
        ... def train_step(state, batch):
        ...     return ciclo.logs().add_loss("loss", jnp.sum(state.params * batch) ** 2), state
        >>> state = managed.ManagedState.create(params=jnp.ones(2), tx=optax.sgd(0.1))
        >>> _, history, _ = ciclo.train_loop(state, [jnp.ones(2)] * 3, {ciclo.on_train_step: [train_step]})
        >>> history.collect("steps", "compiles")
        ([0], [1])
    """

    def __init__(self, steps: Iterable[ManagedStep[Any]]) -> None:
        self._steps = tuple(steps)
        self._logged = -1  # the count last logged: the first step logs it

    def on_start(self, loop_state: LoopState[Any], /) -> None:
        for step in self._steps:
            step.watch_recompiles(True)

    def on_end(self, loop_state: LoopState[Any], error: BaseException | None, /) -> None:
        for step in self._steps:
            step.watch_recompiles(False)

    def __loop_callback__(self, loop_state: LoopState[S]) -> CallbackOutput[S]:
        count = 0
        for step in self._steps:
            count += step.compiles
        if count == self._logged:
            return NO_LOGS, loop_state.state
        if self._logged < 0:  # the loop's first step: what a later compile is compared with
            for step in self._steps:
                step.ran_first(loop_state.state, loop_state.batch)
        self._logged = count
        return Logs().add_entry(COLLECTION, ENTRY, count), loop_state.state

    def __repr__(self) -> str:
        return f"CompileCount({', '.join(repr(step) for step in self._steps)})"
