"""The hook vocabulary of the predefined loops, for a loop of your own: what each loop runs, and `collect`.

`TRAIN`, `TEST` and `PREDICT` are the names each loop runs (its tasks' keys, its state's methods
and its callbacks' methods); `collect` gathers the callbacks of a set of names. The hook names of
ciclo 0.1 are on `ciclo` (`ciclo.on_epoch_end`); the predict loop's, which 0.1 did not have, are here.

Example:
    >>> import ciclo
    >>> ciclo.on_epoch_end in ciclo.hooks.TRAIN, ciclo.on_epoch_end in ciclo.hooks.TEST
    (True, False)
    >>> ciclo.hooks.on_predict_step in ciclo.hooks.PREDICT
    True
"""

from ciclo._src.loops.hooks import PREDICT as PREDICT
from ciclo._src.loops.hooks import TEST as TEST
from ciclo._src.loops.hooks import TRAIN as TRAIN
from ciclo._src.loops.hooks import collect as collect
from ciclo._src.loops.hooks import on_predict_batch_begin as on_predict_batch_begin
from ciclo._src.loops.hooks import on_predict_batch_end as on_predict_batch_end
from ciclo._src.loops.hooks import on_predict_begin as on_predict_begin
from ciclo._src.loops.hooks import on_predict_end as on_predict_end
from ciclo._src.loops.hooks import on_predict_step as on_predict_step

__all__ = [
    "PREDICT",
    "TEST",
    "TRAIN",
    "collect",
    "on_predict_batch_begin",
    "on_predict_batch_end",
    "on_predict_begin",
    "on_predict_end",
    "on_predict_step",
]
