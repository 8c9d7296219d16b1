"""`ciclo.mlflow_logger`: logs to an MLflow run through `MlflowClient`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, final

from ciclo._src.base.reprs import short
from ciclo._src.callbacks._loggers._base import HParams, Logger, Row, Sink, checked_hparams, import_extra

_BATCH = 1000  # the most metric values MLflow takes in one `log_batch` call


@final
class MlflowSink(Sink):
    """Logs rows to an MLflow run with `MlflowClient.log_batch`; see `ciclo.mlflow_logger`."""

    def __init__(
        self,
        experiment_name: str,
        run_name: str | None,
        tracking_uri: str | None,
        run_id: str | None,
        tags: Mapping[str, str] | None,
        hparams: HParams,
    ) -> None:
        self._mlflow = import_extra("mlflow", "mlflow", "ciclo.mlflow_logger")
        self._hparams = hparams  # logged as the run's params when it is first opened
        self._experiment_name = experiment_name
        self._run_name = run_name
        self._tracking_uri = tracking_uri
        self._tags = dict(tags or {})
        self.run_id = run_id
        self._owned = run_id is None  # a run the sink created: it marks it finished when closed
        self._client: Any = None
        self._active = False
        self._resumed = False  # restored: the run's own newest step decides what is written again
        self._skip_through: dict[str, int] = {}  # per metric, the newest step the run already holds

    def _open(self) -> Any:
        client = self._client
        if client is None:
            client = self._client = self._mlflow.tracking.MlflowClient(tracking_uri=self._tracking_uri)
        if self.run_id is None:
            experiment = client.get_experiment_by_name(self._experiment_name)
            experiment_id = (
                client.create_experiment(self._experiment_name)
                if experiment is None
                else experiment.experiment_id
            )
            run = client.create_run(experiment_id, run_name=self._run_name, tags=self._tags)
            self.run_id = run.info.run_id
        elif self._owned:
            client.update_run(self.run_id, status="RUNNING")  # written again: a resumed run
        if self._hparams:  # MLflow keeps params as strings, and refuses to change one
            params = [self._mlflow.entities.Param(name, str(value)) for name, value in self._hparams.items()]
            client.log_batch(self.run_id, params=params, synchronous=True)
            self._hparams = {}
        if self._resumed:
            # MLflow deletes no single metric value: the steps a killed run logged after its backup
            # stay, and the resumed run skips them, so the run holds each step once.
            metrics = client.get_run(self.run_id).data.metrics
            self._skip_through = {
                name: max(m.step for m in client.get_metric_history(self.run_id, name)) for name in metrics
            }
            self._resumed = False
        self._active = True
        return client

    def write(self, rows: Sequence[Row]) -> None:
        client = self._client if self._active else self._open()
        metric, held = self._mlflow.entities.Metric, self._skip_through
        metrics = [
            metric(name, float(value), int(row.wall_time * 1000), row.step)
            for row in rows
            for name, value in row.scalars.items()
            if row.step > held.get(name, -1)
        ]
        for start in range(0, len(metrics), _BATCH):
            client.log_batch(self.run_id, metrics=metrics[start : start + _BATCH], synchronous=True)

    def flush(self) -> None:
        """Creates the run if no row has yet: a backup (taken after a flush) names the run its rows go to."""
        if self.run_id is None:
            self._open()

    def close(self) -> None:
        if self._active and self._owned:
            self._client.set_terminated(self.run_id)
        self._active = False

    def state(self) -> dict[str, Any]:
        return {"run_id": self.run_id}

    def restore(self, state: Mapping[str, Any], after_step: int | None) -> None:
        run_id = state.get("run_id")
        if run_id is not None:
            self.run_id = str(run_id)
            self._active = False
            self._resumed = True
            self._hparams = {}  # logged when the run was created

    def __repr__(self) -> str:
        return f"MlflowSink(run_id={self.run_id!r})"


def mlflow_logger(
    experiment_name: str = "Default",
    *,
    run_name: str | None = None,
    tracking_uri: str | None = None,
    run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
    hparams: Mapping[str, Any] | None = None,
) -> Logger:
    """A logger that writes every scalar entry to an MLflow run, at its step.

    Needs MLflow (`pip install "ciclo-core[mlflow]"`); it uses its own `MlflowClient`,
    leaving `mlflow.start_run`'s active run alone. See docs/logging.md, "MLflow".

    Args:
        experiment_name: the experiment of the new run (created if missing).
        run_name: the new run's name (MLflow picks one if None).
        tracking_uri: where runs are tracked; None uses `MLFLOW_TRACKING_URI`.
        run_id: log to this existing run instead of creating one (left running).
        tags: tags of the new run.
        hparams: the run's hyperparameters, logged as its params.
    """
    if not isinstance(experiment_name, str) or not experiment_name:
        raise TypeError(f"experiment_name must be a non-empty string, got {short(experiment_name)}")
    return Logger(MlflowSink(experiment_name, run_name, tracking_uri, run_id, tags, checked_hparams(hparams)))
