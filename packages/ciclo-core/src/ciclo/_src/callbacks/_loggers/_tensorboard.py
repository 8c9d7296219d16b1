"""`ciclo.tensorboard`: TensorBoard event files, written with tensorboardX (no TensorFlow)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, final

from ciclo._src.callbacks._loggers._base import HParams, Logger, Row, checked_hparams, import_extra
from ciclo._src.reprs import short


@final
class TensorBoardSink:
    """Writes rows as TensorBoard scalar events to a new event file in `logdir`; see `ciclo.tensorboard`."""

    def __init__(self, logdir: str | os.PathLike[str], hparams: HParams | None = None) -> None:
        if not isinstance(logdir, (str, os.PathLike)):
            raise TypeError(f"logdir must be a path, got {short(logdir)}")
        self._hparams = dict(hparams or {})  # written to the first event file, then emptied
        # Imported when a logger is created: tensorboardX is an optional extra (with no type information).
        self._files = import_extra("tensorboardX.event_file_writer", "tensorboard", "ciclo.tensorboard")
        self._events = import_extra("tensorboardX.proto.event_pb2", "tensorboard", "ciclo.tensorboard")
        self._summaries = import_extra("tensorboardX.proto.summary_pb2", "tensorboard", "ciclo.tensorboard")
        self.logdir = os.fspath(logdir)
        self._writer: Any = None
        self._resume_step: int | None = None  # a resumed run's first step: marked in its new file

    def _open(self) -> Any:
        os.makedirs(self.logdir, exist_ok=True)
        # tensorboardX names files by the second: a writer opened again within one second (a
        # resumed run) would overwrite the first file. The nanosecond suffix keeps each file,
        # in the order TensorBoard reads them.
        prefix = os.path.join(self.logdir, "events")
        writer = self._files.EventsWriter(prefix, filename_suffix=f".{time.time_ns()}")
        if self._resume_step is not None:
            # TensorBoard's reader drops the events of earlier files at this step and after: those a
            # killed run wrote after its backup, which the resumed run writes again.
            start = self._events.SessionLog(status=self._events.SessionLog.START)
            writer.write_event(
                self._events.Event(wall_time=time.time(), step=self._resume_step, session_log=start)
            )
            self._resume_step = None
        if self._hparams:
            # The hparams plugin's experiment and session summaries, as tensorboardX's add_hparams
            # writes them, but in this run's own directory: the run is the session.
            summary = import_extra("tensorboardX.summary", "tensorboard", "ciclo.tensorboard")
            experiment, session_start, _ = summary.hparams(self._hparams, {})
            for part in (experiment, session_start):
                writer.write_event(self._events.Event(wall_time=time.time(), step=0, summary=part))
            self._hparams = {}
        return writer

    def write(self, rows: Sequence[Row]) -> None:
        """Writes one event per row, holding all its scalars (TensorBoard stores them as float32)."""
        event, summary = self._events.Event, self._summaries.Summary
        writer = self._writer
        if writer is None:
            writer = self._writer = self._open()
        # The synchronous writer: tensorboardX's default one pickles each event through a
        # multiprocessing queue, which costs the loop more than writing the file itself.
        value = summary.Value
        for row in rows:
            values = [value(tag=tag, simple_value=x) for tag, x in row.scalars.items()]
            writer.write_event(event(wall_time=row.wall_time, step=row.step, summary=summary(value=values)))

    def flush(self) -> None:
        """Flushes the event file."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Closes the event file; a later write starts a new one in the same `logdir`."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def state(self) -> dict[str, Any]:
        """Nothing besides the last step: a resumed logger writes a new file in the same `logdir`."""
        return {}

    def restore(self, state: Mapping[str, Any], after_step: int | None) -> None:
        """Marks the new event file with a `SessionLog.START` at the step after `after_step`.

        TensorBoard then drops the events of earlier files from that step on (what
        a killed run wrote after its backup), so each step is read once.
        """
        self._resume_step = 0 if after_step is None else after_step + 1
        if after_step is not None:  # rows were written: the first event file holds the hparams
            self._hparams = {}

    def __repr__(self) -> str:
        return f"TensorBoardSink({self.logdir!r})"


def tensorboard(logdir: str | os.PathLike[str], *, hparams: Mapping[str, Any] | None = None) -> Logger:
    """A logger that writes every scalar entry to TensorBoard event files in `logdir`.

    No TensorFlow needed: the files are written with tensorboardX (the
    `tensorboard` extra: `pip install "ciclo-core[tensorboard]"`). Each logged
    step is one event holding its scalar entries (`loss`, `accuracy`,
    `loss_test`, ...) at the History's step. Each time the logger opens (a loop,
    a resumed run) it starts a new event file in `logdir`; TensorBoard reads
    them all. A resumed run's file starts with a `SessionLog.START` at its first
    step, so TensorBoard drops what the killed run wrote from there on.
    View with `tensorboard --logdir <logdir>`. `hparams` go to the first event
    file as the TensorBoard hparams plugin's experiment and session start, so
    the HPARAMS tab lists the run with them.

    Args:
        logdir: the directory of the event files (created if missing).
        hparams: the run's hyperparameters (name -> number, string or bool).

    Returns:
        A `Logger`: put it in a loop's tasks (`ciclo.every(1)`, after the step),
        in `train_loop(callbacks=[...])`, or call `write(step, logs)` and
        `close()` in a loop of your own. See `Logger`.

    Raises:
        ImportError: if tensorboardX is not installed.
        TypeError: if `hparams` holds something else than numbers, strings, bools.

    Example:
        >>> import tempfile
        >>> import ciclo
        >>> def train_step(state, batch):
        ...     return ciclo.logs().add_loss("loss", 1.0 / (batch + 1)), state
        >>> logdir = tempfile.mkdtemp()
        >>> logger = ciclo.tensorboard(logdir)
        >>> _ = ciclo.loop(None, range(3), {ciclo.every(1): [train_step, logger]})
        >>> logger.state_dict()
        {'step': 2}
    """
    return Logger(TensorBoardSink(logdir, checked_hparams(hparams)))
