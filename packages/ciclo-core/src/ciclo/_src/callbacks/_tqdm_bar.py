"""A progress bar callback drawn by tqdm (the optional `tqdm` extra)."""

from __future__ import annotations

import math
import typing
from typing import Any

from ciclo._src.base.elapsed import PeriodLike
from ciclo._src.callbacks._loggers._base import import_extra
from ciclo._src.callbacks._progress import ProgressCallback


@typing.final
class TqdmBar(ProgressCallback):
    """A progress bar drawn by `tqdm.auto.tqdm`, with the latest metrics as postfix; see `ciclo.tqdm_bar`."""

    def __init__(self, total: PeriodLike | None = None, *, interval: float = 0.1, **tqdm_kwargs: Any) -> None:
        tqdm = import_extra("tqdm.auto", "tqdm", "ciclo.tqdm_bar")
        super().__init__(total, interval)
        bar_total = self.unit.total
        if bar_total is not None and float(bar_total).is_integer():  # a whole time: shown as an int
            bar_total = int(bar_total)
        tqdm_kwargs.setdefault("unit", self.unit.label)
        self.tqdm: Any = tqdm.tqdm(total=bar_total, **tqdm_kwargs)
        """The underlying `tqdm.auto.tqdm` bar (to set its description, for instance)."""
        self._passed: float = 0  # the count tqdm was given so far

    def _draw(self, now: float, count: float, steps: float, *, final: bool) -> None:
        values = self._shown_values()
        if values:
            # Not refreshed here: tqdm redraws on `update`, at its own pace.
            self.tqdm.set_postfix(dict(values), refresh=False)
        if self.unit.field == "time":  # whole seconds: tqdm would print a float count with all its digits
            count = math.floor(count)
        if count > self._passed:
            self.tqdm.update(count - self._passed)
            self._passed = count

    def _release(self) -> None:
        super()._release()
        self.tqdm.close()


def tqdm_bar(total: PeriodLike | None = None, *, interval: float = 0.1, **tqdm_kwargs: Any) -> TqdmBar:
    """Creates a progress bar callback drawn by tqdm (`pip install "ciclo-core[tqdm]"`).

    It runs where `ciclo.keras_bar` does and shows the same entries; they and
    the count reach tqdm at most once per `interval` seconds.

    Args:
        total: where the bar is full, as for `ciclo.keras_bar`.
        interval: the least number of seconds between two updates of the tqdm bar.
        **tqdm_kwargs: passed to `tqdm.auto.tqdm` (`desc`, `file`, `leave`,
            `bar_format`, ...); `unit` defaults to the unit counted.

    Raises:
        ImportError: if tqdm is not installed.

    Example:
        >>> import io
        >>> import ciclo
        >>> buffer = io.StringIO()
        >>> bar = ciclo.tqdm_bar(total=10, file=buffer, bar_format="{n}/{total} {unit}{postfix}")
        >>> def train_step(state, batch):
        ...     return ciclo.logs().add_metric("accuracy", batch / 10), state
        >>> _ = ciclo.loop(None, range(10), {ciclo.every(1): [train_step, bar]}, stop=10)
        >>> print(buffer.getvalue().splitlines()[-1])
        10/10 step, accuracy=0.9000
    """
    return TqdmBar(total, interval=interval, **tqdm_kwargs)
