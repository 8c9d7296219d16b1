"""Goodput across restarts: where a backed-up run's wall time went, one row per process start.

Each start of a loop with a backup writes `goodput/start-<n>.json` in the
backup directory (process 0 alone). The row is rewritten in place at each
step end with one `pwrite` of a fixed-size JSON document: a SIGKILL loses no
write already made, so a killed run's row says how far it got, and the next
start, resuming from its backup, knows exactly which steps it redoes. The row
is flushed to disk (fsync) at each backup.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from ciclo._src.base.compile_cache import _COMPILED
from ciclo._src.base.files import open_own
from ciclo._src.resume.host_json import Schema, check_document

BUCKETS = ("step", "compile", "data", "save", "start", "other")
"""Where the wall time goes: the steps, compiling, waiting for data, saving (backups and checkpoints,
their blocking part), the loop's start (restoring included), and the rest (callbacks, logging)."""
_log = logging.getLogger("ciclo")
_STRAGGLER = (
    "process %d is a straggler: %.3g s per step of its own (%.3g s of them waiting for its batches), more "
    "than straggler_factor=%g times the median of the %d processes, %.3g s; the others wait for it at "
    "each step. Look at its data loading and its host's load"
)
_FOLDER = "goodput"
_ROW = re.compile(r"start-(\d+)\.json")
_WIDTH = 1024  # bytes of each row: rewritten in place, always whole
_compiling = [0.0]  # seconds JAX spent compiling (or reading back) programs in this process, not saving
_saving: list[float] = []  # when each save's blocking work in progress began (time.monotonic)
_saved = [0.0]  # seconds of saves' blocking work ended, in this process (goodput's save bucket)


@contextlib.contextmanager
def saving() -> Iterator[None]:
    """Marks the block as a save's blocking work: `ciclo.watchdog` does not count it as a hang."""
    began = time.monotonic()
    _saving.append(began)
    try:
        yield
    finally:
        _saving.remove(began)
        if not _saving:  # the outermost: its whole span
            _saved[0] += time.monotonic() - began


def saving_since() -> float | None:
    """When the oldest save's blocking work still in progress began (`time.monotonic`), or None."""
    return min(_saving, default=None)


def _heard(event: str, duration_secs: float, **_: str | int) -> None:
    if event == _COMPILED and not _saving:  # a save's programs count as the save
        _compiling[0] += duration_secs


@functools.cache
def _listen() -> None:
    jax.monitoring.register_event_duration_secs_listener(_heard)


class Recorder:
    """Times one start of a run into its row; laps attribute the time since the last lap to a bucket.

    Without a `directory` (the processes other than 0) it times alone: the straggler report's figures.
    """

    def __init__(self, directory: str | None, resumed: int, began: float) -> None:
        _listen()
        self.index, self._fd = 0, None
        if directory is not None:
            folder = os.path.join(directory, _FOLDER)
            os.makedirs(folder, exist_ok=True)
            self.index = 1 + max(
                (int(m[1]) for m in map(_ROW.fullmatch, os.listdir(folder)) if m), default=-1
            )
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
            self._fd = os.open(os.path.join(folder, f"start-{self.index}.json"), flags, 0o644)
        self._began, self._at, self._phase = began, began, "start"
        self._counters = (_compiling[0], _saved[0])
        self._shared: tuple[int, float, float] | None = None  # steps, busy, data at the last report
        self.row: dict[str, Any] = {"format": 1, "date": time.time(), "resumed": resumed, "steps": resumed}
        self.row.update(dict.fromkeys(("wall", *BUCKETS), 0.0))
        self.write(sync=False)

    def lap(self, phase: str) -> None:
        """Attributes the time since the last lap to the current phase (less compiling and saving in it)."""
        now, counters = time.monotonic(), (_compiling[0], _saved[0])
        compiling, saving = (b - a for a, b in zip(self._counters, counters, strict=True))
        row = self.row
        row[self._phase] += now - self._at - compiling - saving
        row["compile"] += compiling
        row["save"] += saving
        row["wall"] = now - self._began
        self._at, self._counters, self._phase = now, counters, phase

    def iterate(self, iterator: Iterator[Any]) -> Iterator[Any]:
        """`iterator`, its `next` timed as data wait."""
        while True:
            self.lap("data")
            try:
                batch = next(iterator)
            except StopIteration:
                return
            finally:
                self.lap("step")
            yield batch

    def step_end(self, steps: int) -> None:
        """Ends a step: the row now says `steps` were done."""
        self.lap("other")
        self.row["steps"] = steps
        self.write(sync=False)
        if self._shared is None:  # the first step, its compile and the start's unequal waits, is not shared
            self._shared = self._busy()

    def _busy(self) -> tuple[int, float, float]:
        self.lap("other")
        row = self.row
        return row["steps"], row["step"] + row["data"] + row["other"], row["data"]

    def report_stragglers(self, factor: float) -> None:
        """Shares this process's times per step since the last call; process 0 names the slow processes.

        Every process calls it at the same step (a backup's): one small allgather, nothing per step. A
        process's own time per step is its busy time (steps, data, callbacks) less what it waited for
        slower peers' batches; a straggler's is over `factor` times the (lower) median of all.
        """
        before = self._shared
        if before is None or before[0] == self.row["steps"]:  # the same in every process: all gather, or none
            return
        self._shared = now = self._busy()
        steps, busy, data = (b - a for a, b in zip(before, now, strict=True))
        from jax.experimental import multihost_utils  # noqa: PLC0415 - a multi-process run's, when used

        table = np.asarray(multihost_utils.process_allgather(np.asarray([busy, data]) / steps))
        busy_, data_ = table[:, 0], table[:, 1]
        own = np.maximum(busy_ - (data_.max() - data_), data_)
        median = float(np.sort(own)[(len(own) - 1) // 2])
        if jax.process_index() != 0 or not median > 0:
            return
        for p in np.flatnonzero(own > factor * median):
            _log.warning(_STRAGGLER, p, own[p], data_[p], factor, len(own), median)

    def write(self, *, sync: bool) -> None:
        if self._fd is None:
            return
        os.pwrite(self._fd, json.dumps(self.row).encode().ljust(_WIDTH), 0)
        if sync:
            os.fsync(self._fd)

    def close(self) -> None:
        self.lap("other")
        self.write(sync=True)
        if self._fd is not None:
            os.close(self._fd)


_SCHEMA: Schema = {
    "format": (int, lambda x: x == 1, "1, the format this ciclo reads"),
    "date": (float, math.isfinite, "a time"),
    "resumed": (int, lambda x: x >= 0, "a step"),
    "steps": (int, lambda x: x >= 0, "a step"),
    **dict.fromkeys(("wall", *BUCKETS), (float, math.isfinite, "seconds")),
}


@dataclasses.dataclass(frozen=True)
class Goodput:
    """A backed-up run's time across its restarts (`ciclo.goodput`); `str()` it for one line."""

    rows: tuple[dict[str, Any], ...]
    """One per process start: `date`, `resumed` (the step it started from), `steps` (the furthest
    it reached), `lost` (steps the previous start had done beyond its last backup, redone), `wall`
    and the seconds of each bucket (`step`, `compile`, `data`, `save`, `start`, `other`)."""

    def to_dict(self) -> dict[str, Any]:
        """The totals: `restarts`, `lost` steps, `wall` and each bucket's seconds, `goodput` (step/wall)."""
        totals = {name: sum(row[name] for row in self.rows) for name in ("lost", "wall", *BUCKETS)}
        wall = totals["wall"]
        return {
            "restarts": max(len(self.rows) - 1, 0),
            **totals,
            "goodput": totals["step"] / wall if wall else 0.0,
        }

    def __str__(self) -> str:
        d, restarts = self.to_dict(), len(self.rows) - 1
        buckets = " + ".join(f"{name} {d[name]:.1f}" for name in BUCKETS)
        return (
            f"goodput {d['goodput']:.1%} over {restarts} restart{'s' * (restarts != 1)} ({d['lost']} steps "
            f"redone): wall {d['wall']:.1f} s = {buckets}"
        )


def goodput(directory: str | os.PathLike[str]) -> Goodput:
    """Where the wall time of the run backed up in `directory` went, across its restarts.

    Args:
        directory: the run's backup directory (`backup=`).

    Returns:
        A `Goodput`: `rows` (one per process start), `to_dict()` (totals), and
        `str()` (one line).

    Example:
        >>> import ciclo, tempfile
        >>> directory = tempfile.mkdtemp()
        >>> _ = ciclo.loop(0, range(10), {ciclo.every(1): lambda s, b: s + b}, stop=5, backup=directory)
        >>> report = ciclo.goodput(directory)
        >>> report.to_dict()["restarts"], report.rows[0]["steps"]
        (0, 5)
    """
    folder = os.path.join(os.path.abspath(os.fspath(directory)), _FOLDER)
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            f"{directory} holds no goodput record: give goodput() the backup directory of a run (backup=)"
        )
    starts = sorted(int(m[1]) for m in map(_ROW.fullmatch, os.listdir(folder)) if m)
    rows: list[dict[str, Any]] = []
    for index in starts:
        path = os.path.join(folder, f"start-{index}.json")
        try:
            with open_own(path, "r") as file:
                text = file.read()
            if not text:  # a start killed between creating its row and writing it: no step done
                continue
            row = dict(check_document(json.loads(text), _SCHEMA, path))
        except (OSError, ValueError) as error:
            raise ValueError(f"a goodput row cannot be read: {error}; remove it to read the others") from None
        row["lost"] = max(rows[-1]["steps"] - row["resumed"], 0) if rows else 0
        rows.append(row)
    return Goodput(tuple(rows))
