"""The code snippets of seeds 000-002 (ciclo's READMEs and guide) that need no framework.

Each test keeps the snippet as written; only the data (tiny synthetic MNIST-shaped
batches instead of TFDS), the step counts, and the model (pure JAX instead of
flax) differ.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
import pytest
from support.mnist import mnist_like

import ciclo


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """A pure-JAX stand-in for flax's TrainState, as the guide suggests for any framework."""

    params: Any
    opt_state: Any
    step: jax.Array
    apply_fn: Callable[..., jax.Array] = dataclasses.field(metadata={"static": True})
    tx: optax.GradientTransformation = dataclasses.field(metadata={"static": True})

    @classmethod
    def create(cls, *, apply_fn, params, tx):
        return cls(params, tx.init(params), jnp.array(0), apply_fn, tx)

    def apply_gradients(self, *, grads):
        updates, opt_state = self.tx.update(grads, self.opt_state, self.params)
        return dataclasses.replace(
            self, params=optax.apply_updates(self.params, updates), opt_state=opt_state, step=self.step + 1
        )


def classifier_apply(variables, x):
    x = x / 255.0
    x = x.reshape((x.shape[0], -1))
    return x @ variables["params"]["w"] + variables["params"]["b"][None, :]


def create_state():
    params = {"w": jnp.zeros((28 * 28, 10)), "b": jnp.zeros(10)}
    return TrainState.create(apply_fn=classifier_apply, params=params, tx=optax.adamw(1e-3))


@jax.jit
def train_step(state: TrainState, batch):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, batch["image"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=batch["label"]).mean()
        return loss, logits

    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    state = state.apply_gradients(grads=grads)
    # log metrics
    logs = ciclo.logs()
    logs.add_metric("loss", loss)
    logs.add_metric("accuracy", jnp.mean(jnp.argmax(logits, -1) == batch["label"]))
    return logs, state


@jax.jit
def test_step(state: TrainState, batch):
    logits = state.apply_fn({"params": state.params}, batch["image"])
    logs = ciclo.logs()
    logs.add_metric("accuracy", jnp.mean(jnp.argmax(logits, -1) == batch["label"]))
    logs.add_metric("loss", optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean())
    return logs, state


test_step.__test__ = False  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    # The snippets checkpoint to the relative path "logdir/...".
    monkeypatch.chdir(tmp_path)


def test_seed_000_loop_language(capsys):
    total_steps = 100
    state = create_state()  # initial state
    dataset = mnist_like()

    state, history, elapsed = ciclo.loop(
        state,  # Pytree
        dataset,  # Iterable[Batch]
        {  # Schedule: List[Callback]
            ciclo.every(1): [train_step],
            ciclo.every(steps=10): [ciclo.checkpoint("logdir/model")],
            ciclo.every(1): [ciclo.keras_bar(total=total_steps)],
        },
        stop=ciclo.at(total_steps),
    )
    assert elapsed.steps == total_steps
    assert "100/100" in capsys.readouterr().out
    assert history.collect("accuracy")[-1] > 0.5
    restored = ciclo.restore_checkpoint("logdir/model", state)
    assert int(restored.step) == 91  # the last save: at step 90, after 91 updates


def test_seed_000_predefined_train_loop(capsys):
    total_steps = 60
    steps_per_epoch = 20
    state = create_state()
    train_dataset = mnist_like()
    some_callback_steps = []

    def some_callback(state, batch, elapsed):
        some_callback_steps.append(elapsed.steps)

    def get_test_dataset():
        return [next(mnist_like(seed=1)) for _ in range(3)]

    state, history, elapsed = ciclo.train_loop(
        state,  # Pytree
        train_dataset,  # Iterable[Batch]
        {  # Schedule: List[Callback]
            ciclo.on_train_step: [train_step],  # named schedules
            ciclo.on_test_step: [test_step],  # named schedules
            ciclo.every(20): [some_callback],  # regular schedules also supported
        },
        test_dataset=lambda: get_test_dataset(),  # lazy test dataset definition
        epoch_duration=steps_per_epoch,
        callbacks=[
            # callback self-registration
            ciclo.keras_bar(total=total_steps),  # runs on ciclo.on_train_batch_end
            ciclo.checkpoint("logdir/model"),  # runs on ciclo.on_epoch_end
        ],
        stop=total_steps,
    )
    assert elapsed.steps == total_steps
    assert some_callback_steps == [0, 20, 40]
    steps, accuracy_test = history.collect("steps", "accuracy_test")
    assert steps == [19, 39, 59] and accuracy_test[-1] > 0.5
    checkpointer = ciclo.checkpoint("logdir/model", keep=None)
    assert checkpointer.all_steps() == [60]  # keep=1 kept the last epoch's, saved at its end
    assert "accuracy_test" in capsys.readouterr().out


@pytest.mark.parametrize("seed_variant", ["000", "002"])
def test_seed_manual_iteration(seed_variant, capsys):
    total_steps = 50
    state = create_state()
    train_dataset = mnist_like()

    call_checkpoint = ciclo.every(steps=20)  # Schedule
    checkpoint = ciclo.checkpoint("logdir/model")  # Callback
    keras_bar = ciclo.keras_bar(total=total_steps)  # Callback
    history = ciclo.history()  # History
    stop = total_steps if seed_variant == "000" else ciclo.at(total_steps)  # Period
    # (Elapsed, Batch)
    for elapsed, batch in ciclo.elapse(train_dataset, stop=stop):
        logs = ciclo.logs()  # Logs
        # update logs and state
        logs.updates, state = train_step(state, batch)
        # periodically checkpoint state
        if call_checkpoint(elapsed):
            checkpoint(elapsed, state)  # serialize state

        keras_bar(elapsed, logs)  # update progress bar
        history.commit(elapsed, logs)  # commit logs to history
    checkpoint.wait()

    assert len(history) == total_steps
    # Saved in the step that starts at 40: numbered with the steps done once it ran, 41.
    assert checkpoint.all_steps() == [41]
    assert f"{total_steps}/{total_steps}" in capsys.readouterr().out


def test_seed_001_training_loop_and_python_loop(capsys):
    total_steps = 40
    state = create_state()
    dataset = mnist_like()

    state, history, elapsed = ciclo.loop(
        state,
        dataset,
        {
            ciclo.every(1): [train_step],
            ciclo.every(steps=10): [ciclo.checkpoint("logdir/my-model")],
            ciclo.every(1): [ciclo.keras_bar(total=total_steps)],
        },
        stop=ciclo.at(steps=total_steps),
    )
    assert elapsed.steps == total_steps

    # Python Training Loop
    call_checkpoint = ciclo.every(steps=10)
    checkpoint = ciclo.checkpoint("logdir/my-model-manual")
    keras_bar = ciclo.keras_bar(total=total_steps)
    end_period = ciclo.at(steps=total_steps)
    history = ciclo.history()

    for elapsed, batch in ciclo.elapse(dataset):
        logs = ciclo.logs()
        logs.updates, state = train_step(state, batch)

        if call_checkpoint(elapsed):
            checkpoint(elapsed, state)

        keras_bar(elapsed, logs)
        history.commit(elapsed, logs)
        if elapsed >= end_period:
            break
    checkpoint.wait()
    assert len(history) == total_steps + 1  # this form checks the period after the step
    assert checkpoint.latest_step() == 41  # the state after the step that starts at 40


def test_seed_001_callback_signatures():
    # def f([state, batch, elapsed, loop_state]) -> (logs | None, state | None) | logs | state | None
    def f0():
        return None

    def f1(state):
        return state

    def f2(state, batch):
        return {"metrics": {"b": batch}}

    def f3(state, batch, elapsed):
        return ciclo.logs().add_metric("steps", elapsed.steps), None

    def f4(state, batch, elapsed, loop_state):
        return None, state + 1

    state, history, _ = ciclo.loop(0, [10, 20], {ciclo.every(1): [f0, f1, f2, f3, f4]})
    assert state == 2
    assert history.collect("b", "metrics.steps") == ([10, 20], [0, 1])


def test_seed_002_guide_loop_and_collect():
    total_steps = 50
    state = create_state()
    ds_train = mnist_like()

    state, history, elapsed = ciclo.loop(
        state,  # State
        ds_train,  # Iterable[Batch]
        {
            # Schedule: List[Callback]
            ciclo.every(1): [train_step],
            ciclo.every(steps=1000): [ciclo.checkpoint("logdir/model")],
            ciclo.every(1): [ciclo.keras_bar(total=total_steps)],
        },
        stop=ciclo.at(total_steps),  # Period
    )

    # collect metric values
    steps, losses, accuracies = history.collect("steps", "loss", "accuracy")
    assert steps == list(range(total_steps))
    assert losses[-1] < losses[0]
    assert all(isinstance(value, float) for value in accuracies)
    with pytest.raises(KeyError):
        history.collect("precision")
