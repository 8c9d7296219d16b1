"""The types of ciclo: the classes `ciclo`'s functions return, and the protocols the pieces meet through.

Example:
    >>> import ciclo
    >>> isinstance(ciclo.every(10), ciclo.types.Every), isinstance(ciclo.history(), ciclo.types.History)
    (True, True)
"""

from ciclo._src.base.batches import Stacked as Stacked
from ciclo._src.base.checks import DataWarning as DataWarning
from ciclo._src.base.checks import RecompileWarning as RecompileWarning
from ciclo._src.base.elapsed import Elapsed as Elapsed
from ciclo._src.base.elapsed import Period as Period
from ciclo._src.base.files import LinkError as LinkError
from ciclo._src.base.schedules import After as After
from ciclo._src.base.schedules import Every as Every
from ciclo._src.base.schedules import Piecewise as Piecewise
from ciclo._src.base.schedules import ScheduleBase as ScheduleBase
from ciclo._src.base.types import Batch as Batch
from ciclo._src.base.types import CallbackOutput as CallbackOutput
from ciclo._src.base.types import Evaluable as Evaluable
from ciclo._src.base.types import ModelAdapter as ModelAdapter
from ciclo._src.base.types import Predictable as Predictable
from ciclo._src.base.types import Schedule as Schedule
from ciclo._src.base.types import State as State
from ciclo._src.base.types import StatefulCallback as StatefulCallback
from ciclo._src.base.types import SupportsToModel as SupportsToModel
from ciclo._src.base.types import Trainable as Trainable
from ciclo._src.callbacks._checkpoint import Checkpoint as Checkpoint
from ciclo._src.callbacks._checkpoint import RestoreOptions as RestoreOptions
from ciclo._src.callbacks._device_stats import DeviceStats as DeviceStats
from ciclo._src.callbacks._early_stopping import EarlyStopping as EarlyStopping
from ciclo._src.callbacks._ema import SwapEMAWeights as SwapEMAWeights
from ciclo._src.callbacks._keras_bar import KerasBar as KerasBar
from ciclo._src.callbacks._loggers._base import Logger as Logger
from ciclo._src.callbacks._nan_guard import TerminateOnNaN as TerminateOnNaN
from ciclo._src.callbacks._noop import NoOp as NoOp
from ciclo._src.callbacks._profile import Profile as Profile
from ciclo._src.callbacks._throughput import Throughput as Throughput
from ciclo._src.callbacks._tqdm_bar import TqdmBar as TqdmBar
from ciclo._src.data.fused import Fused as Fused
from ciclo._src.engine.callback import LoopCallback as LoopCallback
from ciclo._src.engine.loop_state import LoopState as LoopState
from ciclo._src.engine.phases import Phase as Phase
from ciclo._src.logs.logs import Entries as Entries
from ciclo._src.logs.logs import History as History
from ciclo._src.logs.logs import Logs as Logs
from ciclo._src.logs.logs import LogsLike as LogsLike
from ciclo._src.logs.logs import StackedLogs as StackedLogs
from ciclo._src.loops.evaluation import InnerLoop as InnerLoop
from ciclo._src.loops.lr_find import LRFindResult as LRFindResult
from ciclo._src.loops.predefined import LoopSettings as LoopSettings
from ciclo._src.resume.backup import Backup as Backup
from ciclo._src.resume.backup import Preempted as Preempted
from ciclo._src.resume.goodput import Goodput as Goodput
from ciclo._src.resume.orbax_io import RestoreReport as RestoreReport
from ciclo._src.state.model_state import ModelState as ModelState
from ciclo._src.state.model_state import ModelStateSettings as ModelStateSettings
from ciclo._src.state.population import Population as Population
from ciclo._src.state.precision import LossScale as LossScale
from ciclo._src.state.precision import Precision as Precision
from ciclo._src.state.preflight import Preflight as Preflight

__all__ = [
    "After",
    "Backup",
    "Batch",
    "CallbackOutput",
    "Checkpoint",
    "DataWarning",
    "DeviceStats",
    "EarlyStopping",
    "Elapsed",
    "Entries",
    "Evaluable",
    "Every",
    "Fused",
    "Goodput",
    "History",
    "InnerLoop",
    "KerasBar",
    "LRFindResult",
    "LinkError",
    "Logger",
    "Logs",
    "LogsLike",
    "LoopCallback",
    "LoopSettings",
    "LoopState",
    "LossScale",
    "ModelAdapter",
    "ModelState",
    "ModelStateSettings",
    "NoOp",
    "Period",
    "Phase",
    "Piecewise",
    "Population",
    "Precision",
    "Predictable",
    "Preempted",
    "Preflight",
    "Profile",
    "RecompileWarning",
    "RestoreOptions",
    "RestoreReport",
    "Schedule",
    "ScheduleBase",
    "Stacked",
    "StackedLogs",
    "State",
    "StatefulCallback",
    "SupportsToModel",
    "SwapEMAWeights",
    "TerminateOnNaN",
    "Throughput",
    "TqdmBar",
    "Trainable",
]
