"""Train a plain-JAX MLP on scikit-learn's bundled digits through a `ciclo.types.ModelAdapter` of its own.

Run with `python examples/jax/digits_mlp.py` where `ciclo-core[checkpoint]`
(orbax) and scikit-learn are installed. Nothing is downloaded: the digits ship
inside scikit-learn.

The model is three functions of plain JAX, made a `ciclo.types.ModelAdapter` by a
class with `init` and `apply` (and `to_model`, which gives the trained model
back as a function). `ciclo.create_model_state` turns it into a training state
whose steps `ciclo.train_loop` runs: the model is evaluated on the test set
after each epoch, the checkpoint with the best test accuracy is kept and
restored at the end, and `best.model` is run on the test set. The script exits
with an error when the final test accuracy is under `--min-accuracy`.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import ciclo

Params = dict[str, dict[str, jax.Array]]


def load_data(seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The 1797 8x8 digits, flattened and scaled to [0, 1], split 80/20 into train and test."""
    digits = load_digits()
    images = (digits.images.reshape(len(digits.images), -1) / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(images))
    split = int(0.8 * len(images))
    train, test = order[:split], order[split:]
    # ciclo.types.ModelState reads a mapping batch's "inputs" and "target".
    return (
        {"inputs": images[train], "target": labels[train]},
        {"inputs": images[test], "target": labels[test]},
    )


def batches(
    data: dict[str, np.ndarray], batch_size: int, *, seed: int | None
) -> Iterator[dict[str, np.ndarray]]:
    """Shuffled full batches forever (seed), or one ordered pass over every sample (seed=None)."""
    size = len(data["target"])
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(size) if seed is not None else np.arange(size)
        # Training takes full batches only; the test pass keeps the last, smaller one (one more compile).
        stop = size - batch_size + 1 if seed is not None else size
        for start in range(0, stop, batch_size):
            index = order[start : start + batch_size]
            yield {key: value[index] for key, value in data.items()}
        if seed is None:
            return


def dense(key: jax.Array, fan_in: int, fan_out: int) -> dict[str, jax.Array]:
    return {"w": jax.random.normal(key, (fan_in, fan_out)) * jnp.sqrt(2.0 / fan_in), "b": jnp.zeros(fan_out)}


def forward(params: Params, images: jax.Array, mean: jax.Array, var: jax.Array) -> jax.Array:
    """The MLP in evaluation: batch norm with the running statistics `mean` and `var`."""
    h = images @ params["hidden"]["w"] + params["hidden"]["b"]
    h = jax.nn.relu((h - mean) / jnp.sqrt(var + 1e-5))
    return h @ params["out"]["w"] + params["out"]["b"]


@dataclasses.dataclass(frozen=True, eq=False)  # hashable: the adapter is a static field of the state
class MLP:
    """A `ciclo.types.ModelAdapter`: an MLP with batch norm and dropout, in plain JAX."""

    hidden: int = 128
    classes: int = 10
    dropout: float = 0.1

    def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Params, dict[str, jax.Array]]:
        hidden_key, out_key = jax.random.split(key)
        params = {
            "hidden": dense(hidden_key, inputs.shape[-1], self.hidden),
            "out": dense(out_key, self.hidden, self.classes),
        }
        # The model state: running batch statistics, which the model updates itself.
        return params, {"mean": jnp.zeros(self.hidden), "var": jnp.ones(self.hidden)}

    def apply(
        self,
        params: Params,
        stats: dict[str, jax.Array],
        images: jax.Array,
        *,
        key: jax.Array,
        training: bool,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        if not training:
            return forward(params, images, stats["mean"], stats["var"]), stats
        h = images @ params["hidden"]["w"] + params["hidden"]["b"]
        mean, var = h.mean(0), h.var(0)
        stats = {"mean": 0.9 * stats["mean"] + 0.1 * mean, "var": 0.9 * stats["var"] + 0.1 * var}
        h = jax.nn.relu((h - mean) / jnp.sqrt(var + 1e-5))
        keep = jax.random.bernoulli(key, 1 - self.dropout, h.shape)  # a fresh key every step
        h = jnp.where(keep, h / (1 - self.dropout), 0.0)
        return h @ params["out"]["w"] + params["out"]["b"], stats

    def to_model(self, params: Params, stats: dict[str, jax.Array]) -> Callable[[jax.Array], jax.Array]:
        """The trained model, for `state.model`: a compiled function from images to logits."""
        return jax.jit(lambda images: forward(params, images, stats["mean"], stats["var"]))


def accuracy(preds: jax.Array, target: jax.Array) -> jax.Array:
    return preds.argmax(-1) == target


def check_floor(accuracy: float, floor: float) -> None:
    """Exits with an error (status 1) when `accuracy` is under `floor`."""
    if accuracy < floor:
        raise SystemExit(f"test accuracy {accuracy:.4f} is under the floor {floor}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--strategy", default="jit", help="a ciclo strategy: jit, data_parallel, ...")
    parser.add_argument("--logdir", default=None, help="where to checkpoint (default: a temporary directory)")
    parser.add_argument("--min-accuracy", type=float, default=0.95, help="fail under this test accuracy")
    args = parser.parse_args()

    train, test = load_data()
    state = ciclo.create_model_state(
        MLP(),
        inputs=jnp.zeros((1, 64)),
        tx=optax.adam(3e-3),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": accuracy},
        strategy=args.strategy,
        key=0,
    )
    steps_per_epoch = len(train["target"]) // args.batch_size
    logdir = args.logdir or tempfile.mkdtemp(prefix="ciclo-jax-digits-")

    start = time.perf_counter()
    state, history, elapsed = ciclo.train_loop(
        state,
        batches(train, args.batch_size, seed=0),
        test_dataset=lambda: batches(test, 64, seed=None),
        epoch_duration=steps_per_epoch,
        callbacks=[
            ciclo.keras_bar(total=args.steps),
            ciclo.checkpoint(logdir, monitor="accuracy_test", mode="max"),
        ],
        stop=args.steps,
    )
    seconds = time.perf_counter() - start

    best = ciclo.restore_checkpoint(logdir, state, step="best")
    # The metrics are running means over the test set: the last step's value is the whole set's.
    _, test_history, _ = ciclo.test_loop(best, batches(test, 64, seed=None))
    test_accuracy = float(test_history.collect("accuracy")[-1])
    # `best.model` is the adapter's `to_model`: here a function from images to logits.
    model: Any = best.model
    model_accuracy = float(np.mean(np.asarray(model(test["inputs"])).argmax(-1) == test["target"]))

    print(f"trained {elapsed.steps} steps ({elapsed.samples} samples) in {seconds:.1f}s")
    print(f"test accuracy after each epoch: {[round(float(a), 4) for a in history.collect('accuracy_test')]}")
    print(f"final test accuracy (best checkpoint, restored from {logdir}): {test_accuracy:.4f}")
    print(f"test accuracy of best.model, the plain function: {model_accuracy:.4f}")
    check_floor(min(test_accuracy, model_accuracy), args.min_accuracy)


if __name__ == "__main__":
    main()
