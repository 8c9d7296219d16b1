"""Seed 000's "Framework Support" snippets, as written, with synthetic MNIST-shaped data.

The snippets elide the rest of the model and the datasets; those are filled in
the smallest way that runs, and `mnist_like` (batches of 32) stands in for TFDS MNIST.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support.mnist import mnist_like
from support.optional import optional

import ciclo

BATCH_SIZE = 32

jax_metrics = optional("jax_metrics")

METRIC_LIBRARIES = ["jax_metrics"] if jax_metrics else ["callables"]
"""The snippet's loss and metric are from jax_metrics; where it is not installed, plain callables stand in."""


def loss_and_accuracy(library: str) -> tuple[object, object]:
    if library == "jax_metrics":
        assert jax_metrics is not None
        return jax_metrics.losses.Crossentropy(), jax_metrics.metrics.Accuracy()
    return optax.softmax_cross_entropy_with_integer_labels, lambda preds, target: preds.argmax(-1) == target


@pytest.fixture(params=METRIC_LIBRARIES)
def library(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "jax_metrics":
        # jax_metrics' losses divide a float32 sum by the int32 batch size, which strict dtype
        # promotion rejects.
        with jax.numpy_dtype_promotion("standard"):
            yield request.param
    else:
        yield request.param


def create_state(library: str) -> ciclo.types.ModelState:
    loss, accuracy = loss_and_accuracy(library)  # the snippet's Crossentropy() and Accuracy()
    model = nn.Sequential(
        [
            lambda x: x.reshape((x.shape[0], -1)) / 255.0,
            nn.Dense(128),
            nn.relu,
            nn.Dense(10),
        ]
    )
    state = ciclo.create_flax_state(
        model,
        inputs=jnp.empty((1, 28, 28, 1)),
        tx=optax.adamw(1e-3),
        losses={"loss": loss},  # any Callable[..., jax.Array]
        metrics={"accuracy": accuracy},  # supports Callables, jax_metrics, or clu metrics
        strategy="jit",  # "data-parallel" or "eager"
    )
    return state


def get_test_dataset() -> list[dict[str, np.ndarray]]:
    return list(islice(mnist_like(BATCH_SIZE, seed=1), 4))


def test_seed_000_framework_support_train_loop(capsys, library: str) -> None:
    total_steps, steps_per_epoch = 150, 50
    train_dataset = mnist_like(BATCH_SIZE)
    state = create_state(library)

    state, history, elapsed = ciclo.train_loop(
        state,  # methods are automatically registered
        train_dataset,
        callbacks=[ciclo.keras_bar(total=total_steps)],
        test_dataset=lambda: get_test_dataset(),
        epoch_duration=steps_per_epoch,
        stop=total_steps,
    )
    assert elapsed.steps == total_steps
    assert history.collect("accuracy_test")[-1] > 0.9
    assert "150/150" in capsys.readouterr().out


def test_seed_000_framework_support_manual_steps(capsys, library: str) -> None:
    state = create_state(library)
    train_dataset = islice(mnist_like(BATCH_SIZE), 5)

    for batch in train_dataset:
        logs, state = state.train_step(batch)
        print(f"loss: {logs.losses.loss}")

    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 5 and all(line.startswith("loss: ") for line in printed)
    assert int(state.step) == 5
