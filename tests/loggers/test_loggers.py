"""The loggers write every scalar entry of the History, at its step, read back with each backend's own reader.

One table of backends, each with how to make a logger and how to read back
what it wrote: TensorBoard (tensorboard's `EventAccumulator`), CSV (`csv`),
W&B offline (the run's `.wandb` records), MLflow (`MlflowClient.get_metric_history`
on a `file:` store) and clu metric writers.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib
import json
import math
import os
import sys
import types
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from support import log_readers
from support.log_readers import Written

import ciclo


@pytest.fixture(autouse=True)
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3: the file store is opt-in
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")
    (tmp_path / "wandb").mkdir()
    yield


# ----------------------------------------------------------------------------- readers


def read_tensorboard(path: Path, logger: ciclo.types.Logger) -> Written:
    return log_readers.tensorboard(path / "tb")


def read_csv(path: Path, logger: ciclo.types.Logger) -> Written:
    return log_readers.csv_file(path / "log.csv")


def read_wandb(path: Path, logger: ciclo.types.Logger) -> Written:
    log_readers.wait_for_wandb_exits(path / "wandb")
    return log_readers.wandb_offline(path / "wandb")  # one run per test


def wandb_logger(path: Path, **kwargs: Any) -> ciclo.types.Logger:
    # A resumed logger reads the run's earlier files: wait until W&B's service has finished them.
    log_readers.wait_for_wandb_exits(path / "wandb")
    return ciclo.wandb_logger(project="ciclo", dir=str(path / "wandb"), **kwargs)


def read_mlflow(path: Path, logger: ciclo.types.Logger) -> Written:
    return log_readers.mlflow_run(mlflow_uri(path), logger.state_dict()["run_id"])


def mlflow_uri(path: Path) -> str:
    return "file:" + str(path / "mlruns")


def clu_writers() -> Any:
    """clu's metric_writers modules without the package's `__init__`, which imports TensorFlow."""
    spec = importlib.util.find_spec("clu")
    if spec is None or spec.submodule_search_locations is None:
        pytest.skip('clu is not installed: nox -s "tests(loggers)" installs it and runs this test')
    package = types.ModuleType("clu.metric_writers")
    package.__path__ = [os.path.join(spec.submodule_search_locations[0], "metric_writers")]
    return package


@pytest.fixture
def clu_interface(monkeypatch: pytest.MonkeyPatch) -> Any:
    package = clu_writers()
    for name in [name for name in sys.modules if name.startswith("clu.metric_writers")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "clu.metric_writers", package)
    interface = importlib.import_module("clu.metric_writers.interface")
    async_writer = importlib.import_module("clu.metric_writers.async_writer")
    return interface, async_writer


def recorder_class(interface: Any) -> type:
    class Recorder(interface.MetricWriter):  # type: ignore[misc,name-defined]
        """A clu MetricWriter that keeps what it is given."""

        def __init__(self) -> None:
            self.written: Written = []
            self.flushes = 0

        def write_scalars(self, step: int, scalars: Any) -> None:
            self.written.extend((step, name, value) for name, value in scalars.items())

        def flush(self) -> None:
            self.flushes += 1

        def write_summaries(self, *args: Any, **kwargs: Any) -> None: ...
        def write_images(self, *args: Any, **kwargs: Any) -> None: ...
        def write_videos(self, *args: Any, **kwargs: Any) -> None: ...
        def write_audios(self, *args: Any, **kwargs: Any) -> None: ...
        def write_texts(self, *args: Any, **kwargs: Any) -> None: ...
        def write_histograms(self, *args: Any, **kwargs: Any) -> None: ...
        def write_pointcloud(self, *args: Any, **kwargs: Any) -> None: ...
        def write_hparams(self, *args: Any, **kwargs: Any) -> None: ...
        def close(self) -> None: ...

    return Recorder


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str
    make: Callable[[Path], ciclo.types.Logger]
    read: Callable[[Path, ciclo.types.Logger], Written]
    module: str  # the reader's module: the case is skipped where it is not installed
    float32: bool = False  # stores values as float32


BACKENDS = [
    Backend(
        "tensorboard", lambda path: ciclo.tensorboard(path / "tb"), read_tensorboard, "tensorboard", True
    ),
    Backend("csv", lambda path: ciclo.csv_logger(path / "log.csv"), read_csv, "csv"),
    Backend(
        "wandb",
        wandb_logger,
        read_wandb,
        "wandb",
    ),
    Backend(
        "mlflow",
        lambda path: ciclo.mlflow_logger("ciclo", run_name="run", tracking_uri=mlflow_uri(path)),
        read_mlflow,
        "mlflow",
    ),
]


@pytest.fixture(params=BACKENDS, ids=[backend.name for backend in BACKENDS])
def backend(request: pytest.FixtureRequest) -> Backend:
    backend: Backend = request.param
    pytest.importorskip(backend.module)
    if backend.name == "tensorboard":
        pytest.importorskip("tensorboardX")
    return backend


# ----------------------------------------------------------------------------- what is logged


class Model:
    """A state whose steps log device arrays, as a jitted step does: train and test entries."""

    def __init__(self, seen: int = 0) -> None:
        self.seen = seen

    def train_step(self, batch: float) -> tuple[ciclo.types.Logs, Model]:
        x = jnp.float32(batch)
        logs = ciclo.logs().add_loss("loss", 1.0 / (x + 1.0), add_metric=True)
        return logs.add_metric("accuracy", x / 1000.0).add_output("preds", jnp.ones(3)), Model(self.seen + 1)

    def test_step(self, batch: float) -> tuple[ciclo.types.Logs, Model]:
        return ciclo.logs().add_loss("loss", jnp.float32(batch) / 7.0), self

    def reset_step(self) -> Model:
        return self


STEPS, EPOCH = 300, 100  # more than History's 2 × 128 rows: rows reach the host while the loop runs


def train(logger: ciclo.types.Logger, start: int = 0, stop: int = STEPS) -> ciclo.types.History:
    _, history, _ = ciclo.train_loop(
        Model(),
        (float(i) for i in range(start, stop)),
        test_dataset=lambda: [1.0, 2.0, 3.0],
        epoch_duration=EPOCH,
        callbacks=[logger],
        elapsed=ciclo.types.Elapsed.create(steps=start),
    )
    return history


def expected(*histories: ciclo.types.History) -> Written:
    return [
        (entry["elapsed"]["steps"], name, value)
        for history in histories
        for entry in history
        for name, value in {  # `metrics.loss` and `losses.loss` hold one value: written once
            name: value
            for collection, entries in entry.items()
            if collection not in ("elapsed", "outputs")
            for name, value in entries.items()
        }.items()
    ]


def assert_same(written: Written, want: Written, backend: Backend) -> None:
    keys = Counter((step, name) for step, name, _ in written)
    assert [key for key, count in keys.items() if count > 1] == [], "a step written twice"
    assert sorted(keys) == sorted((step, name) for step, name, _ in want)
    values = {(step, name): value for step, name, value in written}
    for step, name, value in want:
        wanted = float(np.float32(value)) if backend.float32 else value
        assert values[step, name] == wanted, (step, name)


# ----------------------------------------------------------------------------- the contract


def test_train_loop_writes_every_value_of_the_history(backend: Backend, tmp_path: Path) -> None:
    logger = backend.make(tmp_path)
    history = train(logger)
    want = expected(history)
    assert {name for _, name, _ in want} == {"loss", "accuracy", "loss_test"}
    assert len(want) == 2 * STEPS + STEPS // EPOCH
    assert_same(backend.read(tmp_path, logger), want, backend)
    assert logger.state_dict()["step"] == STEPS - 1


def test_a_resumed_logger_appends_after_its_step_without_duplicates(backend: Backend, tmp_path: Path) -> None:
    first = backend.make(tmp_path)
    history_1 = train(first, 0, 150)
    saved = first.state_dict()
    assert saved["step"] == 149

    resumed = backend.make(tmp_path)
    resumed.load_state_dict(saved)
    history_2 = train(resumed, 150, STEPS)
    if "run_id" in saved:
        assert resumed.state_dict()["run_id"] == saved["run_id"]
    assert_same(backend.read(tmp_path, resumed), expected(history_1, history_2), backend)


def test_a_resumed_run_skips_the_restored_rows_of_its_history(tmp_path: Path) -> None:
    # A backup restores the history with the logger: rows up to the logger's step are not written again.
    path = tmp_path / "log.csv"
    logger = ciclo.csv_logger(path)
    history = train(logger, 0, 50)
    resumed = ciclo.csv_logger(path)
    resumed.load_state_dict({"step": 29})  # a backup taken before the last rows were written
    with pytest.warns(ciclo.types.DataWarning, match="no batch"):  # no step: the loop's end writes the rest
        ciclo.loop(
            None,
            [],
            {ciclo.every(1): [resumed]},
            history=history,
            elapsed=ciclo.types.Elapsed.create(steps=50),
        )
    assert_same(read_csv(tmp_path, resumed), expected(history), BACKENDS[1])


@pytest.mark.parametrize("runner", ["loop", "hand"])
def test_loop_tasks_and_hand_written_loops(runner: str, tmp_path: Path) -> None:
    logger = ciclo.csv_logger(tmp_path / "log.csv")
    history = ciclo.history()
    state = Model()
    if runner == "loop":

        def step(state: Model, batch: float) -> Any:
            return state.train_step(batch)

        _, history, _ = ciclo.loop(state, (float(i) for i in range(STEPS)), {ciclo.every(1): [step, logger]})
    else:
        with logger:
            for i in range(STEPS):
                logs, state = state.train_step(float(i))
                logger.write(i, logs)
                history.append(i, 0, 0.0, logs)
    assert_same(read_csv(tmp_path, logger), expected(history), BACKENDS[1])


class Recording:
    """A sink that records how it is called."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.scalars: list[dict[str, Any]] = []
        self.closed = 0

    def write(self, rows: Any) -> None:
        self.batches.append([row.step for row in rows])
        self.scalars += [row.scalars for row in rows]

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed += 1

    def state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: Any, after_step: Any) -> None:
        pass


def test_rows_are_written_in_batches_from_the_host_not_at_each_step() -> None:
    sink = Recording()
    written_while_running: list[tuple[int, int]] = []

    def step(state: None, batch: int, elapsed: Any, loop_state: ciclo.types.LoopState[None]) -> Any:
        # What the sink has been given is never newer than what History holds on the host.
        written = sum(len(batch) for batch in sink.batches)
        written_while_running.append((written, loop_state.history.on_host))
        return ciclo.logs().add_loss("loss", jnp.float32(batch))

    ciclo.loop(None, range(1000), {ciclo.every(1): [step, ciclo.types.Logger(sink)]})
    assert all(written <= on_host for written, on_host in written_while_running)
    assert len(sink.batches) <= 1000 // 128 + 1  # a handful of writes, not one per step
    assert all(len(batch) >= 128 for batch in sink.batches)
    assert [step for batch in sink.batches for step in batch] == list(range(1000))
    assert sink.closed == 1


@pytest.mark.parametrize("backend_name", ["tensorboard", "csv"])
def test_an_exception_still_writes_every_row_before_it(backend_name: str, tmp_path: Path) -> None:
    backend = next(backend for backend in BACKENDS if backend.name == backend_name)
    pytest.importorskip(backend.module)
    logger = backend.make(tmp_path)

    def step(state: None, batch: int) -> Any:
        if batch == 200:
            raise RuntimeError("boom")
        return ciclo.logs().add_loss("loss", jnp.float32(batch) / 3)

    history = ciclo.history()
    with pytest.raises(RuntimeError, match="boom"):
        ciclo.loop(None, range(300), {ciclo.every(1): [step, logger]}, history=history)
    want = expected(history)
    assert [step for step, _, _ in want] == list(range(200))
    assert_same(backend.read(tmp_path, logger), want, backend)


def test_csv_widens_its_header_when_new_entries_appear(tmp_path: Path) -> None:
    history = train(ciclo.csv_logger(tmp_path / "log.csv"))
    with open(tmp_path / "log.csv", newline="") as file:
        rows = list(csv.reader(file))
    assert rows[0] == ["step", "loss", "accuracy", "loss_test"]
    assert len(rows) == 1 + len(history)
    assert [row[3] != "" for row in rows[1:]].count(True) == STEPS // EPOCH
    assert [name for name in os.listdir(tmp_path) if name.startswith(".ciclo-")] == []


def test_a_resumed_csv_logger_never_appends_through_a_link(tmp_path: Path) -> None:
    precious = tmp_path / "precious.txt"
    precious.write_text("mine\n")
    (tmp_path / "log.csv").symlink_to(precious)  # planted where the log will be
    logger = ciclo.csv_logger(tmp_path / "log.csv")
    logger.load_state_dict(logger.state_dict())  # as a resumed run's logger: it appends
    with pytest.raises(ciclo.types.LinkError, match=r"log.csv is a symbolic link"):
        train(logger)
    assert precious.read_text() == "mine\n"


def test_loggers_are_stateful_callbacks(tmp_path: Path) -> None:
    logger = ciclo.csv_logger(tmp_path / "log.csv")
    assert isinstance(logger, ciclo.types.StatefulCallback)
    assert logger.state_dict() == {"step": None}


# ----------------------------------------------------------------------------- clu


def test_metric_writer_logger_writes_through_clu_writers(clu_interface: Any) -> None:
    interface, async_writer = clu_interface
    recorder = recorder_class(interface)()
    writer = async_writer.AsyncWriter(recorder)
    history = train(ciclo.metric_writer_logger(writer))
    writer.close()
    assert_same(recorder.written, expected(history), BACKENDS[1])
    assert recorder.flushes >= 1


def test_metric_writer_logger_needs_a_writer() -> None:
    with pytest.raises(TypeError, match="MetricWriter"):
        ciclo.metric_writer_logger(object())


# ----------------------------------------------------------------------------- missing extras


@pytest.mark.parametrize(
    ("make", "module", "extra"),
    [
        (lambda: ciclo.tensorboard("logs"), "tensorboardX", "tensorboard"),
        (lambda: ciclo.wandb_logger(project="p"), "wandb", "wandb"),
        (lambda: ciclo.mlflow_logger(), "mlflow", "mlflow"),
    ],
    ids=["tensorboard", "wandb", "mlflow"],
)
def test_a_missing_extra_names_what_to_install(
    make: Callable[[], Any], module: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A None entry in sys.modules makes `import module` (and its submodules) raise ImportError.
    for name in [name for name in sys.modules if name.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError, match=f'pip install "ciclo-core\\[{extra}\\]"'):
        make()


def test_a_logger_writes_numbers_only() -> None:
    logs = ciclo.logs().add_metrics(
        a=np.float32(0.5), b=np.array(2), c=True, e=np.ones(2), f=None, g=jnp.int32(3)
    )
    logs.add_output("d", "text")  # text is logged as an output (metrics refuse it)
    logs.add_loss("a", 0.25)  # another value under the same name: both kept, by collection
    sink = Recording()
    with ciclo.types.Logger(sink) as logger:
        logger.write(0, logs)
        logger.write(1, ciclo.logs().add_loss("loss", 0.5, add_metric=True))  # one value: once
    assert sink.scalars == [{"metrics.a": 0.5, "losses.a": 0.25, "b": 2, "c": 1, "g": 3}, {"loss": 0.5}]


def test_flush_writes_the_rows_given_so_far(tmp_path: Path) -> None:
    logger = ciclo.csv_logger(tmp_path / "log.csv")
    logger.write(0, ciclo.logs().add_loss("loss", jnp.float32(0.5)))
    logger.flush()
    logger.write(1, {"losses": {"loss": 0.25}})
    logger.close()
    assert read_csv(tmp_path, logger) == [(0, "loss", 0.5), (1, "loss", 0.25)]
    assert repr(logger) == f"Logger(CsvSink({str(tmp_path / 'log.csv')!r}))"


def test_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="path"):
        ciclo.csv_logger(3)  # type: ignore[arg-type]
    pytest.importorskip("tensorboardX")
    with pytest.raises(TypeError, match="logdir"):
        ciclo.tensorboard(None)  # type: ignore[arg-type]
    pytest.importorskip("mlflow")
    with pytest.raises(TypeError, match="experiment_name"):
        ciclo.mlflow_logger("")
    pytest.importorskip("wandb")
    with pytest.raises(TypeError, match="not both"):
        ciclo.wandb_logger(run=object(), project="p")


def test_a_logger_reused_by_a_new_loop_is_refused_before_its_first_step(tmp_path: Path) -> None:
    logger = ciclo.csv_logger(tmp_path / "log.csv")
    history = train(logger, 0, 150)
    with pytest.raises(ValueError, match=r"already wrote steps up to 149, and this loop starts at step 0"):
        train(logger, 0, 150)
    # Going on counting from the earlier loop writes each step once.
    history_2 = train(logger, 150, STEPS)
    assert_same(read_csv(tmp_path, logger), expected(history, history_2), BACKENDS[1])


@pytest.mark.parametrize("backend_name", ["tensorboard", "csv"])
def test_the_saved_state_claims_only_rows_already_on_disk(backend_name: str, tmp_path: Path) -> None:
    backend = next(b for b in BACKENDS if b.name == backend_name)
    pytest.importorskip(backend.module)
    logger = backend.make(tmp_path)
    for step in range(400):  # a hand-written loop: rows reach the sink as they reach the host
        logger.write(step, ciclo.logs().add_metric("x", float(step)))
    claimed = logger.state_dict()["step"]
    assert claimed is not None and claimed >= 100
    # Read while the logger is still open, as the files are after a SIGKILL.
    on_disk = {step for step, _, _ in backend.read(tmp_path, logger)}
    assert set(range(claimed + 1)) <= on_disk
    logger.close()


@pytest.mark.parametrize("backend_name", ["tensorboard", "csv", "wandb", "mlflow"])
def test_a_run_killed_after_its_backup_then_resumed_holds_each_step_once(
    backend_name: str, tmp_path: Path
) -> None:
    backend = next(b for b in BACKENDS if b.name == backend_name)
    pytest.importorskip(backend.module)
    first = backend.make(tmp_path)
    history_1 = train(first, 0, 150)  # written on to step 149 ...
    saved = {**first.state_dict(), "step": 99}  # ... after a backup that claimed steps up to 99
    resumed = backend.make(tmp_path)
    resumed.load_state_dict(saved)
    history_2 = train(resumed, 100, STEPS)  # the resumed run computes steps 100-149 again
    want = [row for row in expected(history_1) if row[0] < 100] + expected(history_2)
    assert_same(backend.read(tmp_path, resumed), want, backend)


def test_rows_a_killed_wandb_client_never_wrote_are_written_again_from_the_history(tmp_path: Path) -> None:
    # W&B's client buffers rows: a run killed after its backup can hold fewer than the backup claims.
    backend = next(b for b in BACKENDS if b.name == "wandb")
    pytest.importorskip(backend.module)
    first = backend.make(tmp_path)
    history_1 = train(first, 0, 100)  # the run holds steps 0-99 ...
    saved = {**first.state_dict(), "step": 149}  # ... and the backup claims 0-149
    resumed = backend.make(tmp_path)
    resumed.load_state_dict(saved)
    assert resumed.state_dict()["step"] == 99  # what the run holds, read from its offline records
    history_2 = train(resumed, 100, STEPS)  # steps 100-149 come from the (restored) history
    assert_same(backend.read(tmp_path, resumed), expected(history_1, history_2), backend)


@pytest.mark.parametrize("backend_name", ["wandb", "mlflow"])
def test_a_backup_names_the_run_before_its_first_row(backend_name: str, tmp_path: Path) -> None:
    # A kill after the first backup and before the first row resumes that run, never starts another.
    backend = next(b for b in BACKENDS if b.name == backend_name)
    pytest.importorskip(backend.module)
    logger = backend.make(tmp_path)
    saved = logger.state_dict()  # a backup taken before any row reaches the logger
    assert saved["step"] is None and isinstance(saved["run_id"], str)
    resumed = backend.make(tmp_path)
    resumed.load_state_dict(saved)
    history = train(resumed, 0, 150)
    assert resumed.state_dict()["run_id"] == saved["run_id"]
    assert_same(backend.read(tmp_path, resumed), expected(history), backend)
    if backend_name == "wandb":
        assert len(log_readers.wandb_files(tmp_path / "wandb", saved["run_id"])) == 1
    else:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=mlflow_uri(tmp_path))
        experiment = client.get_experiment_by_name("ciclo")
        assert [run.info.run_id for run in client.search_runs([experiment.experiment_id])] == [
            saved["run_id"]
        ]


def test_a_resumed_online_wandb_run_writes_after_the_step_w_and_b_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wandb = pytest.importorskip("wandb")
    logged: list[int] = []

    class Run:  # what wandb.init(id=..., resume="allow") returns online for a run at step 120
        id, starting_step = "abc", 120
        settings = types.SimpleNamespace(mode="online")

        def log(self, scalars: Any, step: int, commit: bool) -> None:
            logged.append(step)

        def finish(self) -> None: ...

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(wandb, "init", lambda **kwargs: calls.append(kwargs) or Run())
    logger = ciclo.wandb_logger(project="ciclo")
    logger.load_state_dict({"step": 99, "run_id": "abc"})
    assert calls == [{"project": "ciclo", "id": "abc", "resume": "allow"}]
    train(logger, 100, 200)
    assert logged == list(range(120, 200))


# ----------------------------------------------------------------------------- hyperparameters

HPARAMS = {"learning_rate": 0.01, "batch_size": 32, "optimizer": "adam", "nesterov": False}


def read_hparams(backend: str, path: Path, logger: ciclo.types.Logger) -> dict[str, Any]:
    if backend == "tensorboard":
        return log_readers.tensorboard_hparams(path / "tb")
    if backend == "csv":
        return json.loads((path / "log.hparams.json").read_text())
    if backend == "wandb":
        log_readers.wait_for_wandb_exits(path / "wandb")
        return log_readers.wandb_config(path / "wandb")
    return log_readers.mlflow_params(mlflow_uri(path), logger.state_dict()["run_id"])


def test_hparams_are_written_once_and_read_back_by_each_backend(backend: Backend, tmp_path: Path) -> None:
    make = {
        "tensorboard": lambda: ciclo.tensorboard(tmp_path / "tb", hparams=HPARAMS),
        "csv": lambda: ciclo.csv_logger(tmp_path / "log.csv", hparams=HPARAMS),
        "wandb": lambda: wandb_logger(tmp_path, hparams=HPARAMS),
        "mlflow": lambda: ciclo.mlflow_logger("ciclo", tracking_uri=mlflow_uri(tmp_path), hparams=HPARAMS),
    }[backend.name]
    first = make()
    history_1 = train(first, 0, 150)
    resumed = make()  # a resumed run: the backend already holds the hparams
    resumed.load_state_dict(first.state_dict())
    history_2 = train(resumed, 150, STEPS)
    assert_same(backend.read(tmp_path, resumed), expected(history_1, history_2), backend)
    want = {
        "tensorboard": {**HPARAMS, "batch_size": 32.0},  # the hparams plugin keeps numbers as float64
        "csv": HPARAMS,
        "wandb": HPARAMS,
        "mlflow": {name: str(value) for name, value in HPARAMS.items()},  # MLflow keeps strings
    }[backend.name]
    assert read_hparams(backend.name, tmp_path, resumed) == want
    if backend.name == "tensorboard":  # the plugin's session start is in the first event file only
        first_file, *later = sorted((tmp_path / "tb").iterdir())
        assert later and all(b"_hparams_" not in file.read_bytes() for file in later)
        assert b"_hparams_/session_start_info" in first_file.read_bytes()


class Crash(Exception):
    pass


def csv_run(tmp_path: Path, hparams: dict[str, Any], crash_at: int | None = None) -> None:
    """A `ciclo.loop` of 8 steps backed up every 2 steps to `tmp_path / "backup"`, crashing at `crash_at`."""

    def step(state: int, batch: int, elapsed: ciclo.types.Elapsed) -> Any:
        if elapsed.steps == crash_at:
            raise Crash(f"killed at step {crash_at}")
        return ciclo.logs().add_loss("loss", 1.0 / (batch + 1)), state + 1

    logger = ciclo.csv_logger(tmp_path / "log.csv", hparams=hparams)
    ciclo.loop(
        0, range(8), {ciclo.every(1): [step, logger]}, backup=ciclo.backup(tmp_path / "backup", every=2)
    )


def test_a_resumed_csv_run_keeps_the_hparams_it_started_with(tmp_path: Path) -> None:
    with pytest.raises(Crash):
        csv_run(tmp_path, {"learning_rate": 0.1, "batch_size": 32}, crash_at=5)
    started = (tmp_path / "log.hparams.json").read_bytes()
    with pytest.warns(
        UserWarning, match=r"'learning_rate': 0.1 -> 0.2\).*kept .*log.hparams.json' as it was"
    ) as caught:
        csv_run(tmp_path, {"learning_rate": 0.2, "batch_size": 32})  # resumed at step 4
    assert len(caught) == 1 and "batch_size" not in str(caught[0].message)
    assert (tmp_path / "log.hparams.json").read_bytes() == started
    assert json.loads(started) == {"learning_rate": 0.1, "batch_size": 32}
    with open(tmp_path / "log.csv", newline="") as file:
        assert [int(row["step"]) for row in csv.DictReader(file)] == list(range(8))


def test_a_resumed_csv_run_with_the_same_hparams_says_nothing(tmp_path: Path) -> None:
    with pytest.raises(Crash):
        csv_run(tmp_path, {"learning_rate": 0.1}, crash_at=5)
    csv_run(tmp_path, {"learning_rate": 0.1})  # warnings are errors in the tests
    assert json.loads((tmp_path / "log.hparams.json").read_text()) == {"learning_rate": 0.1}


def test_metric_writer_logger_writes_hparams_before_the_first_rows(clu_interface: Any) -> None:
    interface, _ = clu_interface
    calls: list[Any] = []

    class Recorder(recorder_class(interface)):  # type: ignore[misc]
        def write_scalars(self, step: int, scalars: Any) -> None:
            calls.append(("scalars", step))

        def write_hparams(self, hparams: Any) -> None:
            calls.append(("hparams", dict(hparams)))

    train(ciclo.metric_writer_logger(Recorder(), hparams=HPARAMS), 0, 3)
    assert calls[:2] == [("hparams", HPARAMS), ("scalars", 0)]
    assert [call for call in calls if call[0] == "hparams"] == [("hparams", HPARAMS)]


@pytest.mark.parametrize(
    ("hparams", "error", "message"),
    [
        ([("lr", 0.1)], TypeError, r"hparams must be a dict of name -> number, string or bool, got \[\("),
        ({"": 1}, TypeError, "hparams names must be non-empty strings, got ''"),
        ({3: 1}, TypeError, "hparams names must be non-empty strings, got 3"),
        ({"layers": [64, 64]}, TypeError, r"hparams\['layers'\] must be a number, a string or a bool"),
        ({"schedule": None}, TypeError, r"hparams\['schedule'\] must be a number, a string or a bool"),
    ],
)
def test_bad_hparams_are_refused_when_the_logger_is_created(
    hparams: Any, error: type[Exception], message: str, tmp_path: Path
) -> None:
    with pytest.raises(error, match=message):
        ciclo.csv_logger(tmp_path / "log.csv", hparams=hparams)
    assert not list(tmp_path.glob("log*"))


def test_numpy_hparams_are_written_as_python_values(tmp_path: Path) -> None:
    hparams = {"learning_rate": np.float32(0.5), "layers": np.int64(2), "nesterov": False}
    train(ciclo.csv_logger(tmp_path / "log.csv", hparams=hparams), 0, 1)
    written = json.loads((tmp_path / "log.hparams.json").read_text())
    assert written == {"learning_rate": 0.5, "layers": 2, "nesterov": False}


def test_hparams_and_a_wandb_config_giving_the_same_name_are_refused() -> None:
    pytest.importorskip("wandb")
    with pytest.raises(ValueError, match=r"hparams and config= both give \['lr'\]"):
        ciclo.wandb_logger(project="p", config={"lr": 0.1}, hparams={"lr": 0.2})


@pytest.mark.parametrize("tail", [b"\x00\x00\x00\x00\x20\x00\x01" + b"\xff" * 32, b"\x01\x02\x03"])
def test_a_wandb_file_a_killed_service_left_half_written_is_read_up_to_its_last_whole_record(
    tail: bytes, tmp_path: Path
) -> None:
    pytest.importorskip("wandb")
    first = wandb_logger(tmp_path)
    train(first, 0, 100)
    (file,) = log_readers.wandb_files(tmp_path / "wandb", first.state_dict()["run_id"])
    log_readers.wait_for_wandb_exits(tmp_path / "wandb")
    with open(file, "ab") as out:  # a record that does not parse, or a torn header
        out.write(tail)
    resumed = wandb_logger(tmp_path)
    resumed.load_state_dict({**first.state_dict(), "step": 149})
    assert resumed.state_dict()["step"] == 99
    resumed.close()


@pytest.mark.parametrize(
    ("step", "scalars"),
    [
        (0, {}),
        (3, {"loss": 0.5, "accuracy": 1}),
        (2**40 + 7, {"ünïcode/tag": -1.25, "x" * 300: 2.0}),
        (-5, {"loss": float("inf")}),
        (12, {"huge": 1e300, "tiny": -1e300, "nan": float("nan")}),
    ],
)
def test_scalar_events_read_back_as_the_events_protobuf_writes(step: int, scalars: dict[str, float]) -> None:
    from tensorboardX.proto import event_pb2, summary_pb2

    from ciclo._src.callbacks._loggers._tensorboard import scalar_event

    def value(tag: str, x: float) -> Any:
        if math.isfinite(x) and abs(x) > 3.5e38:  # protobuf stores a float beyond float32 as infinity
            x = math.copysign(math.inf, x)
        return summary_pb2.Summary.Value(tag=tag, simple_value=x)

    summary = summary_pb2.Summary(value=[value(tag, x) for tag, x in scalars.items()])
    expected = event_pb2.Event(wall_time=1.5, step=step, summary=summary)
    # Equal messages (protobuf leaves out a step of 0, which scalar_event writes).
    assert event_pb2.Event.FromString(scalar_event(1.5, step, scalars)) == expected
