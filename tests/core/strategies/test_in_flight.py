"""The bound on how many steps a multi-device strategy leaves queued on XLA:CPU's devices."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from ciclo._src.strategies._in_flight import MAX_STEPS_IN_FLIGHT, compile_bounded, needs_bound


class Token:
    """Stands for a step's token: records that the caller waited for it."""

    def __init__(self, index: int, waited: list[int]) -> None:
        self.index = index
        self._waited = waited

    def block_until_ready(self) -> Token:
        self._waited.append(self.index)
        return self


def test_each_call_waits_for_the_step_limit_calls_back_oldest_first() -> None:
    waited: list[int] = []
    calls = iter(range(100))

    def compile(tokened: Any) -> Any:
        def compiled(state: Any, batch: Any) -> tuple[Any, Any, Any]:
            logs, state, _ = tokened(state, batch)
            return logs, state, Token(next(calls), waited)

        return compiled

    here = jax.process_index()
    cpus = [FakeDevice("cpu", here), FakeDevice("cpu", here)]
    step = compile_bounded(compile, lambda state, batch: ({"step": batch}, state + 1), cpus)  # type: ignore[arg-type]
    limit = MAX_STEPS_IN_FLIGHT
    for index in range(limit):
        assert step(index, index) == ({"step": index}, index + 1)
    assert waited == []  # `limit` steps may be in flight
    for index in range(limit, limit + 5):
        step(index, index)
        assert waited == list(range(index - limit + 1))


def test_the_default_limit_is_well_under_where_xla_cpu_deadlocks() -> None:
    # XLA:CPU deadlocked at 32 queued programs with collectives (32 failed, 24 passed, under load).
    assert 1 < MAX_STEPS_IN_FLIGHT <= 8


@dataclasses.dataclass
class FakeDevice:
    platform: str
    process_index: int = 0


def test_only_several_cpu_devices_of_this_process_are_bounded() -> None:
    here = jax.process_index()
    assert needs_bound([FakeDevice("cpu", here), FakeDevice("cpu", here)])  # type: ignore[list-item]
    assert not needs_bound([FakeDevice("cpu", here)])  # type: ignore[list-item]
    assert not needs_bound([FakeDevice("gpu", here), FakeDevice("gpu", here)])  # type: ignore[list-item]
    # Other processes' devices rendezvous over gloo, not in this process's queue.
    assert not needs_bound([FakeDevice("cpu", here), FakeDevice("cpu", here + 1)])  # type: ignore[list-item]
