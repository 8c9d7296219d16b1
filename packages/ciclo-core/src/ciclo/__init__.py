"""ciclo: functional training loops for JAX.

Example:
    >>> import ciclo
    >>> def train_step(state, batch):
    ...     return ciclo.logs().add_metric("batch", batch), state + batch
    >>> state, history, elapsed = ciclo.loop(0, range(100), {ciclo.every(1): [train_step]}, stop=10)
    >>> state, elapsed.steps
    (45, 10)
"""

import typing as _typing
import warnings as _warnings
from importlib.metadata import version as _version

from ciclo import hooks as hooks
from ciclo import managed as managed
from ciclo import metrics as metrics
from ciclo import strategies as strategies
from ciclo import testing as testing
from ciclo import types as types
from ciclo._src.base import frameworks as _frameworks
from ciclo._src.base import installation as _installation
from ciclo._src.base.batches import stacked as stacked
from ciclo._src.base.elapsed import at as at
from ciclo._src.base.elapsed import elapse as elapse
from ciclo._src.base.reprs import short as _short
from ciclo._src.base.schedules import after as after
from ciclo._src.base.schedules import always as always
from ciclo._src.base.schedules import at_step_end as at_step_end
from ciclo._src.base.schedules import every as every
from ciclo._src.base.schedules import never as never
from ciclo._src.base.schedules import piecewise as piecewise
from ciclo._src.callbacks._checkpoint import checkpoint as checkpoint
from ciclo._src.callbacks._checkpoint import restore_checkpoint as restore_checkpoint
from ciclo._src.callbacks._device_stats import device_stats as device_stats
from ciclo._src.callbacks._early_stopping import early_stopping as early_stopping
from ciclo._src.callbacks._ema import swap_ema_weights as swap_ema_weights
from ciclo._src.callbacks._follow import follow_checkpoints as follow_checkpoints
from ciclo._src.callbacks._keras_bar import keras_bar as keras_bar
from ciclo._src.callbacks._loggers._csv import csv_logger as csv_logger
from ciclo._src.callbacks._loggers._metric_writer import metric_writer_logger as metric_writer_logger
from ciclo._src.callbacks._loggers._mlflow import mlflow_logger as mlflow_logger
from ciclo._src.callbacks._loggers._tensorboard import tensorboard as tensorboard
from ciclo._src.callbacks._loggers._wandb import wandb_logger as wandb_logger
from ciclo._src.callbacks._nan_guard import terminate_on_nan as terminate_on_nan
from ciclo._src.callbacks._noop import noop as noop
from ciclo._src.callbacks._optuna import optuna_trials as optuna_trials
from ciclo._src.callbacks._profile import profile as profile
from ciclo._src.callbacks._prune import prune as prune
from ciclo._src.callbacks._recompiles import watch_recompiles as watch_recompiles
from ciclo._src.callbacks._throughput import step_flops as step_flops
from ciclo._src.callbacks._throughput import throughput as throughput
from ciclo._src.callbacks._tqdm_bar import tqdm_bar as tqdm_bar
from ciclo._src.callbacks._watchdog import watchdog as watchdog
from ciclo._src.data.arrays import batches as batches
from ciclo._src.data.fused import fuse as fuse
from ciclo._src.data.prefetch import prefetch_to_device as prefetch_to_device
from ciclo._src.engine.callback import Callback as Callback
from ciclo._src.engine.phases import run_phases as run_phases
from ciclo._src.logs.logs import history as history
from ciclo._src.logs.logs import logs as logs
from ciclo._src.loops.evaluation import inner_loop as inner_loop
from ciclo._src.loops.hooks import on_epoch_end as on_epoch_end
from ciclo._src.loops.hooks import on_reset_step as on_reset_step
from ciclo._src.loops.hooks import on_test_batch_begin as on_test_batch_begin
from ciclo._src.loops.hooks import on_test_batch_end as on_test_batch_end
from ciclo._src.loops.hooks import on_test_begin as on_test_begin
from ciclo._src.loops.hooks import on_test_end as on_test_end
from ciclo._src.loops.hooks import on_test_step as on_test_step
from ciclo._src.loops.hooks import on_train_batch_begin as on_train_batch_begin
from ciclo._src.loops.hooks import on_train_batch_end as on_train_batch_end
from ciclo._src.loops.hooks import on_train_begin as on_train_begin
from ciclo._src.loops.hooks import on_train_end as on_train_end
from ciclo._src.loops.hooks import on_train_step as on_train_step
from ciclo._src.loops.lr_find import lr_find as lr_find
from ciclo._src.loops.predefined import loop as loop
from ciclo._src.loops.predefined import predict_loop as predict_loop
from ciclo._src.loops.predefined import test_loop as test_loop
from ciclo._src.loops.predefined import train_loop as train_loop
from ciclo._src.resume.backup import backup as backup
from ciclo._src.resume.goodput import goodput as goodput
from ciclo._src.state.export import export as export
from ciclo._src.state.export import load_exported as load_exported
from ciclo._src.state.model_state import create_model_state as create_model_state
from ciclo._src.state.population import population as population
from ciclo._src.state.preflight import preflight as preflight
from ciclo._src.state.summary import summary as summary
from ciclo._src.state.training_options import SpikeGuard as SpikeGuard

__version__ = _version("ciclo-core")

# ciclo 0.1 (the distribution `ciclo`) installs this same package: warn if it is there too.
_installation.warn_if_old_ciclo_installed()

if _typing.TYPE_CHECKING:
    from collections.abc import Callable

    from ciclo._src.state.model_state import ModelState

    # Provided by the adapter packages (ciclo-flax, ciclo-haiku, ciclo-equinox), found by entry point.
    create_flax_state: Callable[..., ModelState]
    create_haiku_state: Callable[..., ModelState]
    create_equinox_state: Callable[..., ModelState]


# Names ciclo 0.1.9 exported from `ciclo` that now live in a namespace.
_MOVED: dict[str, str] = dict.fromkeys(
    ("Elapsed", "History", "LoopState", "Logs", "Period"), "types"
) | dict.fromkeys(
    ("DataParallel", "Eager", "JIT", "Strategy", "get_strategy", "register_strategy"), "strategies"
)


def __getattr__(name: str) -> _typing.Any:
    """Resolves the adapters' `create_*_state` on first use, and 0.1's moved names (deprecated)."""
    if name in _MOVED:
        namespace = _MOVED[name]
        _warnings.warn(
            f"ciclo.{name} is now ciclo.{namespace}.{name} (docs/migration.md, 'Names that moved'); "
            "the old name will be removed in a future release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(globals()[namespace], name)
    if name.startswith("__"):
        raise AttributeError(f"module 'ciclo' has no attribute {_short(name)}")
    value = _frameworks.resolve(name)
    globals()[name] = value
    return value


__all__ = [
    "Callback",
    "SpikeGuard",
    "__version__",
    "after",
    "always",
    "at",
    "at_step_end",
    "backup",
    "batches",
    "checkpoint",
    "create_model_state",
    "csv_logger",
    "device_stats",
    "early_stopping",
    "elapse",
    "every",
    "export",
    "follow_checkpoints",
    "fuse",
    "goodput",
    "history",
    "hooks",
    "inner_loop",
    "keras_bar",
    "load_exported",
    "logs",
    "loop",
    "lr_find",
    "managed",
    "metric_writer_logger",
    "metrics",
    "mlflow_logger",
    "never",
    "noop",
    "on_epoch_end",
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
    "optuna_trials",
    "piecewise",
    "population",
    "predict_loop",
    "prefetch_to_device",
    "preflight",
    "profile",
    "prune",
    "restore_checkpoint",
    "run_phases",
    "stacked",
    "step_flops",
    "strategies",
    "summary",
    "swap_ema_weights",
    "tensorboard",
    "terminate_on_nan",
    "test_loop",
    "testing",
    "throughput",
    "tqdm_bar",
    "train_loop",
    "types",
    "wandb_logger",
    "watch_recompiles",
    "watchdog",
]
