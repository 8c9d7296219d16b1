"""Shared by callbacks that watch a logged value (early stopping, best checkpoints)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from ciclo._src.base.reprs import short
from ciclo._src.logs.logs import Logs, LogsLike

Mode = Literal["min", "max"]
ModeLike = Literal["auto", "min", "max"]

_HIGHER_IS_BETTER = frozenset(
    {"acc", "accuracy", "auc", "precision", "recall", "f1", "fbeta", "iou", "miou", "map", "dice", "r2"}
)
# top1, top5, topk, and the "top" of top_k_accuracy
_TOP_K = re.compile(r"top\d*k?")


def resolve_mode(mode: str, monitor: str | None) -> Mode:
    """`mode`, checked; `"auto"`: `"max"` if a word of the entry's name is accuracy-like, else `"min"`."""
    if mode == "auto":
        words = re.split(r"[^a-z0-9]+", (monitor or "").rsplit(".", 1)[-1].lower())
        return "max" if any(w in _HIGHER_IS_BETTER or _TOP_K.fullmatch(w) for w in words) else "min"
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'auto', 'min' or 'max', got {short(mode)}")
    return mode  # type: ignore[return-value]


def monitored_value(logs: LogsLike, key: str) -> float | None:
    """The value of `key` in `logs` copied to the host as a float, or None if it is not there."""
    source = logs if isinstance(logs, Logs) else Logs(logs)
    path = source.entry_path(key)
    if path is None:
        return None
    array = np.asarray(source[path[0]][path[1]])
    if array.size != 1:
        raise ValueError(f"monitored entry {short(key)} must be a scalar, got shape {array.shape}")
    return float(array.reshape(()))


def snapshot_fields(snapshot: Any, names: tuple[str, ...], owner: str) -> Mapping[str, Any]:
    """`snapshot`, given to `owner`'s `load_state_dict`, checked to be a mapping with the keys `names`."""
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
    """A snapshot's number (maybe a 0-d array) as a float; text (a damaged backup) is refused."""
    if isinstance(value, (str, bytes)):
        raise ValueError(f"a callback state holds {short(value)} where a number belongs")
    return float(value)


def present_keys(logs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The full paths of the entries in `logs`, for error messages."""
    return sorted(f"{c}.{n}" for c, entries in logs.items() for n in entries)
