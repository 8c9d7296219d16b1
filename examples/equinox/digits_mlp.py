"""Train an equinox MLP with batch norm and dropout on scikit-learn's bundled digits with `ciclo.train_loop`.

Run with `python examples/equinox/digits_mlp.py` where `ciclo-core[checkpoint]`
(orbax), ciclo-equinox and scikit-learn are installed. Nothing is downloaded:
the digits ship inside scikit-learn. The model is evaluated on the test set
after each epoch, the checkpoint with the best test accuracy is kept and
restored at the end, and `best.model` gives back the trained equinox
`(module, state)`, which is run on the test set the equinox way (`jax.vmap` and
`eqx.nn.inference_mode`). The script exits with an error when the final test
accuracy is under `--min-accuracy`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator

import equinox as eqx
import jax
import numpy as np
import optax
from sklearn.datasets import load_digits

import ciclo

Batch = tuple[np.ndarray, np.ndarray]


def load_data(seed: int = 0) -> tuple[Batch, Batch]:
    """The 1797 8x8 digits, scaled to [0, 1], split 80/20 into train and test `(images, labels)`."""
    digits = load_digits()
    images = (digits.images.reshape(len(digits.images), -1) / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(images))
    split = int(0.8 * len(images))
    train, test = order[:split], order[split:]
    return (images[train], labels[train]), (images[test], labels[test])


def batches(data: Batch, batch_size: int, *, seed: int | None) -> Iterator[Batch]:
    """Shuffled `(inputs, target)` batches forever (seed), or one ordered pass (seed=None)."""
    images, labels = data
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(labels)) if seed is not None else np.arange(len(labels))
        for start in range(0, len(labels) - batch_size + 1, batch_size):
            index = order[start : start + batch_size]
            yield images[index], labels[index]
        if seed is None:
            return


def make_model(key: jax.Array) -> tuple[eqx.nn.Sequential, eqx.nn.State]:
    """An MLP that acts on one image: ciclo-equinox vmaps it over the batch, naming the axis "batch"."""
    k1, k2 = jax.random.split(key)
    return eqx.nn.make_with_state(eqx.nn.Sequential)(
        [
            eqx.nn.Linear(64, 128, key=k1),
            eqx.nn.BatchNorm(128, axis_name="batch", mode="batch"),
            eqx.nn.Lambda(jax.nn.relu),
            eqx.nn.Dropout(0.2),
            eqx.nn.Linear(128, 10, key=k2),
        ]
    )


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
    parser.add_argument("--logdir", default=None, help="where to checkpoint (default: a new temporary dir)")
    parser.add_argument("--min-accuracy", type=float, default=0.95, help="fail under this test accuracy")
    args = parser.parse_args()

    train, test = load_data()
    test_batch_size = 72  # divides the 360 test images: every image is scored
    steps_per_epoch = len(train[1]) // args.batch_size
    logdir = args.logdir or tempfile.mkdtemp(prefix="ciclo-equinox-digits-")

    model, model_state = make_model(jax.random.key(0))
    state = ciclo.create_equinox_state(
        model,
        state=model_state,
        tx=optax.adam(1e-3),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": accuracy},
        strategy="jit",
        key=0,
    )

    start = time.perf_counter()
    state, history, elapsed = ciclo.train_loop(
        state,
        batches(train, args.batch_size, seed=0),
        test_dataset=lambda: batches(test, test_batch_size, seed=None),
        epoch_duration=steps_per_epoch,
        callbacks=[
            ciclo.keras_bar(total=args.steps),
            ciclo.checkpoint(logdir, monitor="accuracy_test", mode="max"),
        ],
        stop=args.steps,
    )
    train_time = time.perf_counter() - start

    # The metrics are running means over the test set: the last step's value is the whole set's.
    best = ciclo.restore_checkpoint(logdir, state, step="best")
    _, best_history, _ = ciclo.test_loop(best, batches(test, test_batch_size, seed=None))
    best_accuracy = float(best_history.collect("accuracy")[-1])
    # `best.model` is the trained `(module, state)`, as eqx.nn.make_with_state gave it. The module acts
    # on one image: vmap it over the batch, with the batch norm's axis name and the state shared.
    module, module_state = best.model
    run = jax.vmap(eqx.nn.inference_mode(module), in_axes=(0, None), out_axes=(0, None), axis_name="batch")
    logits, _ = run(test[0], module_state)
    model_accuracy = float(np.mean(np.asarray(logits).argmax(-1) == test[1]))
    epochs_accuracy = [round(float(a), 4) for a in history.collect("accuracy_test")]
    print(f"trained {elapsed.steps} steps ({elapsed.samples} samples) in {train_time:.1f}s")
    print(f"test accuracy after each epoch: {epochs_accuracy}")
    print(f"final test accuracy (best checkpoint, restored from {logdir}): {best_accuracy:.4f}")
    print(f"test accuracy of best.model, run by equinox: {model_accuracy:.4f}")
    check_floor(min(best_accuracy, model_accuracy), args.min_accuracy)


if __name__ == "__main__":
    main()
