"""Shared by callbacks that watch a logged value (early stopping, best checkpoints)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, cast, final

import jax
import jax.numpy as jnp
import numpy as np

from ciclo._src.base.reprs import short
from ciclo._src.engine.callback import Callback
from ciclo._src.engine.loop_state import LoopState
from ciclo._src.logs.logs import Logs, LogsLike
from ciclo._src.state.population import Population

P = TypeVar("P")
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


def population_size(state: Any) -> int | None:
    """The number of members of a population state, or None for one model's state."""
    return state.size if isinstance(state, Population) else None


@final
class MemberHistory(Callback):
    """Tells the loop's History a population's size: its entries of shape `(members,)` are per member."""

    def on_start(self, loop_state: LoopState[Any], /) -> None:
        members = population_size(loop_state.state)
        if members is not None:
            loop_state.history.members = members


def stop_members(population: Population, stop: Any) -> Population:
    """`population` with the members where `stop` (bools, one per member) is True frozen (inactive)."""
    active = population.active  # the mask placed as the flags are: the step's input keeps its sharding
    return population.replace(active=active & jax.device_put(~np.asarray(stop, dtype=bool), active.sharding))


def select_members(which: Any, new: P, old: P) -> P:
    """`new`'s members where `which` (bools, one per member) is True, `old`'s elsewhere."""
    mask = jnp.asarray(which, dtype=bool)
    return cast(
        "P", jax.tree.map(lambda a, b: jnp.where(mask.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), new, old)
    )


def ranked_members(values: np.ndarray, mode: Mode) -> list[int]:
    """The members' indices, best first by `values` (`mode` "min": lowest first); NaN last."""
    key = np.where(np.isnan(values), np.inf, values if mode == "min" else -values)
    return [int(i) for i in np.argsort(key, kind="stable")]


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
