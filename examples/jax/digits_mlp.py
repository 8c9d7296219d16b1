"""Train a pure-JAX MLP on scikit-learn's bundled digits with `ciclo.loop`.

Run with `nox -s demo`, or `python examples/jax/digits_mlp.py` where ciclo-core
and scikit-learn are installed. Nothing is downloaded: the digits ship inside
scikit-learn.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import ciclo

Params = dict[str, dict[str, jax.Array]]


def load_data(seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The 1797 8x8 digits, scaled to [0, 1], split 80/20 into train and test."""
    digits = load_digits()
    images = (digits.images.reshape(len(digits.images), -1) / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(images))
    split = int(0.8 * len(images))
    train, test = order[:split], order[split:]
    return {"image": images[train], "label": labels[train]}, {"image": images[test], "label": labels[test]}


def batches(
    data: dict[str, np.ndarray], batch_size: int, *, seed: int | None
) -> Iterator[dict[str, np.ndarray]]:
    """Shuffled batches forever (seed) or one ordered pass (seed=None)."""
    size = len(data["label"])
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(size) if seed is not None else np.arange(size)
        for start in range(0, size - batch_size + 1, batch_size):
            index = order[start : start + batch_size]
            yield {key: value[index] for key, value in data.items()}
        if seed is None:
            return


def init_params(key: jax.Array, sizes: tuple[int, ...] = (64, 128, 10)) -> Params:
    params = {}
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        key, subkey = jax.random.split(key)
        params[f"dense_{i}"] = {
            "w": jax.random.normal(subkey, (fan_in, fan_out)) * jnp.sqrt(2.0 / fan_in),
            "b": jnp.zeros(fan_out),
        }
    return params


def apply(params: Params, images: jax.Array) -> jax.Array:
    x = images
    layers = list(params.values())
    for layer in layers[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ layers[-1]["w"] + layers[-1]["b"]


optimizer = optax.adam(1e-2)


def metrics(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    accuracy = jnp.mean(jnp.argmax(logits, -1) == labels)
    return loss, accuracy


@jax.jit
def train_step(state: dict[str, Any], batch: dict[str, jax.Array]) -> tuple[ciclo.Logs, dict[str, Any]]:
    def loss_fn(params: Params) -> tuple[jax.Array, jax.Array]:
        logits = apply(params, batch["image"])
        loss, accuracy = metrics(logits, batch["label"])
        return loss, accuracy

    (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
    updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
    state = {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}
    logs = ciclo.logs()
    logs.add_loss("loss", loss)
    logs.add_metric("accuracy", accuracy)
    return logs, state


@jax.jit
def test_step(state: dict[str, Any], batch: dict[str, jax.Array]) -> ciclo.Logs:
    loss, accuracy = metrics(apply(state["params"], batch["image"]), batch["label"])
    return ciclo.logs().add_loss("loss", loss).add_metric("accuracy", accuracy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    train, test = load_data()
    params = init_params(jax.random.key(0))
    state = {"params": params, "opt_state": optimizer.init(params)}
    steps_per_epoch = len(train["label"]) // args.batch_size
    logdir = tempfile.mkdtemp(prefix="ciclo-digits-")

    evaluate = ciclo.inner_loop(
        "test",
        lambda state: ciclo.test_loop(state, batches(test, 64, seed=None), {ciclo.on_test_step: [test_step]}),
        aggregation="mean",
    )
    state, history, elapsed = ciclo.loop(
        state,
        batches(train, args.batch_size, seed=0),
        {
            ciclo.every(1): [train_step],
            ciclo.after(steps_per_epoch - 1).every(steps_per_epoch): [
                evaluate,
                ciclo.checkpoint(logdir, monitor="accuracy_test", mode="max"),
            ],
            ciclo.every(1): [ciclo.keras_bar(total=args.steps)],
        },
        stop=ciclo.at(steps=args.steps),
    )

    _, test_history, _ = ciclo.test_loop(
        state, batches(test, 64, seed=None), {ciclo.on_test_step: [test_step]}
    )
    accuracy = float(np.mean(test_history.collect("accuracy")))
    best = ciclo.restore_checkpoint(logdir, state, step="best")
    _, best_history, _ = ciclo.test_loop(
        best, batches(test, 64, seed=None), {ciclo.on_test_step: [test_step]}
    )
    best_accuracy = float(np.mean(best_history.collect("accuracy")))
    print(f"trained {elapsed.steps} steps ({elapsed.samples} samples) in {elapsed.time:.1f}s")
    print(f"final test accuracy: {accuracy:.4f}")
    print(f"best checkpoint test accuracy: {best_accuracy:.4f} (restored from {logdir})")


if __name__ == "__main__":
    main()
