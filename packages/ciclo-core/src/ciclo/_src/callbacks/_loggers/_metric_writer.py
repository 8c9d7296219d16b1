"""`ciclo.metric_writer_logger`: writes through a clu `MetricWriter` the caller holds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, final

from ciclo._src.base.reprs import short
from ciclo._src.callbacks._loggers._base import HParams, Logger, Row, Sink, checked_hparams


@final
class MetricWriterSink(Sink):
    """Writes rows with `writer.write_scalars(step, scalars)`; see `ciclo.metric_writer_logger`."""

    def __init__(self, writer: Any, hparams: HParams) -> None:
        needed = ("write_scalars", "flush", "write_hparams") if hparams else ("write_scalars", "flush")
        if not all(callable(getattr(writer, name, None)) for name in needed):
            raise TypeError(
                f"metric_writer_logger needs a clu.metric_writers.MetricWriter "
                f"({', '.join(needed)}), got {short(writer)}"
            )
        self.writer = writer
        self._hparams = hparams  # written with the first rows

    def write(self, rows: Sequence[Row]) -> None:
        if self._hparams:
            self.writer.write_hparams(self._hparams)
            self._hparams = {}
        write_scalars = self.writer.write_scalars
        for row in rows:
            write_scalars(row.step, row.scalars)

    def flush(self) -> None:
        self.writer.flush()

    close = flush  # closing the writer is left to its owner, who may write more with it

    def restore(self, state: Mapping[str, Any], after_step: int | None) -> None:
        if after_step is not None:
            self._hparams = {}

    def __repr__(self) -> str:
        return f"MetricWriterSink({self.writer!r})"


def metric_writer_logger(writer: Any, *, hparams: Mapping[str, Any] | None = None) -> Logger:
    """A logger that writes every scalar entry through a clu `metric_writers.MetricWriter`.

    Any object with `write_scalars(step, scalars)` and `flush()` works (and `write_hparams`,
    given `hparams`); you create and close it. See docs/logging.md, "clu metric writers".

    Example:
        >>> import ciclo
        >>> class PrintWriter:  # any clu MetricWriter works the same way
        ...     def write_scalars(self, step, scalars):
        ...         print(step, dict(scalars))
        ...     def flush(self):
        ...         pass
        >>> def train_step(state, batch):
        ...     return ciclo.logs().add_loss("loss", batch / 2), state
        >>> logger = ciclo.metric_writer_logger(PrintWriter())
        >>> _ = ciclo.loop(None, range(2), {ciclo.every(1): [train_step, logger]})
        0 {'loss': 0.0}
        1 {'loss': 0.5}
    """
    return Logger(MetricWriterSink(writer, checked_hparams(hparams)))
