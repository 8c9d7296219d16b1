"""`ciclo.wandb_logger`: logs to a Weights & Biases run."""

from __future__ import annotations

import re
import secrets
import struct
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, final

from ciclo._src.callbacks._loggers._base import HParams, Logger, Row, Sink, checked_hparams, import_extra


@final
class WandbSink(Sink):
    """Logs rows to a W&B run, one `run.log(scalars, step=step)` per row; see `ciclo.wandb_logger`."""

    def __init__(self, run: Any, init_kwargs: Mapping[str, Any], hparams: HParams) -> None:
        self._wandb = import_extra("wandb", "wandb", "ciclo.wandb_logger")
        self._run = run
        self._owned = run is None  # a run the sink started: it finishes it when closed
        self._run_id: str | None = None if run is None else run.id
        self._init_kwargs = dict(init_kwargs)
        if hparams:  # the run's config: given to wandb.init, or added to the run passed in
            config = dict(self._init_kwargs.get("config") or {})
            both = sorted(set(config) & set(hparams))
            if both:
                raise ValueError(f"hparams and config= both give {both}: give each value once")
            if run is None:
                self._init_kwargs["config"] = {**config, **hparams}
            else:
                run.config.update(dict(hparams))

    @property
    def run(self) -> Any:
        if self._run is None:
            kwargs = dict(self._init_kwargs)
            if self._run_id is not None:
                kwargs.update(id=self._run_id, resume="allow")  # new, or the run a backup names
            self._run = self._wandb.init(**kwargs)
            self._run_id = self._run.id
        return self._run

    def write(self, rows: Sequence[Row]) -> None:
        log = self.run.log
        for row in rows:
            log(dict(row.scalars), step=row.step, commit=True)

    def close(self) -> None:
        if self._run is not None and self._owned:
            self._run.finish()
            self._run = None

    def state(self) -> dict[str, Any]:
        """The run id; asked before the run starts (a first backup), it picks the id the run starts with."""
        if self._run_id is None:
            given = self._init_kwargs.get("id")
            self._run_id = str(given) if given is not None else secrets.token_hex(4)
        return {"run_id": self._run_id}

    def restore(self, state: Mapping[str, Any], after_step: int | None) -> int | None:
        """Resumes the run `state["run_id"]` and returns the newest step it holds.

        A killed run's client may have lost rows its backup claims, or written later ones: online
        W&B counts them (`run.starting_step`); offline, the earlier offline directories are read.
        """
        run_id = state.get("run_id")
        if run_id is None or self._run is not None:
            return None
        self._run_id = str(run_id)
        run = self.run
        if run.settings.mode != "offline":
            return int(run.starting_step) - 1
        return _newest_offline_step(Path(run.settings.wandb_dir), self._run_id, Path(run.settings.sync_dir))

    def __repr__(self) -> str:
        return f"WandbSink(run_id={self._run_id!r})"


_HEADER = struct.Struct("<4sHB")
"""A `.wandb` file starts with `:W&B`, the magic 0xBEE1 and a version (0)."""
_RECORD = struct.Struct("<IHB")
"""Each record fragment: a checksum, the payload's length, its kind (1 whole, 2-4 first/middle/last)."""
_BLOCK = 32768
"""Fragments never cross a block of this size (the LevelDB log format)."""


def _records(data: bytes) -> Iterator[bytes]:
    """The whole records of a `.wandb` file's bytes; stops at a torn tail (a killed writer's)."""
    if len(data) < _HEADER.size or _HEADER.unpack_from(data) != (b":W&B", 0xBEE1, 0):
        return
    position, parts = _HEADER.size, b""
    while True:
        room = _BLOCK - position % _BLOCK
        if room < _RECORD.size:  # too little room for a fragment's header: the block's padding
            position += room
            continue
        if position + _RECORD.size > len(data):
            return
        _, length, kind = _RECORD.unpack_from(data, position)
        payload = data[position + _RECORD.size : position + _RECORD.size + length]
        if len(payload) < length:  # a torn fragment: the writer was killed while writing it
            return
        if kind == 0:  # zeros to the block's end
            position += room
            continue
        position += _RECORD.size + length
        parts += payload
        if kind in (1, 4):
            yield parts
            parts = b""


def _newest_offline_step(wandb_dir: Path, run_id: str, current: Path) -> int:
    """The newest history step in the earlier offline directories of run `run_id` (-1: none)."""
    messages = import_extra("wandb.proto.wandb_internal_pb2", "wandb", "ciclo.wandb_logger")
    newest = -1
    # offline-run-<date>_<time>-<id>, and -<n> after it for a run started again within the second.
    name = re.compile(rf"offline-run-\d{{8}}_\d{{6}}-{re.escape(run_id)}(-\d+)?")
    for directory in wandb_dir.glob("offline-run-*"):
        if directory == current or not name.fullmatch(directory.name):
            continue
        file = directory / f"run-{run_id}.wandb"
        for payload in _records(file.read_bytes()) if file.exists() else ():
            record = messages.Record()
            try:
                record.ParseFromString(payload)
            except Exception:  # noqa: BLE001 - protobuf's DecodeError: a record its writer left half written
                break
            if record.WhichOneof("record_type") == "history":
                newest = max(newest, record.history.step.num)
    return newest


def wandb_logger(run: Any = None, *, hparams: Mapping[str, Any] | None = None, **init_kwargs: Any) -> Logger:
    """A logger that writes every scalar entry to a Weights & Biases run, at its step.

    Needs wandb (`pip install "ciclo-core[wandb]"`). With no `run`, it starts one with
    `wandb.init(**init_kwargs)` on its first write and finishes it when the loop ends; a
    `run` you started is left running. `hparams` become the run's config. See
    docs/logging.md, "Weights & Biases".
    """
    if run is not None and init_kwargs:
        raise TypeError("wandb_logger takes a run or wandb.init arguments, not both")
    return Logger(WandbSink(run, init_kwargs, checked_hparams(hparams)))
