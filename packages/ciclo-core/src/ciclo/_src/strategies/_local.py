"""Single-device strategies: `eager` (no compilation) and `jit` / `jit_donate`."""

from __future__ import annotations

import dataclasses
from typing import TypeVar, final

import jax

from ciclo._src.logs import Logs
from ciclo._src.strategies._placement import GlobalView, unaliased
from ciclo._src.types import StepFn

T = TypeVar("T")


class _OneDevice(GlobalView):
    """The parts of a single-device strategy: everything stays where it is."""

    __slots__ = ()

    def from_host(self, state: T, /) -> T:
        return state

    def to_host(self, state: T, /) -> T:
        return state

    def lift_batch(self, batch: T, /) -> T:
        return batch

    def lower_logs(self, logs: Logs, /) -> Logs:
        return logs


@final
@dataclasses.dataclass(frozen=True)
class Eager(_OneDevice):
    """Runs the step as plain Python, op by op: for debugging with `print` and `pdb`.

    Example:
        >>> import ciclo
        >>> ciclo.get_strategy("eager")
        Eager()
    """

    def compile(self, step: StepFn, /) -> StepFn:
        return step


@final
@dataclasses.dataclass(frozen=True)
class JIT(_OneDevice):
    """Compiles the step with `jax.jit` on the default device.

    Args:
        donate: donate the input state's buffers to the output state
            (`"jit_donate"`): saves memory, but the state passed in can no
            longer be read after the step.

    Example:
        >>> import ciclo
        >>> ciclo.get_strategy("jit"), ciclo.get_strategy("jit_donate")
        (JIT(donate=False), JIT(donate=True))
    """

    donate: bool = False

    def from_host(self, state: T, /) -> T:
        # A buffer can be donated once: a state holding one array twice would fail at the first step.
        return unaliased(state) if self.donate else state

    def compile(self, step: StepFn, /) -> StepFn:
        return jax.jit(step, donate_argnums=(0,) if self.donate else ())
