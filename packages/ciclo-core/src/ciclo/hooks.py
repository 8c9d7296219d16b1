"""The hook names of the predefined loops: tasks' keys, state methods and callback methods.

`TRAIN`, `TEST` and `PREDICT` are the names each loop runs; `collect` gathers their callbacks.

Example:
    >>> import ciclo
    >>> ciclo.hooks.on_epoch_end == ciclo.on_epoch_end == "on_epoch_end"
    True
    >>> "on_epoch_end" in ciclo.hooks.TRAIN, "on_epoch_end" in ciclo.hooks.TEST
    (True, False)
"""

from ciclo._src.engine.door import collect as collect
from ciclo._src.loops.hooks import PREDICT as PREDICT
from ciclo._src.loops.hooks import TEST as TEST
from ciclo._src.loops.hooks import TRAIN as TRAIN
from ciclo._src.loops.hooks import on_epoch_end as on_epoch_end
from ciclo._src.loops.hooks import on_predict_batch_begin as on_predict_batch_begin
from ciclo._src.loops.hooks import on_predict_batch_end as on_predict_batch_end
from ciclo._src.loops.hooks import on_predict_begin as on_predict_begin
from ciclo._src.loops.hooks import on_predict_end as on_predict_end
from ciclo._src.loops.hooks import on_predict_step as on_predict_step
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
from ciclo._src.loops.hooks import predict_step as predict_step
from ciclo._src.loops.hooks import reset_step as reset_step
from ciclo._src.loops.hooks import test_step as test_step
from ciclo._src.loops.hooks import train_step as train_step

__all__ = [
    "PREDICT",
    "TEST",
    "TRAIN",
    "collect",
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
    "predict_step",
    "reset_step",
    "test_step",
    "train_step",
]
