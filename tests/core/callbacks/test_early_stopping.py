import jax.numpy as jnp
import pytest

import ciclo


def run(values, stopper, key="loss"):
    it = iter(values)

    def log(state):
        return ciclo.logs().add_metric(key, next(it)), state + 1

    return ciclo.loop(0, range(len(values)), {ciclo.every(1): [log, stopper]})


@pytest.mark.parametrize(
    ("values", "kwargs", "steps"),
    [
        ([5, 4, 3, 2, 1], {"patience": 0}, 5),
        ([1, 2, 3, 4, 5], {"patience": 0}, 2),
        ([1, 2, 3, 4, 5], {"patience": 2}, 4),
        ([1, 2, 3, 4, 5], {"patience": 0, "mode": "max"}, 5),
        ([1.0, 0.95, 0.9, 0.85], {"patience": 0, "min_delta": 0.1}, 2),
        ([3, 2, 1, 0.5], {"patience": 0, "baseline": 0.7}, 1),
        ([3, 2, 1, 1, 1, 1], {"patience": ciclo.at(steps=2)}, 5),
    ],
)
def test_stops_when_no_improvement(values, kwargs, steps):
    _, _, elapsed = run(values, ciclo.early_stopping("loss", **kwargs))
    assert elapsed.steps == steps


def test_restore_best_weights_and_device_values():
    stopper = ciclo.early_stopping("metrics.loss", patience=1, restore_best_weights=True)
    state, _, elapsed = run([jnp.float32(v) for v in [3.0, 1.0, 2.0, 2.5, 0.1]], stopper)
    assert elapsed.steps == 4 and stopper.stopped
    assert state == 2  # state after the best (second) step
    assert stopper.best == 1.0


def test_missing_monitor_names_present_entries():
    with pytest.raises(KeyError, match="'accuracy'.*metrics.loss"):
        run([1.0], ciclo.early_stopping("accuracy"))


def test_nan_is_never_an_improvement():
    _, _, elapsed = run([1.0, float("nan"), float("nan")], ciclo.early_stopping("loss", patience=0))
    assert elapsed.steps == 2


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"monitor": ""}, TypeError, "monitor"),
        ({"monitor": "a", "patience": -1}, ValueError, "-1"),
        ({"monitor": "a", "patience": 1.5}, ValueError, "1.5"),
        ({"monitor": "a", "mode": "minimize"}, ValueError, "'auto', 'min' or 'max', got 'minimize'"),
        ({"monitor": "a", "min_delta": -0.1}, ValueError, "-0.1"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        ciclo.early_stopping(**kwargs)


def test_monitor_must_be_scalar():
    with pytest.raises(ValueError, match="scalar"):
        run([jnp.ones(3)], ciclo.early_stopping("loss"))


def test_registers_on_epoch_end_in_train_loop():
    losses = iter([1.0, 2.0, 3.0, 4.0])

    def test_step(state, batch):
        return ciclo.logs().add_metric("loss", next(losses))

    stopper = ciclo.early_stopping("loss_test", patience=1)
    _, _, elapsed = ciclo.train_loop(
        0,
        range(100),
        {ciclo.on_test_step: [test_step]},
        callbacks=[stopper],
        test_dataset=lambda: [None],
        epoch_duration=5,
    )
    assert elapsed.steps == 15 and stopper.stopped


# --- restore_best_weights however the loop ends ------------------------------------------------------


def test_restore_best_weights_at_stop_without_firing():
    # Patience is never exhausted: the loop ends at `stop`, and still returns the best state.
    stopper = ciclo.early_stopping("loss", patience=10, restore_best_weights=True)
    losses = iter([3.0, 1.0, 2.0, 2.5, 2.7, 2.8])

    def log(state):
        return ciclo.logs().add_metric("loss", next(losses)), state + 1

    state, _, elapsed = ciclo.loop(0, range(100), {ciclo.every(1): [log, stopper]}, stop=6)
    assert elapsed.steps == 6 and not stopper.stopped
    assert state == 2  # the state after the second step, the best one


def test_restore_best_weights_when_the_dataset_runs_out_in_train_loop():
    losses = iter([2.0, 0.5, 1.0])

    def test_step(state, batch):
        return ciclo.logs().add_metric("loss", losses.__next__())

    def train_step(state, batch):
        return None, state + 1

    stopper = ciclo.early_stopping("loss_test", patience=5, restore_best_weights=True)
    state, _, elapsed = ciclo.train_loop(
        0,
        range(15),
        {"train_step": [train_step], ciclo.on_test_step: [test_step]},
        callbacks=[stopper],
        test_dataset=lambda: [None],
        epoch_duration=5,
    )
    assert elapsed.steps == 15 and not stopper.stopped
    assert state == 10  # the state at the end of the second epoch, where loss_test was best


def test_without_restore_best_weights_the_last_state_is_returned():
    stopper = ciclo.early_stopping("loss", patience=10)
    state, _, _ = run([3.0, 1.0, 2.0], stopper)
    assert state == 3


# --- mode="auto" --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("monitor", "mode"),
    [
        ("loss", "min"),
        ("loss_test", "min"),
        ("metrics.error_rate", "min"),
        ("accumulated_loss", "min"),
        ("accuracy", "max"),
        ("metrics.accuracy_test", "max"),
        ("val_acc", "max"),
        ("AUC", "max"),
        ("precision", "max"),
        ("recall_test", "max"),
        ("f1_score", "max"),
        ("top_5_accuracy", "max"),
        ("top5", "max"),
        ("mean_iou", "max"),
    ],
)
def test_auto_mode_from_the_name(monitor, mode):
    assert ciclo.early_stopping(monitor).mode == mode
    assert ciclo.early_stopping(monitor, mode="auto").mode == mode


def test_auto_mode_keeps_training_while_accuracy_rises():
    _, _, elapsed = run([0.1, 0.2, 0.3, 0.4], ciclo.early_stopping("accuracy", patience=0), key="accuracy")
    assert elapsed.steps == 4
    _, _, elapsed = run([0.4, 0.3, 0.2, 0.1], ciclo.early_stopping("accuracy", patience=0), key="accuracy")
    assert elapsed.steps == 2
