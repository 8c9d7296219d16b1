"""Where a dataset is: iterating it, and iterators that can say where they are and go back there."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol, TypeGuard, TypeVar

from ciclo._src.base.reprs import short

T_co = TypeVar("T_co", covariant=True)


def iterate_dataset(dataset: Iterable[Any]) -> Iterator[Any]:
    """`iter(dataset)`, or a TypeError saying that a loop takes an iterable of batches."""
    try:
        return iter(dataset)
    except TypeError:
        raise TypeError(f"dataset must be an iterable of batches, got {short(dataset)}") from None


class StatefulIterator(Iterator[T_co], Protocol):
    """An iterator that can say where it is and go back there (grain's `DatasetIterator`)."""

    def get_state(self) -> Any:
        """Where the iterator is: plain data (JSON-like) for the backup document."""
        ...

    def set_state(self, state: Any, /) -> None:
        """Moves the iterator to a position `get_state` returned."""
        ...


def has_state(iterator: Any) -> TypeGuard[StatefulIterator[Any]]:
    """Whether the iterator has `get_state` and `set_state`: the one test backups and prefetch ask."""
    return callable(getattr(iterator, "get_state", None)) and callable(getattr(iterator, "set_state", None))


def iterator_state(iterator: Any) -> Any:
    """The iterator's own `get_state()` when it has `get_state` and `set_state`; None otherwise."""
    return iterator.get_state() if has_state(iterator) else None
