"""Shared by callbacks that watch a logged value (early stopping, best checkpoints)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from ciclo._src.logs import Logs, LogsLike

Mode = Literal["min", "max"]
"""Whether lower (`"min"`) or higher (`"max"`) values of a monitored entry are better."""


def check_mode(mode: str) -> Mode:
    """Validates `mode`, naming the valid values if it is wrong."""
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
    return mode  # type: ignore[return-value]


def monitored_value(logs: LogsLike, key: str) -> float | None:
    """The value of `key` in `logs` as a host float, or None if it is not there.

    This is where a monitored value is copied from the device.
    """
    source = logs if isinstance(logs, Logs) else Logs(logs)
    path = source.entry_path(key)
    if path is None:
        return None
    value: Any = source[path[0]][path[1]]
    array = np.asarray(value)
    if array.size != 1:
        raise ValueError(f"monitored entry {key!r} must be a scalar, got shape {array.shape}")
    return float(array.reshape(()))


def is_improvement(value: float, best: float | None, mode: Mode, min_delta: float = 0.0) -> bool:
    """Whether `value` beats `best` by more than `min_delta` (any value beats None)."""
    if math.isnan(value):
        return False
    if best is None:
        return True
    if mode == "min":
        return value < best - min_delta
    return value > best + min_delta


def present_keys(logs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The full paths of the entries in `logs`, for error messages."""
    return sorted(f"{c}.{n}" for c, entries in logs.items() for n in entries)
