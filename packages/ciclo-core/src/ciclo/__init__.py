"""ciclo: functional training loops for JAX.

Example:
    >>> import ciclo
    >>> def train_step(state, batch):
    ...     return ciclo.logs().add_metric("batch", batch), state + batch
    >>> state, history, elapsed = ciclo.loop(0, range(100), {ciclo.every(1): [train_step]}, stop=10)
    >>> state, elapsed.steps
    (45, 10)
"""

from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

from ciclo import managed as managed
from ciclo import metrics as metrics
from ciclo import strategies as strategies
from ciclo._src import frameworks as _frameworks
from ciclo._src import installation as _installation
from ciclo._src.backup import Backup as Backup
from ciclo._src.backup import Preempted as Preempted
from ciclo._src.backup import backup as backup
from ciclo._src.batches import Stacked as Stacked
from ciclo._src.batches import stacked as stacked
from ciclo._src.callbacks._checkpoint import Checkpoint as Checkpoint
from ciclo._src.callbacks._checkpoint import checkpoint as checkpoint
from ciclo._src.callbacks._checkpoint import restore_checkpoint as restore_checkpoint
from ciclo._src.callbacks._early_stopping import EarlyStopping as EarlyStopping
from ciclo._src.callbacks._early_stopping import early_stopping as early_stopping
from ciclo._src.callbacks._inner_loop import InnerLoop as InnerLoop
from ciclo._src.callbacks._inner_loop import inner_loop as inner_loop
from ciclo._src.callbacks._keras_bar import KerasBar as KerasBar
from ciclo._src.callbacks._keras_bar import keras_bar as keras_bar
from ciclo._src.callbacks._loggers._base import Logger as Logger
from ciclo._src.callbacks._loggers._csv import csv_logger as csv_logger
from ciclo._src.callbacks._loggers._metric_writer import metric_writer_logger as metric_writer_logger
from ciclo._src.callbacks._loggers._mlflow import mlflow_logger as mlflow_logger
from ciclo._src.callbacks._loggers._tensorboard import tensorboard as tensorboard
from ciclo._src.callbacks._loggers._wandb import wandb_logger as wandb_logger
from ciclo._src.callbacks._nan_guard import TerminateOnNaN as TerminateOnNaN
from ciclo._src.callbacks._nan_guard import terminate_on_nan as terminate_on_nan
from ciclo._src.callbacks._noop import NoOp as NoOp
from ciclo._src.callbacks._noop import noop as noop
from ciclo._src.callbacks._profile import Profile as Profile
from ciclo._src.callbacks._profile import profile as profile
from ciclo._src.callbacks._throughput import Throughput as Throughput
from ciclo._src.callbacks._throughput import throughput as throughput
from ciclo._src.callbacks._tqdm_bar import TqdmBar as TqdmBar
from ciclo._src.callbacks._tqdm_bar import tqdm_bar as tqdm_bar
from ciclo._src.checks import DataWarning as DataWarning
from ciclo._src.elapsed import Elapsed as Elapsed
from ciclo._src.elapsed import Period as Period
from ciclo._src.elapsed import at as at
from ciclo._src.elapsed import elapse as elapse
from ciclo._src.fused import Fused as Fused
from ciclo._src.fused import fuse as fuse
from ciclo._src.logs import Entries as Entries
from ciclo._src.logs import History as History
from ciclo._src.logs import Logs as Logs
from ciclo._src.logs import LogsLike as LogsLike
from ciclo._src.logs import StackedLogs as StackedLogs
from ciclo._src.logs import history as history
from ciclo._src.logs import logs as logs
from ciclo._src.loop import Phase as Phase
from ciclo._src.loop import at_step_end as at_step_end
from ciclo._src.loop import loop as loop
from ciclo._src.loop import run_phases as run_phases
from ciclo._src.loop_state import LoopState as LoopState
from ciclo._src.loops import on_epoch_end as on_epoch_end
from ciclo._src.loops import on_predict_batch_begin as on_predict_batch_begin
from ciclo._src.loops import on_predict_batch_end as on_predict_batch_end
from ciclo._src.loops import on_predict_begin as on_predict_begin
from ciclo._src.loops import on_predict_end as on_predict_end
from ciclo._src.loops import on_predict_step as on_predict_step
from ciclo._src.loops import on_reset_step as on_reset_step
from ciclo._src.loops import on_test_batch_begin as on_test_batch_begin
from ciclo._src.loops import on_test_batch_end as on_test_batch_end
from ciclo._src.loops import on_test_begin as on_test_begin
from ciclo._src.loops import on_test_end as on_test_end
from ciclo._src.loops import on_test_step as on_test_step
from ciclo._src.loops import on_train_batch_begin as on_train_batch_begin
from ciclo._src.loops import on_train_batch_end as on_train_batch_end
from ciclo._src.loops import on_train_begin as on_train_begin
from ciclo._src.loops import on_train_end as on_train_end
from ciclo._src.loops import on_train_step as on_train_step
from ciclo._src.loops import predict_loop as predict_loop
from ciclo._src.loops import predict_step as predict_step
from ciclo._src.loops import reset_step as reset_step
from ciclo._src.loops import test_loop as test_loop
from ciclo._src.loops import test_step as test_step
from ciclo._src.loops import train_loop as train_loop
from ciclo._src.loops import train_step as train_step
from ciclo._src.metrics import Metric as Metric
from ciclo._src.model_state import ModelState as ModelState
from ciclo._src.model_state import create_model_state as create_model_state
from ciclo._src.reprs import short
from ciclo._src.schedules import After as After
from ciclo._src.schedules import Every as Every
from ciclo._src.schedules import Piecewise as Piecewise
from ciclo._src.schedules import ScheduleBase as ScheduleBase
from ciclo._src.schedules import after as after
from ciclo._src.schedules import always as always
from ciclo._src.schedules import every as every
from ciclo._src.schedules import never as never
from ciclo._src.schedules import piecewise as piecewise
from ciclo._src.strategies._registry import get_strategy as get_strategy
from ciclo._src.strategies._registry import register_strategy as register_strategy
from ciclo._src.strategies._registry import strategy_names as strategy_names
from ciclo._src.summary import summary as summary
from ciclo._src.types import Batch as Batch
from ciclo._src.types import CallbackOutput as CallbackOutput
from ciclo._src.types import Evaluable as Evaluable
from ciclo._src.types import LoopCallback as LoopCallback
from ciclo._src.types import ModelAdapter as ModelAdapter
from ciclo._src.types import Predictable as Predictable
from ciclo._src.types import Schedule as Schedule
from ciclo._src.types import State as State
from ciclo._src.types import StatefulCallback as StatefulCallback
from ciclo._src.types import Strategy as Strategy
from ciclo._src.types import SupportsToModel as SupportsToModel
from ciclo._src.types import Trainable as Trainable

__version__ = _version("ciclo-core")

# ciclo 0.1 (the distribution `ciclo`) installs this same package: warn if it is there too.
_installation.warn_if_old_ciclo_installed()

if TYPE_CHECKING:
    from collections.abc import Callable

    # Provided by the adapter packages (ciclo-flax, ciclo-haiku, ciclo-equinox), found by entry point.
    create_flax_state: Callable[..., ModelState]
    create_haiku_state: Callable[..., ModelState]
    create_equinox_state: Callable[..., ModelState]


def __getattr__(name: str) -> Any:
    """Resolves `ciclo.create_flax_state` and the other adapters' functions on first use."""
    if name.startswith("__"):
        raise AttributeError(f"module 'ciclo' has no attribute {short(name)}")
    value = _frameworks.resolve(name)
    globals()[name] = value
    return value


__all__ = [
    "After",
    "Backup",
    "Batch",
    "CallbackOutput",
    "Checkpoint",
    "DataWarning",
    "EarlyStopping",
    "Elapsed",
    "Entries",
    "Evaluable",
    "Every",
    "Fused",
    "History",
    "InnerLoop",
    "KerasBar",
    "Logger",
    "Logs",
    "LogsLike",
    "LoopCallback",
    "LoopState",
    "Metric",
    "ModelAdapter",
    "ModelState",
    "NoOp",
    "Period",
    "Phase",
    "Piecewise",
    "Predictable",
    "Preempted",
    "Profile",
    "Schedule",
    "ScheduleBase",
    "Stacked",
    "StackedLogs",
    "State",
    "StatefulCallback",
    "Strategy",
    "SupportsToModel",
    "TerminateOnNaN",
    "Throughput",
    "TqdmBar",
    "Trainable",
    "__version__",
    "after",
    "always",
    "at",
    "at_step_end",
    "backup",
    "checkpoint",
    "create_model_state",
    "csv_logger",
    "early_stopping",
    "elapse",
    "every",
    "fuse",
    "get_strategy",
    "history",
    "inner_loop",
    "keras_bar",
    "logs",
    "loop",
    "managed",
    "metric_writer_logger",
    "metrics",
    "mlflow_logger",
    "never",
    "noop",
    "on_epoch_end",
    "on_predict_batch_begin",
    "on_predict_batch_end",
    "on_predict_begin",
    "on_predict_end",
    "on_predict_step",
    "on_reset_step",
    "on_test_batch_begin",
    "on_test_batch_end",
    "on_test_begin",
    "on_test_end",
    "on_test_step",
    "on_train_batch_begin",
    "on_train_batch_end",
    "on_train_begin",
    "on_train_end",
    "on_train_step",
    "piecewise",
    "predict_loop",
    "predict_step",
    "profile",
    "register_strategy",
    "reset_step",
    "restore_checkpoint",
    "run_phases",
    "stacked",
    "strategies",
    "strategy_names",
    "summary",
    "tensorboard",
    "terminate_on_nan",
    "test_loop",
    "test_step",
    "throughput",
    "tqdm_bar",
    "train_loop",
    "train_step",
    "wandb_logger",
]
