"""How many steps a multi-device strategy lets XLA:CPU run ahead of Python.

XLA's CPU client deadlocks (and aborts after 40 seconds, "Termination timeout
for `all reduce`") when about 32 programs with collectives are queued on the
virtual devices of one process. So there, each step also returns a token, and
waits for the token of the step `MAX_STEPS_IN_FLIGHT` calls back (docs/strategies.md).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, cast

import jax
import jax.numpy as jnp

from ciclo._src.logs.logs import Logs

MAX_STEPS_IN_FLIGHT = 4

TokenedStep = Callable[[Any, Any], tuple[Logs, Any, jax.Array]]
Step = Callable[[Any, Any], tuple[Logs, Any]]


def needs_bound(devices: list[jax.Device]) -> bool:
    """Whether programs over `devices` can fill XLA:CPU's queue: several CPU devices of this process."""
    local = [device for device in devices if device.process_index == jax.process_index()]
    return len(local) > 1 and all(device.platform == "cpu" for device in local)


def compile_bounded(compile: Callable[[Any], Any], step: Step, devices: list[jax.Device]) -> Step:
    """`compile(step)`, bounded with a token when `devices` need it (see `needs_bound`)."""
    if not needs_bound(devices):
        return cast(Step, compile(step))

    def tokened(state: Any, batch: Any) -> tuple[Logs, Any, jax.Array]:
        logs, state = step(state, batch)
        return logs, state, jnp.zeros((), jnp.bool_)  # ready once every device has run the program

    compiled: TokenedStep = compile(tokened)
    pending: collections.deque[jax.Array] = collections.deque()

    def run(state: Any, batch: Any) -> tuple[Logs, Any]:
        logs, state, token = compiled(state, batch)
        pending.append(token)
        if len(pending) > MAX_STEPS_IN_FLIGHT:
            pending.popleft().block_until_ready()
        return logs, state

    return run
