"""Fused multi-step execution: `fuse` runs a step over a `Stacked` batch with one `lax.scan`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, final

import jax

from ciclo._src.base.batches import is_stacked
from ciclo._src.base.checks import check_bool
from ciclo._src.base.reprs import short
from ciclo._src.logs.logs import Logs, StackedLogs
from ciclo._src.logs.step_output import step_output

S = TypeVar("S")

StepFn = Callable[[Any, Any], Any]


def as_logs_and_state(step: StepFn, state: S, batch: Any) -> tuple[Logs, S]:
    logs, new_state = step_output(step(state, batch), state, step)
    return (logs if type(logs) is Logs else Logs(logs)), new_state


def scan_steps(step: StepFn, state: Any, batches: Any) -> tuple[StackedLogs, Any]:

    def body(state: Any, batch: Any) -> tuple[Any, Logs]:
        logs, state = as_logs_and_state(step, state, batch)
        return state, logs

    state, logs = jax.lax.scan(body, state, batches)
    return StackedLogs.of(logs), state


@final
class Fused(Generic[S]):
    """A step that runs a `Stacked` batch's steps in one dispatch; see `fuse`."""

    __slots__ = ("__name__", "__wrapped__", "_fused")

    def __init__(self, step: StepFn, donate: bool) -> None:
        self.__wrapped__ = step
        self.__name__ = getattr(step, "__name__", type(step).__name__)
        self._fused = jax.jit(
            lambda state, batches: scan_steps(step, state, batches), donate_argnums=(0,) if donate else ()
        )

    def __repr__(self) -> str:
        return f"ciclo.fuse({self.__name__})"

    def __call__(self, state: S, batch: Any) -> tuple[Logs, S]:
        if is_stacked(batch):
            return self._fused(state, batch.batches)  # type: ignore[no-any-return]
        return as_logs_and_state(self.__wrapped__, state, batch)


def fuse(step: StepFn, *, donate: bool = False) -> Fused[Any]:
    """Makes a traceable `step` run all the steps of a `ciclo.types.Stacked` batch in one `jax.lax.scan`.

    It returns the last step's logs, every step's in their `per_step`; a plain batch runs `step` unfused.
    See docs/guide.md, "Fused steps".

    Args:
        step: `(state, batch) -> (logs, state)`.
        donate: donate the input state's buffers to the output state.

    Raises:
        TypeError: for a `step` that is not callable, or a `donate` that is not a bool.

    Example:
        >>> import ciclo, jax.numpy as jnp, numpy as np
        >>> def train_step(state, batch):
        ...     return ciclo.logs().add_metric("total", state + batch.sum()), state + batch.sum()
        >>> dataset = ciclo.stacked([np.ones(2, np.float32)] * 8, 4)
        >>> state, history, elapsed = ciclo.loop(
        ...     jnp.float32(0), dataset, {ciclo.every(1): ciclo.fuse(train_step)}
        ... )
        >>> float(state), elapsed.steps, history.collect("total")
        (16.0, 8, [2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0])
    """
    if not callable(step):
        raise TypeError(f"fuse takes a step function (state, batch) -> (logs, state), got {short(step)}")
    check_bool(donate, "donate")
    return Fused(step, donate)
