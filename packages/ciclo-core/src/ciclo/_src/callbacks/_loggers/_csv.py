"""`ciclo.csv_logger`: one CSV row per logged step, a column per entry."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, final

from ciclo._src.base.checks import check_path, warn
from ciclo._src.base.files import open_own, write_atomically
from ciclo._src.base.reprs import short
from ciclo._src.callbacks._loggers._base import HParams, Logger, Row, Sink, checked_hparams

STEP = "step"


@final
class CsvSink(Sink):
    """Writes rows to a CSV file whose header is every entry seen so far; see `ciclo.csv_logger`."""

    def __init__(self, path: str | os.PathLike[str], hparams: HParams) -> None:
        self.path = check_path(path, "path")
        self.hparams_path = os.path.splitext(self.path)[0] + ".hparams.json"  # log.csv -> log.hparams.json
        self._hparams = hparams
        self._columns: list[str] | None = None  # the header; None: the file is not opened yet
        self._keep_through: int | None = None  # restored: the file's rows of later steps are dropped

    def _open(self) -> list[str]:
        keep_through = self._keep_through
        if keep_through is not None and os.path.exists(self.path):
            with open_own(self.path, "r") as file:
                reader = csv.reader(file)
                header = next(reader, None)
                rows = list(reader)
            if header:
                self._keep_hparams()
                # Rows after the restored step were written after the backup: written again now.
                kept = [row for row in rows if int(row[0]) <= keep_through]
                if len(kept) != len(rows):
                    self._replace(header, kept)
                return header
        self._write_hparams()
        self._replace([STEP], [])
        return [STEP]

    def _write_hparams(self) -> None:
        if self._hparams:
            write_atomically(self.hparams_path, json.dumps(self._hparams, indent=2) + "\n")

    def _keep_hparams(self) -> None:
        """A resumed run keeps its hparams file (a damaged one is written anew), warning of other hparams."""
        try:
            with open_own(self.hparams_path, "r") as file:
                started = json.load(file)
        except FileNotFoundError:
            started = {}  # the run started without hparams
        except (OSError, ValueError):
            started = None
        if not isinstance(started, dict):
            self._write_hparams()
            return
        changed = [
            f"{short(name, 80)}: {short(started.get(name), 80)} -> {short(self._hparams.get(name), 80)}"
            for name in dict.fromkeys([*started, *self._hparams])
            if started.get(name, _ABSENT) != self._hparams.get(name, _ABSENT)
        ]
        if changed:
            more = f" and {len(changed) - 8} more" if len(changed) > 8 else ""
            warn(
                f"csv_logger({short(self.path)}) resumes a run that started with other hparams "
                f"({'; '.join(changed[:8])}{more}): kept {short(self.hparams_path)} as it was, since a "
                "resumed run keeps the hparams it started with. To record these, start a new run "
                "(another path and backup directory)"
            )

    def _replace(self, header: list[str], rows: Sequence[Sequence[Any]]) -> None:
        text = io.StringIO()
        writer = csv.writer(text)
        writer.writerow(header)
        writer.writerows(rows)
        write_atomically(self.path, text.getvalue())

    def write(self, rows: Sequence[Row]) -> None:
        columns = self._columns
        if columns is None:
            columns = self._columns = self._open()
        new = list(dict.fromkeys(name for row in rows for name in row.scalars if name not in columns))
        if new:
            with open_own(self.path, "r") as file:
                old = list(csv.reader(file))[1:]
            widened = [*columns, *new]
            self._replace(widened, [line + [""] * len(new) for line in old])
            columns = self._columns = widened
        entries = columns[1:]
        with open_own(self.path, "a") as file:
            writer = csv.writer(file)
            # repr of a float round-trips: the file holds the exact values of the History.
            writer.writerows([row.step, *(row.scalars.get(name, "") for name in entries)] for row in rows)

    def flush(self) -> None:
        if self._columns is not None:
            with open_own(self.path, "r") as file:
                os.fsync(file.fileno())

    def restore(self, state: Mapping[str, Any], after_step: int | None) -> None:
        self._keep_through = -1 if after_step is None else after_step
        self._columns = None

    def __repr__(self) -> str:
        return f"CsvSink({short(self.path)})"


_ABSENT = object()


def csv_logger(path: str | os.PathLike[str], *, hparams: Mapping[str, Any] | None = None) -> Logger:
    """A logger that writes one CSV row per logged step: `step`, then a column per entry.

    A new entry rewrites the file with the wider header, atomically; `hparams` go to
    `log.hparams.json` beside `log.csv`. See docs/logging.md, "CSV".

    Example:
        >>> import os, tempfile
        >>> from pathlib import Path
        >>> import ciclo
        >>> def train_step(state, batch):
        ...     logs = ciclo.logs().add_loss("loss", 1.0 / (batch + 1))
        ...     if batch == 2:
        ...         logs.add_metric("accuracy_test", 0.75)
        ...     return logs, state
        >>> path = os.path.join(tempfile.mkdtemp(), "log.csv")
        >>> _ = ciclo.loop(None, range(3), {ciclo.every(1): [train_step, ciclo.csv_logger(path)]})
        >>> print(Path(path).read_text())
        step,loss,accuracy_test
        0,1.0,
        1,0.5,
        2,0.3333333333333333,0.75
        <BLANKLINE>
    """
    return Logger(CsvSink(path, checked_hparams(hparams)))
