"""Shared by the callbacks that watch a logged value: a population's members, callback snapshots."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast, final

import jax
import jax.numpy as jnp
import numpy as np

from ciclo._src.base.reprs import short
from ciclo._src.engine.callback import Callback
from ciclo._src.engine.loop_state import LoopState
from ciclo._src.state.population import Population

P = TypeVar("P")


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
