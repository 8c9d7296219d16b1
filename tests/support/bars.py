"""Test doubles shared by the progress-bar tests."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

import ciclo
from ciclo._src.callbacks import _progress
from ciclo._src.loop import LoopState


class Clock:
    """Stands in for `time.perf_counter` in the bars, so redraws and timings are deterministic."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Tripwire:
    """A logged scalar that counts how often it is read (converted to a number or an array)."""

    size = 1
    shape = ()
    dtype = np.dtype("float32")

    def __init__(self, value: float) -> None:
        self.value = value
        self.reads = 0

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        self.reads += 1
        return np.asarray(self.value, dtype=dtype)

    def __float__(self) -> float:
        self.reads += 1
        return self.value


def loop_state(elapsed: ciclo.Elapsed, logs: ciclo.Logs) -> LoopState[Any]:
    return LoopState(
        state="state",
        batch=None,
        history=ciclo.history(),
        elapsed=elapsed,
        logs=ciclo.logs(),
        accumulated_logs=logs,
    )


def spy_on_host_copies(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Lets only the bars' redraws copy logged values to the host, and records the names each one copied.

    Run the loop under `jax.transfer_guard_device_to_host("disallow_explicit")`:
    any other device-to-host copy then fails the test.
    """
    fetched: list[list[str]] = []
    host_floats = _progress.host_floats

    def allowed_host_floats(entries: list[tuple[str, Any]]) -> list[tuple[str, float]]:
        fetched.append([name for name, _ in entries])
        with jax.transfer_guard_device_to_host("allow"):
            return host_floats(entries)

    monkeypatch.setattr(_progress, "host_floats", allowed_host_floats)
    return fetched
