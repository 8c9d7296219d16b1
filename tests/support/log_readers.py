"""What each logger backend holds, read back with the backend's own reader.

TensorBoard: tensorboard's `EventAccumulator` over the whole run directory, as
TensorBoard reads it. CSV: `csv`. W&B offline: the `.wandb` records of the
offline run directories, parsed with W&B's protobuf messages. MLflow:
`MlflowClient.get_metric_history`.
"""

from __future__ import annotations

import csv
import json
import re
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Written = list[tuple[int, str, float]]
"""What a backend holds: (step, entry, value), in the order read."""


def tensorboard(logdir: Path) -> Written:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    events.Reload()  # every event file of the directory in order, resume purges applied
    return [
        (event.step, tag, event.value) for tag in events.Tags()["scalars"] for event in events.Scalars(tag)
    ]


def csv_file(path: Path) -> Written:
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    return [
        (int(row["step"]), name, float(value))
        for row in rows
        for name, value in row.items()
        if name != "step" and value != ""
    ]


_WANDB_BLOCK = 32768


def wandb_records(path: Path) -> Iterator[bytes]:
    """The records of a `.wandb` file: W&B's LevelDB-log format (7-byte header, 32 KiB blocks)."""
    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    position, pending = 7, b""
    while position + 7 <= len(data):
        left = _WANDB_BLOCK - position % _WANDB_BLOCK
        if left < 7:  # a block's tail too short for a record header is padding
            position += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position : position + 7])
        payload = data[position + 7 : position + 7 + length]
        if len(payload) < length:  # the service is still writing this record
            return
        position += 7 + length
        if kind == 0:  # zero padding up to the block's end
            position += left - 7 - length
            continue
        pending += payload
        if kind in (1, 4):  # FULL, LAST
            yield pending
            pending = b""


def wandb_files(wandb_dir: Path, run_id: str | None) -> list[Path]:
    """The `.wandb` files of run `run_id` (None: of every run) under `wandb_dir`, oldest first.

    A run started again within the second of an earlier start gets `-1`, `-2`, ... after its id.
    """
    name = re.compile(
        r"offline-run-\d{8}_\d{6}-" + (".+" if run_id is None else re.escape(run_id) + r"(-\d+)?")
    )
    return sorted(
        file for file in wandb_dir.glob("**/offline-run-*/*.wandb") if name.fullmatch(file.parent.name)
    )


def wait_for_wandb_exits(wandb_dir: Path, timeout: float = 60.0) -> None:
    """Waits until every offline run under `wandb_dir` has its exit record written.

    `run.finish()` returns before W&B's service has written the end of the run's
    file (the last rows, then the exit record). A killed run's file has no exit
    record: call this only where every run was finished.
    """
    from wandb.proto import wandb_internal_pb2

    def finished(file: Path) -> bool:
        for payload in wandb_records(file):
            record = wandb_internal_pb2.Record()
            try:
                record.ParseFromString(payload)
            except Exception:  # noqa: BLE001 - a record still being written
                return False
            if record.WhichOneof("record_type") == "exit":
                return True
        return False

    deadline = time.monotonic() + timeout
    pending = wandb_files(wandb_dir, None)
    while pending:
        pending = [file for file in pending if not finished(file)]
        assert time.monotonic() < deadline, f"no exit record in {pending} after {timeout} s"
        if pending:
            time.sleep(0.01)


def wandb_offline(wandb_dir: Path, run_id: str | None = None) -> Written:
    """The history rows of every offline directory of run `run_id` (default: of every run), oldest first."""
    from wandb.proto import wandb_internal_pb2

    written: Written = []
    for file in wandb_files(wandb_dir, run_id):
        for payload in wandb_records(file):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            if record.WhichOneof("record_type") != "history":
                continue
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):
                    written.append((record.history.step.num, key, json.loads(item.value_json)))
    return written


def mlflow_run(tracking_uri: str, run_id: str) -> Written:
    """Every metric value of run `run_id`, which must be marked finished."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    return [
        (metric.step, name, metric.value)
        for name in run.data.metrics
        for metric in client.get_metric_history(run_id, name)
    ]


# ----------------------------------------------------------------------------- hyperparameters


def tensorboard_hparams(logdir: Path) -> dict[str, Any]:
    """The hparams of the run directory, as TensorBoard's hparams plugin reads its session start."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(logdir))
    events.Reload()
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    data = plugin_data_pb2.HParamsPluginData.FromString(content)
    values = data.session_start_info.hparams
    return {name: getattr(value, value.WhichOneof("kind")) for name, value in values.items()}


def wandb_config(wandb_dir: Path, run_id: str | None = None) -> dict[str, Any]:
    """The config of the offline run(s) `run_id`: their run records' config, then config updates."""
    from wandb.proto import wandb_internal_pb2

    config: dict[str, Any] = {}
    for file in wandb_files(wandb_dir, run_id):
        for payload in wandb_records(file):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            kind = record.WhichOneof("record_type")
            if kind in ("run", "config"):
                for item in (record.run.config if kind == "run" else record.config).update:
                    key = item.key or "/".join(item.nested_key)
                    if not key.startswith("_"):
                        config[key] = json.loads(item.value_json)
    return config


def mlflow_params(tracking_uri: str, run_id: str) -> dict[str, str]:
    """The params of run `run_id` (MLflow stores them as strings)."""
    from mlflow.tracking import MlflowClient

    return dict(MlflowClient(tracking_uri=tracking_uri).get_run(run_id).data.params)
