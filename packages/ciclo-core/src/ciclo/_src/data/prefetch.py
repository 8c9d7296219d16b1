"""`prefetch_to_device`: batches put on devices ahead of the step (transfers are asynchronous: no thread)."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar, final

import jax

from ciclo._src.base.checks import check_int
from ciclo._src.base.reprs import short
from ciclo._src.data.position import StatefulIterator, has_state, iterate_dataset
from ciclo._src.strategies._placement import unplaceable
from ciclo._src.strategies._protocols import Strategy
from ciclo._src.strategies._registry import get_strategy

B = TypeVar("B")


def prefetch_to_device(
    dataset: Iterable[B], size: int = 2, strategy: str | Strategy | None = None
) -> Prefetched[B]:
    """The batches of `dataset`, each put on its devices `size` batches before the loop takes it.

    Each batch is placed by the strategy's `lift_batch` (else on the default device). When `dataset`'s
    iterator has `get_state()` and `set_state()`, so does the returned one, at the last batch *taken*.
    Errors are raised when the loop asks for that batch. See docs/data.md.

    Example:
        >>> import ciclo, jax, numpy as np
        >>> batches = ciclo.prefetch_to_device([np.ones(4), np.zeros(4)], size=1, strategy="jit")
        >>> [isinstance(batch, jax.Array) for batch in batches]
        [True, True]
    """
    check_int(size, "prefetch size", 1, " (the batches read ahead)")
    place = _on_device
    if strategy is not None:
        lift = get_strategy(strategy).lift_batch
        place = lambda batch: _on_device(lift(batch))  # noqa: E731
    source = iterate_dataset(dataset)
    if has_state(source):
        return StatefulPrefetched(source, size, place)
    return Prefetched(source, size, place)


def _placement_error(error: Exception, batch: Any, index: int) -> Exception:
    found = unplaceable(batch)
    if found is None:
        note = f"raised by prefetch_to_device placing batch {index} of the dataset (counted from 0)"
        error.add_note(note)
        return error
    path, kind, leaf = found
    refusal = TypeError(
        f"prefetch_to_device cannot put batch {index} of the dataset (counted from 0) on its devices: "
        f"its leaf {path} is a {kind} ({short(leaf)}), not a number or an array of numbers. Drop it "
        "from the batch or turn it into numbers before the loop (without prefetch, the step gets the "
        "batch as it is)"
    )
    refusal.__cause__ = error
    return refusal


def _on_device(batch: Any) -> Any:
    # A batch already all on devices is returned as it is: device_put would take ~15 µs to do nothing.
    if all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(batch)):
        return batch
    return jax.device_put(batch)


class Prefetched(Iterator[B]):
    """What `ciclo.prefetch_to_device` returns for a source without `get_state`.

    Example:
        >>> import ciclo
        >>> batches = ciclo.prefetch_to_device(iter(range(5)), size=2)
        >>> int(next(batches)), hasattr(batches, "get_state")
        (0, False)
    """

    __slots__ = ("_buffer", "_error", "_exhausted", "_place", "_read", "_size", "_source", "_state")

    def __init__(self, source: Iterator[B], size: int, place: Callable[[Any], Any]) -> None:
        self._source = source
        self._size = size
        self._place = place
        self._buffer: collections.deque[tuple[B, Any]] = collections.deque()
        self._exhausted = False
        self._read = 0
        self._error: Exception | None = None
        self._state: Any = None  # the source's position after the last batch taken

    def __next__(self) -> B:
        while not self._exhausted and len(self._buffer) <= self._size:
            try:
                batch = next(self._source)
            except StopIteration:
                self._exhausted = True
                break
            except Exception as error:
                self._error, self._exhausted = error, True
                break
            try:
                placed = self._place(batch)
            except Exception as error:
                self._error, self._exhausted = _placement_error(error, batch, self._read), True
                break
            self._read += 1
            self._buffer.append((placed, self._position()))
        if not self._buffer:
            failed, self._error = self._error, None
            if failed is not None:
                raise failed
            raise StopIteration
        batch, self._state = self._buffer.popleft()
        return batch

    def close(self) -> None:
        """Drops the batches read ahead."""
        self._buffer.clear()
        self._error = None

    def _position(self) -> Any:
        return None


@final
class StatefulPrefetched(Prefetched[B]):
    """`Prefetched` over an iterator with `get_state()` / `set_state()`, which it has too.

    Example:
        >>> import ciclo, grain
        >>> batches = ciclo.prefetch_to_device(iter(grain.MapDataset.range(10).to_iter_dataset()), size=3)
        >>> int(next(batches)), batches.get_state()
        (0, {'next_index': 1})
    """

    __slots__ = ()

    _source: StatefulIterator[B]

    def __init__(self, source: StatefulIterator[B], size: int, place: Callable[[Any], Any]) -> None:
        super().__init__(source, size, place)
        self._state = source.get_state()

    def get_state(self) -> Any:
        """The source's state after the last batch taken."""
        return self._state

    def set_state(self, state: Any, /) -> None:
        """Moves the source to `state` and drops the batches read ahead."""
        self._source.set_state(state)
        self._buffer.clear()
        self._exhausted = False
        self._error = None
        self._state = state

    def close(self) -> None:
        """Moves the source back to the last batch taken: its next batch is the loop's next one."""
        if self._buffer or self._error is not None:
            self.set_state(self._state)

    def _position(self) -> Any:
        return self._source.get_state()
