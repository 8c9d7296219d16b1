"""Train a Keras 3 model on scikit-learn's bundled digits with ciclo, through `stateless_call`.

Run with `python examples/keras/digits_mlp.py` where `ciclo-core[checkpoint]`
(orbax), keras>=3 and scikit-learn are installed; Keras runs on its JAX backend.
Nothing is downloaded: the digits ship inside scikit-learn.

Keras 3 runs a model as a pure function with `model.stateless_call`: a
`ciclo.types.ModelAdapter` of a dozen lines gives its trainable variables to the
optimizer as params and keeps the rest (batch statistics, the dropout seed) as
model state. The model is evaluated on the test set after each epoch, the
checkpoint with the best test accuracy is kept and restored at the end, and
`best.model` writes the trained values into the Keras model, which
`model.predict` then runs on the test set. The script exits with an error
when the final test accuracy is under `--min-accuracy`.
"""

from __future__ import annotations

import os

os.environ["KERAS_BACKEND"] = "jax"  # before keras is imported

import argparse
import dataclasses
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np
import optax
from sklearn.datasets import load_digits

import ciclo


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


@dataclasses.dataclass(frozen=True, eq=False)  # hashable: the adapter is a static field of the state
class KerasAdapter:
    """A `ciclo.types.ModelAdapter` for any Keras 3 model on the JAX backend."""

    model: keras.Model

    def init(self, key: jax.Array, inputs: jax.Array) -> tuple[list[jax.Array], list[jax.Array]]:
        self.model(inputs)  # builds the variables; keras seeds its own initialisers
        params = [v.value for v in self.model.trainable_variables]
        model_state = [v.value for v in self.model.non_trainable_variables]
        return params, model_state

    def apply(
        self, params: Any, model_state: Any, inputs: jax.Array, *, key: jax.Array, training: bool
    ) -> tuple[jax.Array, list[jax.Array]]:
        # Keras draws dropout masks from its own seed generator, which lives in the model state.
        outputs, model_state = self.model.stateless_call(params, model_state, inputs, training=training)
        return outputs, model_state

    def to_model(self, params: Any, model_state: Any) -> keras.Model:
        """The Keras model holding the trained values, for `state.model` (as the Keras JAX guide ends)."""
        for variable, value in zip(self.model.trainable_variables, params, strict=True):
            variable.assign(value)
        for variable, value in zip(self.model.non_trainable_variables, model_state, strict=True):
            variable.assign(value)
        return self.model


def make_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dropout(0.1),
            keras.layers.Dense(10),
        ]
    )


def loss(preds: jax.Array, target: jax.Array) -> jax.Array:
    # Keras losses take (y_true, y_pred) positionally: ciclo passes arguments by name.
    return keras.losses.sparse_categorical_crossentropy(target, preds, from_logits=True)


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
        KerasAdapter(make_model()),
        inputs=jnp.zeros((1, 64)),
        tx=optax.adam(3e-3),
        losses={"loss": loss},
        metrics={"accuracy": accuracy},
        strategy=args.strategy,
        key=0,
    )
    steps_per_epoch = len(train["target"]) // args.batch_size
    logdir = args.logdir or tempfile.mkdtemp(prefix="ciclo-keras-digits-")

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
    # `best.model` is the Keras model with the best checkpoint's values: Keras's own API runs it.
    model = best.model
    logits = model.predict(test["inputs"], batch_size=64, verbose=0)
    model_accuracy = float(np.mean(np.asarray(logits).argmax(-1) == test["target"]))

    print(f"trained {elapsed.steps} steps ({elapsed.samples} samples) in {seconds:.1f}s")
    print(f"test accuracy after each epoch: {[round(float(a), 4) for a in history.collect('accuracy_test')]}")
    print(f"final test accuracy (best checkpoint, restored from {logdir}): {test_accuracy:.4f}")
    print(f"test accuracy of best.model through model.predict: {model_accuracy:.4f}")
    check_floor(min(test_accuracy, model_accuracy), args.min_accuracy)


if __name__ == "__main__":
    main()
