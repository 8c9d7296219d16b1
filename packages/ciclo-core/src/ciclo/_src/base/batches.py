"""Batches: how many samples one holds, and `Stacked` groups of them."""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar, final

import jax
import numpy as np

from ciclo._src.base.checks import check_int

B = TypeVar("B")

BatchSizeFn = Callable[[Any], int]


@final
@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Stacked(Generic[B]):
    """`steps` consecutive batches on a new leading axis; made by `ciclo.stacked`, run by `ciclo.fuse`.

    Attributes:
        batches: the batches' pytree, each leaf with a leading axis of length `steps`.
        steps: how many batches are stacked (static under `jax.jit`).
        samples: how many samples they hold together (static).
    """

    batches: B
    steps: int = dataclasses.field(metadata={"static": True})
    samples: int = dataclasses.field(metadata={"static": True})


def stacked(
    dataset: Iterable[B],
    steps: int,
    *,
    batch_size_fn: Callable[[B], int] | None = None,
    align: int | None = None,
    start: int = 0,
    total: int | None = None,
) -> Iterator[Stacked[B]]:
    """Groups each `steps` consecutive batches of `dataset` into one `Stacked` batch.

    A shorter group (the last, or one cut at `align`) is yielded as it is (one more compile).

    Args:
        dataset: any iterable of batches with the same structure and shapes.
        steps: batches per group.
        batch_size_fn: the samples in one batch; by default its first array leaf's leading dimension.
        align: no group crosses a multiple of `align` steps (an epoch's length, say).
        start: the step count of the first batch (a resumed loop's), for `align`.
        total: read at most this many batches (the steps left before a loop's stop).

    Example:
        >>> import ciclo, numpy as np
        >>> groups = list(ciclo.stacked([np.ones((4, 2))] * 5, 2))
        >>> [(group.steps, group.samples, group.batches.shape) for group in groups]
        [(2, 8, (2, 4, 2)), (2, 8, (2, 4, 2)), (1, 4, (1, 4, 2))]
        >>> [group.steps for group in ciclo.stacked([np.ones(4)] * 20, 4, align=6, total=14)]
        [4, 2, 4, 2, 2]
    """
    bounds = (("steps", steps, 1), ("align", align, 1), ("start", start, 0), ("total", total, 0))
    for name, value, least in bounds:
        if value is not None:
            check_int(value, name, least)
    size = leading_dim if batch_size_fn is None else batch_size_fn
    for group in cut(dataset, lambda room: steps, align=align, start=start, total=total):
        yield stack(group, size)


def cut(
    dataset: Iterable[B], steps: Callable[[int], int], *, align: int | None, start: int, total: int | None
) -> Iterator[list[B]]:
    """Consecutive batches of `dataset` in lists of `steps(room)`, asked before each, as `stacked` cuts them.

    `room` is the most the list may hold: up to the next multiple of `align`, and within `total`.
    """
    iterator = iter(dataset)
    position, left = start, total
    while left is None or left > 0:
        room = sys.maxsize if left is None else left
        if align is not None:
            room = min(room, align - position % align)
        wanted = min(steps(room), room)
        group = list(itertools.islice(iterator, wanted))
        if not group:
            return
        yield group
        position += len(group)
        if left is not None:
            left -= len(group)
        if len(group) < wanted:
            return


def stack(group: list[B], size: Callable[[B], int]) -> Stacked[B]:
    leaves = jax.tree.leaves(group)
    if leaves and all(isinstance(leaf, jax.Array) for leaf in leaves):
        batches = _stack_on_device(group)
    else:
        batches = jax.tree.map(
            lambda *leaves: jax.numpy.stack(leaves) if isinstance(leaves[0], jax.Array) else np.stack(leaves),
            *group,
        )
    return Stacked(batches, steps=len(group), samples=sum(size(batch) for batch in group))


@jax.jit
def _stack_on_device(group: list[Any]) -> Any:
    # One compiled call for the whole group: eager jnp.stack costs ~15 µs per batch stacked.
    return jax.tree.map(lambda *leaves: jax.numpy.stack(leaves), *group)


def is_stacked(batch: Any) -> bool:
    return type(batch) is Stacked


# Array types seen as batch leaves: `type(x) in` is much cheaper than `isinstance(x, jax.Array)`.
_ARRAY_TYPES: set[type] = {np.ndarray}
_SEQUENCES = frozenset({tuple, list})
# Layouts whose dimension 0 is the devices and dimension 1 each device's rows (`pmap`'s lifted batches).
PER_DEVICE_ROWS: set[jax.sharding.Sharding] = set()


def _rows(leaf: Any, shape: tuple[int, ...]) -> int | None:
    """The rows of an array leaf of `shape` (not empty); None for a scalar repeated per device."""
    if PER_DEVICE_ROWS and isinstance(leaf, jax.Array) and leaf.sharding in PER_DEVICE_ROWS:
        return shape[0] * shape[1] if len(shape) > 1 else None
    return int(shape[0])


def leading_dim(batch: Any) -> int:
    """Default sample count of a batch: its first array leaf's leading dimension; 1 without one.

    Example:
        >>> import numpy as np
        >>> leading_dim({"x": np.zeros((32, 4)), "y": np.zeros(32)})
        32
    """
    # The usual `(inputs, targets)`: its first leaf is its first item when that is an array.
    first = batch[0] if type(batch) in _SEQUENCES and batch else batch
    if type(first) in _ARRAY_TYPES:
        shape = first.shape  # one property read: `ndim` is another on JAX arrays
        if shape and (rows := _rows(first, shape)) is not None:
            return rows
    for leaf in jax.tree.leaves(batch):
        shape = getattr(leaf, "shape", None)
        if shape:
            if not isinstance(leaf, (np.ndarray, jax.Array)):
                return int(shape[0])
            _ARRAY_TYPES.add(type(leaf))
            if (rows := _rows(leaf, shape)) is not None:
                return rows
    return 1


def steps_of(batch: Any) -> int:
    """How many steps `batch` counts for: a `Stacked` group's steps, else 1.

    Example:
        >>> import numpy as np
        >>> steps_of(np.zeros((8, 2))), steps_of(Stacked(np.zeros((3, 8, 2)), steps=3, samples=24))
        (1, 3)
    """
    return batch.steps if type(batch) is Stacked else 1


@final
@dataclasses.dataclass(frozen=True)
class GlobalRows:
    """The default sample count when the batches of `processes` processes make one global batch.

    A batch of this process's rows counts `processes` times its rows; one of global arrays (that
    `prefetch_to_device` made under a mesh) counts its rows.

    Example:
        >>> import numpy as np
        >>> GlobalRows(2)(np.zeros((8, 3))), GlobalRows(2)(Stacked(np.zeros((3, 8)), steps=3, samples=24))
        (16, 48)
    """

    processes: int

    def __call__(self, batch: Any) -> int:
        rows = batch.samples if type(batch) is Stacked else leading_dim(batch)
        first = next(iter(jax.tree.leaves(batch)), None)
        local = not isinstance(first, jax.Array) or first.is_fully_addressable
        return rows * self.processes if local else rows


def count(batch: Any, batch_size_fn: BatchSizeFn) -> tuple[int, int]:
    if type(batch) is Stacked:
        return batch.steps, batch_size_fn(batch) if type(batch_size_fn) is GlobalRows else batch.samples
    return 1, batch_size_fn(batch)
