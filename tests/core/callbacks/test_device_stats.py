from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from support import log_readers

import ciclo


class FakeDevice:
    """A stand-in for a `jax.Device` whose backend reports memory stats: passed as `devices=`."""

    def __init__(self, id: int, platform: str = "gpu", in_use: int = 1000) -> None:
        self.id = id
        self.platform = platform
        self.in_use = in_use
        self.reads = 0

    def memory_stats(self) -> dict[str, int] | None:
        self.reads += 1
        self.in_use += 100  # each read sees the allocator a little further on
        return {"bytes_in_use": self.in_use, "peak_bytes_in_use": 10_000 + self.id, "bytes_limit": 1 << 30}


class Silent(FakeDevice):
    def memory_stats(self) -> dict[str, int] | None:
        self.reads += 1
        return None


class Unimplemented(FakeDevice):
    def memory_stats(self) -> dict[str, int] | None:
        self.reads += 1
        raise RuntimeError("UNIMPLEMENTED: GetAllocatorStats is not supported")


def train_step(state: int, batch: Any) -> tuple[ciclo.types.Logs, int]:
    return ciclo.logs().add_loss("loss", 1.0 / (state + 1)), state + 1


def paths(history: ciclo.types.History) -> list[tuple[str, str]]:
    """Every `(collection, name)` the history's rows hold, but the elapsed counts."""
    return sorted(
        {(c, n) for row in history for c, entries in row.items() if c != "elapsed" for n in entries}
    )


def notes(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if "device_stats" in record.getMessage()]


# --- a backend with no memory stats (CPU) -----------------------------------------------------


def test_on_cpu_logs_nothing_and_notes_it_once(caplog: pytest.LogCaptureFixture) -> None:
    cpus = jax.local_devices(backend="cpu")  # the real devices: their memory_stats() is None
    stats = ciclo.device_stats(devices=cpus)
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        _, history, _ = ciclo.loop(0, range(6), {ciclo.every(1): [train_step, stats]})
        ciclo.loop(0, range(3), {ciclo.every(1): [train_step, stats]})  # a second loop: no second note
    assert paths(history) == [("losses", "loss")]
    assert stats() == {}
    (note,) = notes(caplog)
    assert "the cpu backend reports no memory stats (memory_stats() returned None)" in note
    assert "nothing to log" in note and f"device{cpus[0].id}" in note


def test_reads_the_local_devices_by_default_asked_at_the_first_read(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ciclo.device_stats().devices == tuple(jax.local_devices())
    asked: list[FakeDevice] = []

    def local_devices() -> list[FakeDevice]:
        asked.append(FakeDevice(7))
        return asked[-1:]

    monkeypatch.setattr(jax, "local_devices", local_devices)
    stats = ciclo.device_stats()
    assert asked == []  # not asked when made: jax.distributed may not be started yet
    _, history, _ = ciclo.loop(0, range(3), {ciclo.every(1): [train_step, stats]})
    assert len(asked) == 1 and asked[0].reads == 3
    assert history.collect("device7/bytes_in_use") == [1100, 1200, 1300]


def test_each_callback_notes_once() -> None:
    devices = [Silent(0, "cpu")]
    first, second = ciclo.device_stats(devices=devices), ciclo.device_stats(devices=devices)
    logger = logging.getLogger("ciclo")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        for _ in range(3):
            first(), second()
    finally:
        logger.removeHandler(handler)
    assert len(records) == 2
    # A device that reports nothing at the first read is not asked again.
    assert devices[0].reads == 2


def test_a_backend_that_raises_is_noted_with_its_error(caplog: pytest.LogCaptureFixture) -> None:
    stats = ciclo.device_stats(devices=[Unimplemented(0, "metal")])
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        assert stats() == {} and stats() == {}
    (note,) = notes(caplog)
    assert "the metal backend reports no memory stats (memory_stats() raised RuntimeError: " in note
    assert "UNIMPLEMENTED" in note


# --- a backend with memory stats ----------------------------------------------------------------


def test_logs_each_device_s_bytes_in_use_and_peak(caplog: pytest.LogCaptureFixture) -> None:
    devices = [FakeDevice(0), FakeDevice(1, in_use=5000)]
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        _, history, _ = ciclo.loop(
            0, range(3), {ciclo.every(1): [train_step, ciclo.device_stats(devices=devices)]}
        )
    assert notes(caplog) == []
    assert history.collect("steps", "device0/bytes_in_use", "device1/bytes_in_use") == (
        [0, 1, 2],
        [1100, 1200, 1300],
        [5100, 5200, 5300],
    )
    assert history.collect("device_stats.device0/peak_bytes_in_use", "device1/peak_bytes_in_use") == (
        [10_000] * 3,
        [10_001] * 3,
    )
    assert all(type(value) is int for value in history.collect("device1/bytes_in_use"))
    # Only the two counters, in their own collection: no bytes_limit, nothing in metrics.
    assert paths(history) == [
        ("device_stats", "device0/bytes_in_use"),
        ("device_stats", "device0/peak_bytes_in_use"),
        ("device_stats", "device1/bytes_in_use"),
        ("device_stats", "device1/peak_bytes_in_use"),
        ("losses", "loss"),
    ]


def test_as_a_task_under_a_schedule_reads_at_its_steps() -> None:
    device = FakeDevice(0)
    stats = ciclo.device_stats(devices=[device])
    _, history, _ = ciclo.loop(0, range(25), {ciclo.every(1): train_step, ciclo.every(10): stats})
    assert history.collect("steps", "device0/bytes_in_use") == ([0, 10, 20], [1100, 1200, 1300])
    assert device.reads == 3


def test_only_the_devices_that_report_are_logged_and_the_others_noted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stats = ciclo.device_stats(devices=[FakeDevice(4), Silent(5, "cpu")])
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        assert stats() == {
            "device_stats": {"device4/bytes_in_use": 1100, "device4/peak_bytes_in_use": 10_004}
        }
        assert stats().device_stats["device4/bytes_in_use"] == 1200
    (note,) = notes(caplog)
    assert "['device5']" in note and "device4" not in note


def test_in_train_loop_callbacks_logs_with_the_training_step_and_not_in_the_bar() -> None:
    class Counter:
        def __init__(self, count: int = 0) -> None:
            self.count = count

        def train_step(self, batch: Any) -> tuple[ciclo.types.Logs, Counter]:
            return ciclo.logs().add_loss("loss", 1.0), Counter(self.count + 1)

        def test_step(self, batch: Any) -> ciclo.types.Logs:
            return ciclo.logs().add_loss("loss", 0.5)

    bar = io.StringIO()
    device = FakeDevice(0)
    _, history, _ = ciclo.train_loop(
        Counter(),
        [np.zeros(2, np.float32)] * 4,
        callbacks=[ciclo.device_stats(devices=[device]), ciclo.keras_bar(total=4, file=bar)],
        test_dataset=lambda: [np.zeros(2, np.float32)],
        epoch_duration=2,
    )
    assert history.collect("steps", "device0/bytes_in_use") == ([0, 1, 2, 3], [1100, 1200, 1300, 1400])
    assert device.reads == 4  # after each training step only, not in the evaluation
    assert "bytes_in_use" not in bar.getvalue() and "loss" in bar.getvalue()


def test_the_entries_reach_a_logger(tmp_path: Path) -> None:
    path = tmp_path / "log.csv"
    ciclo.loop(
        0,
        range(3),
        {
            ciclo.every(1): [train_step],
            ciclo.every(2): [ciclo.device_stats(devices=[FakeDevice(0)])],
            ciclo.always(): [ciclo.csv_logger(path)],
        },
    )
    assert path.read_text().splitlines()[0] == "step,loss,device0/bytes_in_use,device0/peak_bytes_in_use"
    assert [row for row in log_readers.csv_file(path) if row[1].startswith("device0/")] == [
        (0, "device0/bytes_in_use", 1100.0),
        (0, "device0/peak_bytes_in_use", 10_000.0),
        (2, "device0/bytes_in_use", 1200.0),
        (2, "device0/peak_bytes_in_use", 10_000.0),
    ]


# --- the callback itself ----------------------------------------------------------------------


def test_is_a_loop_callback_of_the_types_namespace() -> None:
    stats: ciclo.types.LoopCallback[Any] = ciclo.device_stats()
    assert isinstance(stats, ciclo.types.LoopCallback) and isinstance(stats, ciclo.types.DeviceStats)
    assert repr(stats) == "ciclo.device_stats()"
    assert "FakeDevice" in repr(ciclo.device_stats(devices=(FakeDevice(0),)))
    assert not hasattr(stats, "on_test_step")


@pytest.mark.parametrize(
    ("devices", "error", "match"),
    [
        (jax.local_devices, TypeError, "devices must be a list of jax devices"),
        ("gpu", TypeError, "'gpu'"),
        ([], ValueError, "at least one device"),
        ([0], TypeError, r"jax devices \(jax.local_devices\(\)\), got 0"),
        ([FakeDevice(True)], TypeError, "id must be an int, got True"),
        ([FakeDevice(1), FakeDevice(1)], ValueError, r"distinct.*\[1, 1\]"),
    ],
)
def test_bad_devices_raise_naming_the_value(devices: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        ciclo.device_stats(devices=devices)
