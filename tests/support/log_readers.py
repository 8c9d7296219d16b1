"""What each logger backend holds, read back with the backend's own reader.

TensorBoard: tensorboard's `EventAccumulator` over the whole run directory, as
TensorBoard reads it. CSV: `csv`. W&B offline: the `.wandb` records of the
offline run directories, parsed with W&B's protobuf messages. MLflow:
`MlflowClient.get_metric_history`.
"""

from __future__ import annotations

import csv
import json
import struct
from collections.abc import Iterator
from pathlib import Path

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
        position += 7 + length
        if kind == 0:  # zero padding up to the block's end
            position += left - 7 - length
            continue
        pending += payload
        if kind in (1, 4):  # FULL, LAST
            yield pending
            pending = b""


def wandb_offline(wandb_dir: Path, run_id: str = "*") -> Written:
    """The history rows of every offline directory of run `run_id` (default: of every run), oldest first."""
    from wandb.proto import wandb_internal_pb2

    written: Written = []
    for file in sorted(wandb_dir.glob(f"**/offline-run-*-{run_id}/*.wandb")):
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
