"""`ciclo.metric_writer_logger`: writes through a clu `MetricWriter` the caller holds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, final

from ciclo._src.callbacks._loggers._base import Logger, Row
from ciclo._src.reprs import short


@final
class MetricWriterSink:
    """Writes rows with `writer.write_scalars(step, scalars)`; see `ciclo.metric_writer_logger`."""

    def __init__(self, writer: Any) -> None:
        if not all(callable(getattr(writer, name, None)) for name in ("write_scalars", "flush")):
            raise TypeError(
                f"metric_writer_logger needs a clu.metric_writers.MetricWriter "
                f"(write_scalars and flush), got {short(writer)}"
            )
        self.writer = writer

    def write(self, rows: Sequence[Row]) -> None:
        """One `write_scalars` call per row."""
        write_scalars = self.writer.write_scalars
        for row in rows:
            write_scalars(row.step, row.scalars)

    def flush(self) -> None:
        """Flushes the writer."""
        self.writer.flush()

    def close(self) -> None:
        """Flushes the writer; closing it is left to its owner, who may write more with it."""
        self.writer.flush()

    def state(self) -> dict[str, Any]:
        """Nothing besides the last step."""
        return {}

    def restore(self, state: Mapping[str, Any], after_step: int | None) -> None:
        """Nothing to restore."""

    def __repr__(self) -> str:
        return f"MetricWriterSink({self.writer!r})"


def metric_writer_logger(writer: Any) -> Logger:
    """A logger that writes every scalar entry through a clu `metric_writers.MetricWriter`.

    Any writer of `clu.metric_writers` works (`SummaryWriter`, `AsyncWriter`,
    `MultiWriter`, `LoggingWriter`, ...), as does any object with
    `write_scalars(step, scalars)` and `flush()`. ciclo imports no clu: you
    create the writer (and close it when you are done); the logger calls
    `write_scalars` once per logged step and `flush` when the loop ends.

    Args:
        writer: the metric writer.

    Returns:
        A `Logger` (see `Logger`).

    Raises:
        TypeError: if `writer` has no `write_scalars` or `flush` method.

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
    return Logger(MetricWriterSink(writer))
