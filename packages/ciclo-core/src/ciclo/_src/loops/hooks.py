"""The hook vocabulary: the names predefined loops run callbacks under (`ciclo.on_*`, `ciclo.hooks`)."""

from __future__ import annotations

from typing import Final

on_train_step: Final = "on_train_step"
train_step: Final = "train_step"
on_reset_step: Final = "on_reset_step"
reset_step: Final = "reset_step"
on_train_begin: Final = "on_train_begin"
on_train_end: Final = "on_train_end"
on_epoch_end: Final = "on_epoch_end"
on_train_batch_begin: Final = "on_train_batch_begin"
on_train_batch_end: Final = "on_train_batch_end"
on_test_step: Final = "on_test_step"
test_step: Final = "test_step"
on_test_batch_begin: Final = "on_test_batch_begin"
on_test_batch_end: Final = "on_test_batch_end"
on_test_begin: Final = "on_test_begin"
on_test_end: Final = "on_test_end"
on_predict_step: Final = "on_predict_step"
predict_step: Final = "predict_step"
on_predict_batch_begin: Final = "on_predict_batch_begin"
on_predict_batch_end: Final = "on_predict_batch_end"
on_predict_begin: Final = "on_predict_begin"
on_predict_end: Final = "on_predict_end"

# What each predefined loop understands; the order is only that of error messages.
TRAIN: Final = (
    on_train_step,
    train_step,
    on_reset_step,
    reset_step,
    on_train_begin,
    on_train_end,
    on_epoch_end,
    on_train_batch_begin,
    on_train_batch_end,
)
TEST: Final = (
    on_test_step,
    test_step,
    on_reset_step,
    reset_step,
    on_test_batch_begin,
    on_test_batch_end,
    on_test_begin,
    on_test_end,
)
PREDICT: Final = (
    on_predict_step,
    predict_step,
    on_predict_batch_begin,
    on_predict_batch_end,
    on_predict_begin,
    on_predict_end,
)
