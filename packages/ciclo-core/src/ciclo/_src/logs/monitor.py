"""A monitored entry: its value in the logs, which way is better, and a population's members ranked by it."""

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


def monitored_value(logs: LogsLike, key: str, members: int | None = None, who: str | None = None) -> Any:
    """The value of `key` in `logs` on the host as a float; a population's: `members` floats.

    None if `key` is not in `logs`, or a KeyError naming `who` (the callback that monitors it).
    """
    source = logs if isinstance(logs, Logs) else Logs(logs)
    path = source.entry_path(key)
    if path is None:
        if who is not None:
            raise KeyError(
                f"{who} monitors {short(key)}, which is not in the logs; present: {present_keys(logs)}"
            )
        return None
    array = np.asarray(source[path[0]][path[1]], dtype=float)
    if members is not None and array.size in (1, members):  # one value for all, or one per member
        return np.broadcast_to(array.reshape(-1), (members,))
    if array.size != 1:
        per = "" if members is None else f" or one per member ({members},)"
        raise ValueError(f"monitored entry {short(key)} must be a scalar{per}, got shape {array.shape}")
    return float(array.reshape(()))


def ranked_members(values: np.ndarray, mode: Mode) -> list[int]:
    """The members' indices, best first by `values` (`mode` "min": lowest first); NaN last."""
    key = np.where(np.isnan(values), np.inf, values if mode == "min" else -values)
    return [int(i) for i in np.argsort(key, kind="stable")]


def present_keys(logs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The full paths of the entries in `logs`, for error messages."""
    return sorted(f"{c}.{n}" for c, entries in logs.items() for n in entries)
