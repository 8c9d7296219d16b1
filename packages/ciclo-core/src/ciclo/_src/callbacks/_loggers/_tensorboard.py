"""`ciclo.tensorboard`: TensorBoard event files, written with tensorboardX (no TensorFlow)."""

from __future__ import annotations

import functools
import math
import os
import socket
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, final

from ciclo._src.base.checks import check_path
from ciclo._src.base.files import open_own
from ciclo._src.callbacks._loggers._base import HParams, Logger, Row, Sink, checked_hparams, import_extra

_DOUBLE = struct.Struct("<d").pack
_FLOAT = struct.Struct("<f").pack
_LENGTH = struct.Struct("<Q").pack
_CRC = struct.Struct("<I").pack
_INT64 = (1 << 64) - 1


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@functools.lru_cache(maxsize=4096)
def _value_head(tag: str) -> bytes:
    """A `Summary.value` entry's bytes up to its float: field 1 (a Value: tag = 1, simple_value = 2)."""
    name = tag.encode("utf-8")
    value = b"\x0a" + _varint(len(name)) + name + b"\x15"
    return b"\x0a" + _varint(len(value) + 4) + value


def _float32(value: float | int) -> bytes:
    try:
        return _FLOAT(value)
    except OverflowError:  # beyond float32: stored as infinity, as protobuf stores it
        return _FLOAT(math.copysign(math.inf, value))


def scalar_event(wall_time: float, step: int, scalars: Mapping[str, float | int]) -> bytes:
    """A serialized TensorBoard `Event` at `step` whose summary holds `scalars`, with no message objects."""
    summary = b"".join([_value_head(tag) + _float32(value) for tag, value in scalars.items()])
    # An int64 step: a negative one is its 64-bit two's complement, as protobuf writes it.
    head = b"\x09" + _DOUBLE(wall_time) + b"\x10" + _varint(step & _INT64)
    return b"".join((head, b"\x2a", _varint(len(summary)), summary))


@final
class _EventFile:
    """An event file: TFRecords of events (length, its masked CRC-32C, the event, its masked CRC-32C)."""

    def __init__(self, path: str, crc32c: Callable[[bytes], int]) -> None:
        self._file = open_own(path, "ab")  # closed by `close`; never written through a link
        self._crc32c = crc32c
        self._headers: dict[int, bytes] = {}  # a record's length and checksum, once per length

    def _masked(self, data: bytes) -> bytes:
        # tensorboardX's `masked_crc32c` written out around the C `crc32c`: one Python call, not three.
        crc = self._crc32c(data) & 0xFFFFFFFF
        return _CRC((((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)

    def write(self, event: bytes) -> None:
        size = len(event)
        header = self._headers.get(size)
        if header is None:
            length = _LENGTH(size)
            header = self._headers[size] = length + self._masked(length)
        self._file.write(b"".join((header, event, self._masked(event))))

    def flush(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self.flush()
        self._file.close()


@final
class TensorBoardSink(Sink):
    """Writes rows as TensorBoard scalar events to a new event file in `logdir`; see `ciclo.tensorboard`."""

    def __init__(self, logdir: str | os.PathLike[str], hparams: HParams) -> None:
        self.logdir = check_path(logdir, "logdir")
        self._hparams = hparams  # written to the first event file, then emptied
        # Imported when a logger is created: tensorboardX is an optional extra (with no type information).
        self._crc32c = import_extra("tensorboardX.crc32c", "tensorboard", "ciclo.tensorboard").crc32c
        self._events = import_extra("tensorboardX.proto.event_pb2", "tensorboard", "ciclo.tensorboard")
        self._writer: Any = None
        self._resume_step: int | None = None  # a resumed run's first step: marked in its new file

    def _open(self) -> Any:
        os.makedirs(self.logdir, exist_ok=True)
        # Named as tensorboardX names them, plus nanoseconds: a run resumed within the second keeps both.
        now, event = time.time(), self._events.Event
        name = f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{time.time_ns()}"
        events = [event(wall_time=now, file_version="brain.Event:2")]
        if self._resume_step is not None:  # see `restore`
            start = self._events.SessionLog(status=self._events.SessionLog.START)
            events.append(event(wall_time=now, step=self._resume_step, session_log=start))
            self._resume_step = None
        if self._hparams:
            # tensorboardX's add_hparams summaries, but in this run's own directory: the run is the session.
            summary = import_extra("tensorboardX.summary", "tensorboard", "ciclo.tensorboard")
            experiment, session_start, _ = summary.hparams(self._hparams, {})
            events += [event(wall_time=now, step=0, summary=part) for part in (experiment, session_start)]
            self._hparams = {}
        writer = _EventFile(os.path.join(self.logdir, name), self._crc32c)
        for each in events:
            writer.write(each.SerializeToString())
        return writer

    def write(self, rows: Sequence[Row]) -> None:
        writer = self._writer
        if writer is None:
            writer = self._writer = self._open()
        write = writer.write
        for row in rows:
            write(scalar_event(row.wall_time, row.step, row.scalars))

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def restore(self, state: Mapping[str, Any], after_step: int | None) -> None:
        """Starts the new event file with a `SessionLog.START` after `after_step`: later events drop."""
        self._resume_step = 0 if after_step is None else after_step + 1
        if after_step is not None:  # rows were written: the first event file holds the hparams
            self._hparams = {}

    def __repr__(self) -> str:
        return f"TensorBoardSink({self.logdir!r})"


def tensorboard(logdir: str | os.PathLike[str], *, hparams: Mapping[str, Any] | None = None) -> Logger:
    """A logger that writes every scalar entry to TensorBoard event files in `logdir`.

    No TensorFlow needed (`pip install "ciclo-core[tensorboard]"`); `logdir` is
    created if missing; `hparams` (name -> number, string or bool) go to the
    HPARAMS tab. See docs/logging.md, "TensorBoard".

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
