"""Copies of logged device values to the host that are started at once and read once done.

The history's rows hold the device arrays a step logged. Once rows are a few
hundred steps old, `start` dispatches their copies: columns of same-kind
scalars are stacked on the device (one array for up to `CHUNK` rows) and every
copy is started with `copy_to_host_async`, so nothing waits. A `Copy` is read
(`values`) once `ready`: the history reads a window of copies one window
later, and only when it is done, so it never waits on the device.
"""

from __future__ import annotations

import functools
import operator
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, final

import jax
import jax.numpy as jnp
import numpy as np

CHUNK = 128
"""Scalars stacked per copy: copying one costs more than a microsecond, 128 stacked a third of that each."""

HOST_SCALARS = frozenset({float, int, bool})

Target = tuple[int, int, int]
"""Where a copied value goes: `(row, column, index)`; `index` picks a fused step's value in its group."""


@final
class Step:
    """One step's value of an entry logged with a leading axis over the steps of a fused group."""

    __slots__ = ("array", "index")

    def __init__(self, array: Any, index: int) -> None:
        self.array = array
        self.index = index

    def value(self) -> Any:
        return self.array[self.index]


@final
class Copy:
    """A device array on its way to the host, and the row cells its values go to.

    `kind` says how the array maps to `targets`: `"scalars"`, a stacked column
    (value `i` to target `i`); `"steps"`, a fused group's array (each target's
    `index` picks its value); `"value"`, one array for one target.
    """

    __slots__ = ("array", "kind", "targets")

    def __init__(self, array: Any, kind: str, targets: list[Target]) -> None:
        self.array = array
        self.kind = kind
        self.targets = targets
        array.copy_to_host_async()

    def ready(self) -> bool:
        """Whether the device computed the array: reading it then waits at most for the copy itself."""
        return bool(self.array.is_ready())

    def values(self) -> list[Any]:
        """The targets' host values: Python numbers for scalars, numpy arrays otherwise."""
        if self.kind == "scalars":
            return np.asarray(self.array).tolist()[: len(self.targets)]  # type: ignore[no-any-return]
        if self.kind == "value":
            return [to_host(self.array)]
        array = np.asarray(self.array)
        return [_item(array[index]) for _, _, index in self.targets]


@functools.cache
def array_type() -> type[Any]:
    """The concrete type of JAX arrays: `type(x) is` is much cheaper than `isinstance(x, jax.Array)`.

    Found on first use, not at import: creating an array starts the XLA backend, after
    which `jax.distributed.initialize` and device-count settings can no longer run.
    """
    return type(jnp.zeros(()))


@jax.jit
def _stack(*scalars: jax.Array) -> jax.Array:
    return jnp.stack(scalars)


def start(
    rows: Sequence[tuple[Any, ...]], paths: Sequence[tuple[tuple[str, str], ...]], first_row: int
) -> tuple[list[Copy], dict[Target, Any]]:
    """Starts copying the device values of `rows` (numbered from `first_row`); returns the copies.

    Rows with the same entries (the same `paths`) hold the same kind of value in
    each column, so a column of device scalars is stacked into a few arrays.
    Values already on the host that still need converting (numpy scalars and
    arrays, other objects) come back converted in the second result, by target.
    """
    if paths.count(paths[0]) == len(paths):  # the usual case: every row logs the same entries
        groups: list[Sequence[int]] = [range(len(rows))]
    else:
        by_paths: defaultdict[tuple[tuple[str, str], ...], list[int]] = defaultdict(list)
        for index, row_paths in enumerate(paths):
            by_paths[row_paths].append(index)
        groups = list(by_paths.values())
    copies: list[Copy] = []
    converted: dict[Target, Any] = {}
    array = array_type()
    for indices in groups:
        group_rows = list(map(rows.__getitem__, indices))
        for column in range(len(group_rows[0])):
            values = list(map(operator.itemgetter(column), group_rows))
            kinds = set(map(type, values))
            if kinds <= HOST_SCALARS:
                continue  # Python numbers logged as they are: nothing to copy
            targets = [(first_row + i, column, 0) for i in indices]
            if kinds == {Step}:
                copies.extend(_steps(values, targets))
                continue
            column_copies = start_column(values, targets) if kinds == {array} else None
            if column_copies is not None:
                copies.extend(column_copies)
                continue
            for value, target in zip(values, targets, strict=True):
                if isinstance(value, jax.Array):
                    copies.append(Copy(value, "value", [target]))
                elif type(value) is Step:
                    copies.append(Copy(value.array, "steps", [(target[0], target[1], value.index)]))
                elif type(value) not in HOST_SCALARS:
                    converted[target] = to_host(value)
    return copies, converted


def stacks(values: list[Any]) -> bool:
    """Whether `values` are JAX scalars, as a column `start_column` stacks (if they share a device)."""
    first: Any = values[0]
    kind = array_type()
    return type(first) is kind and first.ndim == 0 and set(map(type, values)) == {kind}


def start_column(values: list[Any], targets: list[Target] | None = None) -> list[Copy] | None:
    """Starts copying a column of device scalars (a value a row), stacked `CHUNK` per copy.

    `targets` are the values' cells (default: rows 0, 1, ... of column 0).
    Returns None, having started nothing, when the values are not all JAX
    scalars that stack (one shape, device and sharding): such a column is
    copied value by value.
    """
    if not stacks(values):
        return None
    if targets is None:
        targets = [(row, 0, 0) for row in range(len(values))]
    try:
        return _scalars(values, targets)
    except (TypeError, ValueError):
        return None  # shapes, devices or shardings differ along the column


def _scalars(values: list[Any], targets: list[Target]) -> list[Copy]:
    """Same-dtype, same-sharding scalars, stacked `CHUNK` per copy (padded: the stack compiles once)."""
    copies = []
    for begin in range(0, len(values), CHUNK):
        chunk = values[begin : begin + CHUNK]
        padded = chunk + [chunk[-1]] * (CHUNK - len(chunk))
        copies.append(Copy(_stack(*padded), "scalars", targets[begin : begin + CHUNK]))
    return copies


def _steps(values: list[Step], targets: list[Target]) -> list[Copy]:
    """Each fused group's array is copied once, then sliced."""
    groups: dict[int, Copy] = {}
    for value, (row, column, _) in zip(values, targets, strict=True):
        copy = groups.get(id(value.array))
        if copy is None:
            copy = groups[id(value.array)] = Copy(value.array, "steps", [])
        copy.targets.append((row, column, value.index))
    return list(groups.values())


def _item(value: Any) -> Any:
    return value.item() if np.ndim(value) == 0 else value


def to_host(value: Any) -> Any:
    """`value` as a Python number (a scalar) or a numpy array; waits for a device value to be computed."""
    if type(value) is Step:
        return _item(np.asarray(value.array)[value.index])
    # Scalars are the common case: `.item()` costs a fraction of `jax.device_get`.
    if isinstance(value, (jax.Array, np.ndarray)):
        return value.item() if value.ndim == 0 else np.asarray(value)
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, complex, str)):
        return value
    return jax.device_get(value)
