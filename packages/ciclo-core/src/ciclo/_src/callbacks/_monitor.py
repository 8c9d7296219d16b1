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


def snapshot_fields(snapshot: Any, names: tuple[str, ...], owner: str) -> Mapping[str, Any]:
    """Checks that a snapshot given to `restore_callback_state` has exactly the keys `names`.

    Args:
        snapshot: what `restore_callback_state` received.
        names: the keys `callback_state()` writes.
        owner: the callback's name, for the error message.

    Returns:
        `snapshot`, as a mapping.

    Raises:
        TypeError: if `snapshot` is not a mapping.
        ValueError: if keys are missing or unknown (the message names them), as
            happens with a snapshot of another callback.
    """
    if not isinstance(snapshot, Mapping):
        raise TypeError(
            f"{owner}.restore_callback_state takes the dict that callback_state() returned, got {snapshot!r}"
        )
    missing = [name for name in names if name not in snapshot]
    unknown = sorted(str(key) for key in snapshot if key not in names)
    if missing or unknown:
        raise ValueError(
            f"{owner} callback state needs the keys {list(names)}; missing: {missing}, unknown: {unknown}"
        )
    return snapshot


def optional_float(value: Any) -> float | None:
    """A snapshot's number as a float (it may come back from storage as a 0-d array), None kept."""
    return None if value is None else float(value)


def optional_int(value: Any) -> int | None:
    """A snapshot's integer as an int (it may come back from storage as a 0-d array), None kept."""
    return None if value is None else int(value)


def present_keys(logs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The full paths of the entries in `logs`, for error messages."""
    return sorted(f"{c}.{n}" for c, entries in logs.items() for n in entries)
