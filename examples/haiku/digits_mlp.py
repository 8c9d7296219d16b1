"""Train a haiku MLP on scikit-learn's bundled digits with `ciclo.create_haiku_state` and `ciclo.train_loop`.

Run with `python examples/haiku/digits_mlp.py` where ciclo-haiku,
`ciclo-core[checkpoint]` (orbax) and scikit-learn are installed. Nothing is
downloaded: the digits ship inside scikit-learn. The model is evaluated on the
test set after each epoch, the checkpoint with the best test accuracy is kept
and restored at the end, and `best.model` gives back the trained haiku
`(params, state)`, which the transformed function's own `apply` runs on the test set. The
script exits with an error when the final test accuracy is under
`--min-accuracy`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import ciclo


def load_data(seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The 1797 8x8 digits, scaled to [0, 1], split 80/20 into train and test."""
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


def forward(images: jax.Array, is_training: bool) -> jax.Array:
    """The MLP: ciclo sets `is_training` for each step, and the step key is the dropout rng."""
    x = hk.Linear(128)(images)
    x = jax.nn.relu(hk.BatchNorm(True, True, 0.9)(x, is_training=is_training))
    if is_training:
        x = hk.dropout(hk.next_rng_key(), 0.1, x)
    return hk.Linear(10)(x)


# The haiku state holds hk.BatchNorm's moving averages: ciclo keeps it as the model state.
model = hk.transform_with_state(forward)


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return jnp.argmax(logits, -1) == labels


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
    state = ciclo.create_haiku_state(
        model,
        inputs=jnp.zeros((1, 64)),
        tx=optax.adam(1e-2),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": accuracy},
        strategy=args.strategy,
        key=0,
    )
    steps_per_epoch = len(train["target"]) // args.batch_size
    logdir = args.logdir or tempfile.mkdtemp(prefix="ciclo-haiku-digits-")

    start = time.perf_counter()
    state, history, elapsed = ciclo.train_loop(
        state,
        batches(train, args.batch_size, seed=0),
        callbacks=[
            ciclo.keras_bar(total=args.steps),
            ciclo.checkpoint(logdir, monitor="accuracy_test", mode="max"),
        ],
        test_dataset=lambda: batches(test, 64, seed=None),
        epoch_duration=steps_per_epoch,
        stop=args.steps,
    )
    seconds = time.perf_counter() - start

    best = ciclo.restore_checkpoint(logdir, state, step="best")
    # The metrics are running means over the test set: the last step's value is the whole set's.
    _, test_history, _ = ciclo.test_loop(best, batches(test, 64, seed=None))
    test_accuracy = float(test_history.collect("accuracy")[-1])
    # `best.model` is what `model.init` gives, trained: haiku's own `apply` runs it.
    params, haiku_state = best.model
    logits, _ = model.apply(params, haiku_state, None, test["inputs"], is_training=False)
    model_accuracy = float(np.mean(np.asarray(logits).argmax(-1) == test["target"]))

    print(f"trained {elapsed.steps} steps ({elapsed.samples} samples) in {seconds:.1f}s")
    print(f"test accuracy after each epoch: {[round(float(a), 4) for a in history.collect('accuracy_test')]}")
    print(f"final test accuracy (best checkpoint, restored from {logdir}): {test_accuracy:.4f}")
    print(f"test accuracy of best.model through model.apply: {model_accuracy:.4f}")
    check_floor(min(test_accuracy, model_accuracy), args.min_accuracy)


if __name__ == "__main__":
    main()
