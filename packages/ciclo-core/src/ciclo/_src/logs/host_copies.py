"""Copies of logged values to the host: started without waiting, read once the device is done."""

from __future__ import annotations

import functools
import operator
from typing import Any, final

import jax
import jax.numpy as jnp
import numpy as np

CHUNK = 128
"""Cells stacked per copy: copying one costs more than a microsecond, 128 stacked a third of that each."""

STACKED_SIZE = 64
"""The most elements of a cell's array that is stacked with its column's (a scalar, one value per member
of a population); a larger one is copied on its own."""

HOST_SCALARS = frozenset({float, int, bool})
"""Values that are stored as they are: nothing to copy or convert."""


@final
class Copy:
    """A device array on its way to the host: one cell's value (`first` None), or `cells`' from `first` on."""

    __slots__ = ("array", "cells", "first")

    def __init__(self, array: Any, cells: range, first: int | None) -> None:
        self.array = array
        self.cells = cells
        self.first = first
        array.copy_to_host_async()

    def ready(self) -> bool:
        return bool(self.array.is_ready())

    def fill(self, column: list[Any]) -> None:
        cells = self.cells
        if self.first is None:
            column[cells.start] = to_host(self.array)
        else:
            rows = np.asarray(self.array)[self.first : self.first + len(cells)]
            column[cells.start : cells.stop] = rows.tolist() if rows.ndim == 1 else list(rows)


@functools.cache
def _one_device() -> bool:
    """Whether JAX has one device; asked on first use, not at import (which would start the backend)."""
    return jax.device_count() == 1


@jax.jit
def _stack(*scalars: jax.Array) -> jax.Array:
    return jnp.stack(scalars)


def start_column(column: list[Any], kinds: set[type]) -> list[Copy]:
    """Starts copying `column`'s device values (small arrays of one shape and sharding `CHUNK` to a copy)."""
    if kinds <= HOST_SCALARS:
        return []
    if all(issubclass(kind, jax.Array) for kind in kinds) and _stackable(column):
        copies = []
        for begin in range(0, len(column), CHUNK):
            chunk = column[begin : begin + CHUNK]
            padded = chunk + [chunk[-1]] * (CHUNK - len(chunk))  # one shape: the stack compiles once
            copies.append(Copy(_stack(*padded), range(begin, begin + len(chunk)), 0))
        return copies
    copies = []
    for cell, value in enumerate(column):
        if isinstance(value, jax.Array):
            copies.append(Copy(value, range(cell, cell + 1), None))
        elif type(value) not in HOST_SCALARS:
            column[cell] = to_host(value)
    return copies


def _stackable(arrays: list[Any]) -> bool:
    avals = set(map(_aval, arrays))
    if len(avals) != 1 or avals.pop().size > STACKED_SIZE:
        return False
    return _one_device() or len(set(map(_sharding, arrays))) == 1


_aval, _sharding = operator.attrgetter("aval"), operator.attrgetter("sharding")


def to_host(value: Any) -> Any:
    """`value` as a Python number (a scalar) or a numpy array; waits for a device value to be computed."""
    # Scalars are the common case: `.item()` costs a fraction of `jax.device_get`.
    if isinstance(value, (jax.Array, np.ndarray)):
        return value.item() if value.ndim == 0 else np.asarray(value)
    if isinstance(value, np.generic):
        return value.item()
    return jax.device_get(value)
