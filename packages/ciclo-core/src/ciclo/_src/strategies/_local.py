"""Single-device strategies: `eager` (no compilation) and `jit` / `jit_donate`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar, final

import jax

from ciclo._src.strategies._placement import gather, unaliased
from ciclo._src.strategies._protocols import StepFn

T = TypeVar("T")


class _OneDevice:
    """The placement of a single-device strategy: the state whole on this process's first device."""

    def create(self, init: Callable[..., T], /, *args: Any) -> T:
        return self.place(init(*args))

    def place(self, state: T, /) -> T:
        return gather(state)

    def unplace(self, state: T, /) -> T:
        return state

    def lift_batch(self, batch: T, /) -> T:
        return batch


@final
@dataclasses.dataclass(frozen=True)
class Eager(_OneDevice):
    """Runs the step as plain Python, op by op: for debugging with `print` and `pdb`.

    Example:
        >>> import ciclo
        >>> ciclo.strategies.get_strategy("eager")
        Eager()
    """

    def compile(self, step: StepFn, /, *, donate: bool = False) -> StepFn:
        return step


@final
@dataclasses.dataclass(frozen=True)
class JIT(_OneDevice):
    """Compiles the step with `jax.jit` on the default device.

    Args:
        donate: donate the input state's buffers to the output state (`"jit_donate"`).

    Example:
        >>> import ciclo
        >>> ciclo.strategies.get_strategy("jit"), ciclo.strategies.get_strategy("jit_donate")
        (JIT(donate=False), JIT(donate=True))
    """

    donate: bool = False

    def place(self, state: T, /) -> T:
        # A buffer can be donated once: a state holding one array twice would fail at the first step.
        # Copies first: moving the arrays can give one buffer two new Python objects.
        return gather(unaliased(state) if self.donate else state)

    def compile(self, step: StepFn, /, *, donate: bool = False) -> StepFn:
        return jax.jit(step, donate_argnums=(0,) if donate and self.donate else ())
