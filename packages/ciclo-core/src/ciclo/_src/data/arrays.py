"""`ciclo.batches`: arrays held in memory (a pytree of them) cut into batches, at a position backups save."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, final

import jax
import numpy as np

from ciclo._src.base.checks import check_bool, check_int
from ciclo._src.base.reprs import short


@final
class Batches(Iterator[Any]):
    """The iterator `ciclo.batches` returns; `get_state()` / `set_state()` say and set where it is."""

    def __init__(
        self, arrays: Any, batch_size: int, shuffle: bool, seed: int, drop_remainder: bool, epochs: int | None
    ) -> None:
        check_int(batch_size, "batch_size", 1)
        check_bool(shuffle, "shuffle")
        check_int(seed, "seed")
        check_bool(drop_remainder, "drop_remainder")
        if epochs is not None:
            check_int(epochs, "epochs", 1, " or None (endless)")
        self._arrays = jax.tree.map(np.asarray, arrays)
        sizes = {np.shape(leaf)[:1] for leaf in jax.tree.leaves(self._arrays)}
        if len(sizes) != 1 or () in sizes:
            raise ValueError(
                f"ciclo.batches takes arrays whose first dimension counts the samples, the same in each, "
                f"e.g. (X, Y) of shapes (N, ...) and (N,); got {short(arrays)}"
            )
        self._samples = sizes.pop()[0]
        self._size, self._shuffle, self._seed, self._epochs = batch_size, shuffle, seed, epochs
        self.steps_per_epoch = (
            self._samples // batch_size if drop_remainder else -(-self._samples // batch_size)
        )
        """The batches of one epoch (for `train_loop`'s `epoch_duration`)."""
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"batch_size={batch_size} with drop_remainder=True leaves no batch of the "
                f"{self._samples} samples; pass a smaller batch_size, or drop_remainder=False"
            )
        self._epoch, self._batch = 0, 0  # the position: the next batch's epoch and index in it
        self._order: tuple[int, Any] = (-1, None)  # (epoch, its permutation of the samples)

    def __next__(self) -> Any:
        if self._batch == self.steps_per_epoch:
            self._epoch, self._batch = self._epoch + 1, 0
        if self._epochs is not None and self._epoch >= self._epochs:
            raise StopIteration
        start = self._batch * self._size
        rows: Any = slice(start, start + self._size)
        if self._shuffle:
            if self._order[0] != self._epoch:  # each epoch its own order, from the seed and the epoch alone
                order = np.random.default_rng([self._seed, self._epoch]).permutation(self._samples)
                self._order = (self._epoch, order)
            rows = self._order[1][rows]
        self._batch += 1
        return jax.tree.map(lambda leaf: leaf[rows], self._arrays)

    def get_state(self) -> dict[str, int]:
        """Where the iterator is: `{"epoch": ..., "batch": ...}` (the next batch's, counted from 0)."""
        return {"epoch": self._epoch, "batch": self._batch}

    def set_state(self, state: Any, /) -> None:
        """Moves the iterator to a position `get_state` returned."""
        self._epoch, self._batch = int(state["epoch"]), int(state["batch"])


def batches(
    arrays: Any,
    batch_size: int,
    *,
    shuffle: bool = False,
    seed: int = 0,
    drop_remainder: bool = False,
    epochs: int | None = 1,
) -> Batches:
    """Cuts arrays held in memory into batches: a pytree of arrays with one leading size (the samples).

    Each batch has the structure of `arrays`, with `batch_size` rows of each (numpy
    slices). The iterator has `get_state()` and `set_state()`, so a `ciclo.backup`
    resumes it at the batch after the last step, mid-epoch too, with the same order.

    Args:
        arrays: the whole data, e.g. `(X, Y)` or `{"image": X, "label": Y}`.
        batch_size: rows per batch.
        shuffle: visit the rows in a new order each epoch, from `seed` and the epoch.
        seed: the seed of the shuffling.
        drop_remainder: leave out each epoch's last batch when it is smaller.
        epochs: how many passes over the rows; None: endless.

    Example:
        >>> import ciclo, numpy as np
        >>> X, Y = np.arange(10.0).reshape(5, 2), np.arange(5)
        >>> [y.tolist() for x, y in ciclo.batches((X, Y), batch_size=2)]
        [[0, 1], [2, 3], [4]]
        >>> data = ciclo.batches((X, Y), 2, shuffle=True, drop_remainder=True, epochs=None)
        >>> data.steps_per_epoch, next(data)[1].shape, data.get_state()
        (2, (2,), {'epoch': 0, 'batch': 1})
    """
    return Batches(arrays, batch_size, shuffle, seed, drop_remainder, epochs)
