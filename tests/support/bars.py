"""Test doubles shared by the progress-bar tests."""

from __future__ import annotations

import io
import re
import sys
import types
from typing import Any

import jax
import numpy as np
import pytest

import ciclo
from ciclo._src.callbacks import _progress
from ciclo._src.engine.phases import LoopState


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


def loop_state(elapsed: ciclo.types.Elapsed, logs: ciclo.types.Logs) -> LoopState[Any]:
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


class OutStream(io.TextIOBase):
    """Stands in for `ipykernel.iostream.OutStream`, the stream a Jupyter kernel's output goes through.

    Like the real one it is not a terminal (`isatty()` is False) and it keeps
    what was written until the front end renders it (here: `getvalue`).
    """

    def __init__(self, name: str = "stdout") -> None:
        self.name = name
        self._written: list[str] = []

    def write(self, text: str) -> int:
        self._written.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def getvalue(self) -> str:
        return "".join(self._written)


class Shell:
    """Stands in for the `IPython.get_ipython()` of a kernel (`kernel=True`) or of a terminal IPython."""

    def __init__(self, kernel: bool) -> None:
        self.config = (
            {"IPKernelApp": {"connection_file": "kernel.json"}} if kernel else {"TerminalIPythonApp": {}}
        )


def in_notebook(monkeypatch: pytest.MonkeyPatch, *, kernel: bool = True) -> None:
    """Makes this process look like a Jupyter kernel, or a terminal IPython: stand-in IPython, ipykernel."""
    iostream = types.ModuleType("ipykernel.iostream")
    iostream.OutStream = OutStream  # type: ignore[attr-defined]
    ipython = types.ModuleType("IPython")
    shell = Shell(kernel)
    ipython.get_ipython = lambda: shell  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    if kernel:
        monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
        monkeypatch.setitem(sys.modules, "ipykernel.iostream", iostream)


def rendered(text: str) -> list[str]:
    """The lines a notebook shows for `text` written to an output stream, as Jupyter renders it.

    Jupyter's front ends treat a carriage return as a terminal does: the text
    after it is written over the line from its start, covering only as many
    characters as it has (`fixCarriageReturn` in JupyterLab's `rendermime`).
    """
    lines = []
    for line in re.sub("\r+\n", "\n", text).split("\n"):
        shown = ""
        for part in line.split("\r"):
            shown = part + shown[len(part) :]
        lines.append(shown)
    if lines and lines[-1] == "":
        lines.pop()
    return lines
