"""Shared by callbacks that watch a logged value (early stopping, best checkpoints)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from ciclo._src.base.reprs import short
from ciclo._src.logs.logs import Logs, LogsLike

Mode = Literal["min", "max"]
"""Whether lower (`"min"`) or higher (`"max"`) values of a monitored entry are better."""

ModeLike = Literal["auto", "min", "max"]
"""A `Mode`, or `"auto"`: decided from the monitored entry's name by `auto_mode`."""

_HIGHER_IS_BETTER = frozenset(
    {"acc", "accuracy", "auc", "precision", "recall", "f1", "fbeta", "iou", "miou", "map", "dice", "r2"}
)
# top1, top5, topk, and the "top" of top_k_accuracy
_TOP_K = re.compile(r"top\d*k?")


def auto_mode(monitor: str) -> Mode:
    """The mode `"auto"` stands for: `"max"` for accuracy-like names, `"min"` otherwise.

    The entry's name (the part after the last `.`) is split into words at every
    character that is not a letter or digit (`val_top_5_accuracy` gives `val`,
    `top`, `5`, `accuracy`). The mode is `"max"` if a word is one of `acc`,
    `accuracy`, `auc`, `precision`, `recall`, `f1`, `fbeta`, `iou`, `miou`,
    `map`, `dice`, `r2`, or `top`, `top5`, `topk` and the like; otherwise
    `"min"` (`loss`, `error`, `mae`, `perplexity`, ...). Case is ignored.

    Example:
        >>> from ciclo._src.callbacks._monitor import auto_mode
        >>> [auto_mode(name) for name in ["loss_test", "metrics.accuracy_test", "val_top5", "mean_iou"]]
        ['min', 'max', 'max', 'max']
    """
    words = re.split(r"[^a-z0-9]+", monitor.rsplit(".", 1)[-1].lower())
    if any(word in _HIGHER_IS_BETTER or _TOP_K.fullmatch(word) for word in words):
        return "max"
    return "min"


def check_mode(mode: str) -> Mode:
    """Validates `mode`, naming the valid values if it is wrong."""
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {short(mode)}")
    return mode  # type: ignore[return-value]


def resolve_mode(mode: str, monitor: str | None) -> Mode:
    """Validates `mode` (`"auto"`, `"min"` or `"max"`) and resolves `"auto"` with `auto_mode(monitor)`."""
    if mode == "auto":
        return "min" if monitor is None else auto_mode(monitor)
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'auto', 'min' or 'max', got {short(mode)}")
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
        raise ValueError(f"monitored entry {short(key)} must be a scalar, got shape {array.shape}")
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
    """Checks that a snapshot given to `load_state_dict` has exactly the keys `names`.

    Args:
        snapshot: what `load_state_dict` received.
        names: the keys `state_dict()` writes.
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
            f"{owner}.load_state_dict takes the dict that state_dict() returned, got {short(snapshot)}"
        )
    missing = [name for name in names if name not in snapshot]
    unknown = sorted(str(key) for key in snapshot if key not in names)
    if missing or unknown:
        raise ValueError(
            f"{owner} callback state needs the keys {list(names)}; missing: {short(missing)}, "
            f"unknown: {short(unknown)}"
        )
    return snapshot


def snapshot_float(value: Any) -> float:
    """A snapshot's number as a float (it may come back from storage as a 0-d array).

    Raises:
        ValueError: for text (a damaged or crafted backup), shown bounded: `float`'s own error
            would quote it whole.
    """
    if isinstance(value, (str, bytes)):
        raise ValueError(f"a callback state holds {short(value)} where a number belongs")
    return float(value)


def optional_int(value: Any) -> int | None:
    """A snapshot's integer as an int (it may come back from storage as a 0-d array), None kept."""
    return None if value is None else int(value)


def present_keys(logs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The full paths of the entries in `logs`, for error messages."""
    return sorted(f"{c}.{n}" for c, entries in logs.items() for n in entries)
