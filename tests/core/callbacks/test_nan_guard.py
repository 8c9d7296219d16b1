import logging

import jax.numpy as jnp
import numpy as np
import pytest

import ciclo


def nan_at(bad_step, *, host=False):
    """A train step whose loss turns NaN at `bad_step` (and stays NaN), like a diverged model."""

    def train_step(state, batch):
        finite = jnp.float32(1) / (jnp.asarray(batch, jnp.float32) + 1)
        loss = jnp.where(batch >= bad_step, jnp.float32(jnp.nan), finite)
        if host:
            loss = float(loss)
        return ciclo.logs().add_loss("loss", loss), state + 1

    return train_step


@pytest.mark.parametrize("check_every", [1, 3, 4, 10])
def test_stops_within_check_every_steps_and_names_step_and_entry(check_every, caplog):
    guard = ciclo.terminate_on_nan("loss", check_every=check_every)
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        _, history, elapsed = ciclo.loop(jnp.int32(0), jnp.arange(100), {ciclo.every(1): [nan_at(7), guard]})
    assert guard.step == 7 and guard.entry == "loss"
    # The check runs in the step that starts at a multiple of check_every, minus one.
    assert 7 < elapsed.steps <= 7 + check_every
    (record,) = caplog.records
    assert "'loss'" in record.getMessage() and "step 7" in record.getMessage()
    assert np.isnan(history.collect("loss")[7])


def test_no_host_copy_between_checks(monkeypatch):
    # Reading a device flag is what costs a sync: count the reads.
    from ciclo._src.callbacks import _nan_guard

    reads = []
    original = _nan_guard.TerminateOnNaN._read_pending

    def counting(self):
        reads.append(1)
        original(self)

    monkeypatch.setattr(_nan_guard.TerminateOnNaN, "_read_pending", counting)
    guard = ciclo.terminate_on_nan("loss", check_every=5)
    ciclo.loop(0, jnp.arange(20), {ciclo.every(1): [nan_at(100), guard]})
    assert len(reads) == 4 and guard.step is None


def test_host_values_are_checked_at_once():
    guard = ciclo.terminate_on_nan("loss", check_every=100)
    _, _, elapsed = ciclo.loop(0, np.arange(50), {ciclo.every(1): [nan_at(7, host=True), guard]})
    assert guard.step == 7 and elapsed.steps == 8


def test_a_nan_in_the_last_steps_is_reported_at_the_end(caplog):
    guard = ciclo.terminate_on_nan(["metrics.other", "losses.loss"], check_every=50)
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        _, _, elapsed = ciclo.loop(0, jnp.arange(10), {ciclo.every(1): [nan_at(8), guard]})
    assert elapsed.steps == 10 and guard.step == 8 and guard.entry == "losses.loss"
    assert "as the loop ended" in caplog.records[0].getMessage()


def test_infinite_and_stacked_values():
    def train_step(state, batch):
        values = jnp.array([1.0, jnp.inf]) if batch == 3 else jnp.ones(2)
        return ciclo.logs().add_metric("grad_norm", values), state

    guard = ciclo.terminate_on_nan("grad_norm", check_every=2)
    ciclo.loop(0, range(10), {ciclo.every(1): [train_step, guard]})
    assert guard.step == 3


def test_a_monitor_never_logged_is_an_error():
    guard = ciclo.terminate_on_nan("los", check_every=3)
    with pytest.raises(KeyError, match=r"\['los'\].*losses\.loss"):
        ciclo.loop(0, jnp.arange(10), {ciclo.every(1): [nan_at(100), guard]})


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({"monitor": ""}, TypeError), ({"monitor": 3}, TypeError), ({"check_every": 0}, ValueError)],
)
def test_bad_arguments(kwargs, error):
    with pytest.raises(error):
        ciclo.terminate_on_nan(**kwargs)


def test_checkpoints_keep_the_last_finite_state(tmp_path, caplog):
    # keep=1 and a loss that turns NaN at step 7: the checkpoint kept is the last finite one.
    ckpt = ciclo.checkpoint(tmp_path, keep=1)
    guard = ciclo.terminate_on_nan("loss", check_every=4)
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        ciclo.loop(
            jnp.int32(0),
            jnp.arange(100),
            {ciclo.every(1): [nan_at(7), ckpt, guard]},
        )
    assert ckpt.all_steps() == [7]  # the state after the step that starts at 6, whose loss was finite
    assert int(ckpt.restore(jnp.int32(0))) == 7
    assert any(
        "not saved" in record.getMessage() and "'loss'" in record.getMessage() for record in caplog.records
    )
