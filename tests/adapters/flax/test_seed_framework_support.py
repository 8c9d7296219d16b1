"""Seed 000's "Framework Support" snippets, as written, with synthetic MNIST-shaped data.

The snippets elide the rest of the model and the datasets; those are filled in
the smallest way that runs, and `mnist_like` stands in for TFDS MNIST.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import optax
from jax_metrics.losses import Crossentropy
from jax_metrics.metrics import Accuracy

import ciclo


def mnist_like(batch_size: int = 32, seed: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Endless TFDS-MNIST-shaped batches (`image`, `label`) whose label is readable from the image."""
    rng = np.random.default_rng(seed)
    while True:
        label = rng.integers(0, 10, size=batch_size)
        image = rng.integers(0, 20, size=(batch_size, 28, 28, 1)).astype(np.float32)
        image[np.arange(batch_size), label, :, 0] = 255.0
        yield {"image": image, "label": label.astype(np.int32)}


def create_state() -> ciclo.ModelState:
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
        losses={"loss": Crossentropy()},  # any Callable[..., jax.Array]
        metrics={"accuracy": Accuracy()},  # supports Callables, jax_metrics, or clu metrics
        strategy="jit",  # "data-parallel" or "eager"
    )
    return state


def get_test_dataset() -> list[dict[str, np.ndarray]]:
    return list(islice(mnist_like(seed=1), 4))


def test_seed_000_framework_support_train_loop(capsys) -> None:
    total_steps, steps_per_epoch = 150, 50
    train_dataset = mnist_like()
    state = create_state()

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


def test_seed_000_framework_support_manual_steps(capsys) -> None:
    state = create_state()
    train_dataset = islice(mnist_like(), 5)

    for batch in train_dataset:
        logs, state = state.train_step(batch)
        print(f"loss: {logs.losses.loss}")

    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 5 and all(line.startswith("loss: ") for line in printed)
    assert int(state.step) == 5
