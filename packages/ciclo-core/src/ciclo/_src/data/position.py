"""The dataset a loop draws from: iterating it, saying when it fails or ends, and where it is."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, TypeGuard, TypeVar

import jax
import numpy as np

from ciclo._src.base.checks import DataWarning
from ciclo._src.base.reprs import short

T_co = TypeVar("T_co", covariant=True)


def iterate_dataset(dataset: Iterable[Any]) -> Iterator[Any]:
    """`iter(dataset)`, refusing what is no iterable of batches: the whole arrays (or one batch) as one."""
    arrays = _whole_arrays(dataset)
    if arrays is not None:
        shapes = ", ".join(f"{leaf.dtype}{list(leaf.shape)}" for leaf in arrays)
        raise TypeError(
            f"the dataset is a {type(dataset).__name__} of {len(arrays)} arrays with one leading size "
            f"({shapes}), which the loop would take as its batches, one "
            f"{'key' if type(dataset) is dict else 'array'} each: the whole data, or one batch, given as "
            "the dataset. Wrap the arrays as batches, e.g. ciclo.batches((X, Y), batch_size=32), or use a "
            "grain loader; give one batch as [batch]"
        )
    try:
        return iter(dataset)
    except TypeError:
        raise TypeError(f"dataset must be an iterable of batches, got {short(dataset)}") from None


def _whole_arrays(dataset: Any) -> list[Any] | None:
    """The arrays of a tuple, list or dict of arrays with one leading size, unless they can be batches.

    The batches of a dataset share their number of dims and dtype; `(X, Y)` seldom does, and a dict
    is iterated by its keys.
    """
    kind = type(dataset)
    if kind is not tuple and kind is not list and kind is not dict:
        return None
    arrays = list(dataset.values()) if kind is dict else dataset
    if not arrays or not all(isinstance(leaf, (np.ndarray, jax.Array)) and leaf.ndim for leaf in arrays):
        return None
    if len({leaf.shape[0] for leaf in arrays}) > 1:
        return None
    if kind is not dict and len({(leaf.ndim, leaf.dtype) for leaf in arrays}) == 1:
        return None
    return list(arrays)


def dataset_raised(error: BaseException, steps: int, first: int) -> None:
    error.add_note(
        f"raised by the dataset when the loop asked for the batch of step {steps} "
        f"({steps - first} steps ran before it in this run); the loop stopped there"
    )


def dataset_ended(steps: int, first: int, stop: Any) -> None:
    if steps == first:
        warnings.warn(
            "the dataset yielded no batch, so the loop ran no step; check the dataset (an iterator or "
            "generator already used by an earlier loop is empty: create a fresh one for each loop)",
            DataWarning,
            stacklevel=5,
        )
    elif stop is not None:
        warnings.warn(
            f"the dataset ended after {steps} steps, before stop={short(stop)}: the loop stopped there; "
            "pass a longer or repeating dataset (one that repeats for several epochs), or a smaller stop",
            DataWarning,
            stacklevel=5,
        )


class StatefulIterator(Iterator[T_co], Protocol):
    """An iterator that can say where it is and go back there (grain's `DatasetIterator`)."""

    def get_state(self) -> Any:
        """Where the iterator is: plain data (JSON-like) for the backup document."""

    def set_state(self, state: Any, /) -> None:
        """Moves the iterator to a position `get_state` returned."""


def has_state(iterator: Any) -> TypeGuard[StatefulIterator[Any]]:
    return callable(getattr(iterator, "get_state", None)) and callable(getattr(iterator, "set_state", None))


def iterator_state(iterator: Any) -> Any:
    return iterator.get_state() if has_state(iterator) else None
