"""The dataset a loop draws from: iterating it, saying when it fails or ends, and where it is."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, TypeGuard, TypeVar

from ciclo._src.base.checks import DataWarning
from ciclo._src.base.reprs import short

T_co = TypeVar("T_co", covariant=True)


def iterate_dataset(dataset: Iterable[Any]) -> Iterator[Any]:
    try:
        return iter(dataset)
    except TypeError:
        raise TypeError(f"dataset must be an iterable of batches, got {short(dataset)}") from None


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
