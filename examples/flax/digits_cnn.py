"""Train a flax CNN on scikit-learn's bundled digits with `ciclo.create_flax_state` and `ciclo.train_loop`.

Run with `python examples/flax/digits_cnn.py` where ciclo-flax, scikit-learn
and `ciclo-core[checkpoint]` (orbax) are installed. Nothing is downloaded: the
digits ship inside scikit-learn. The model is evaluated on the test set after each epoch, the
checkpoint with the best test accuracy is kept, and it is restored at the end;
`best.model` gives back its linen variables, which `CNN().apply` runs on the
test set. The script exits with an error when the final test accuracy is under
`--min-accuracy`.

With `--logdir DIR`, everything the run leaves is in DIR: the checkpoints,
TensorBoard event files (`tensorboard --logdir DIR`), the logs as
`history.csv`, and the curves as `history.png` (`History.plot`). The
learning rate follows a cosine decay, injected with `optax.inject_hyperparams`,
so ciclo logs it every step. Besides `checkpoint`, the run needs the
ciclo-core extras `tensorboard` (tensorboardX) and `plot` (matplotlib).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import ciclo


def load_data(seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The 1797 8x8 digits, scaled to [0, 1], split 80/20 into train and test."""
    digits = load_digits()
    images = (digits.images[..., None] / 16.0).astype(np.float32)  # (n, 8, 8, 1)
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


class CNN(nn.Module):
    """Two convolutions, batch norm and dropout: ciclo sets `training` for each step."""

    @nn.compact
    def __call__(self, x: jax.Array, training: bool = False) -> jax.Array:
        x = nn.relu(nn.Conv(16, (3, 3))(x))
        x = nn.relu(nn.BatchNorm(use_running_average=not training)(nn.Conv(32, (3, 3))(x)))
        x = nn.avg_pool(x, (2, 2), strides=(2, 2)).reshape((x.shape[0], -1))
        x = nn.Dropout(0.2, deterministic=not training)(nn.relu(nn.Dense(64)(x)))
        return nn.Dense(10)(x)


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return jnp.argmax(logits, -1) == labels


def evaluate(state: ciclo.types.ModelState, test: dict[str, np.ndarray]) -> float:
    """The accuracy of `state` over the whole test set."""
    state = state.reset_step()
    logs = None
    for batch in batches(test, 64, seed=None):
        logs, state = state.test_step(batch)
    assert logs is not None
    return float(logs.metrics.accuracy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--strategy", default="jit", help="a ciclo strategy: jit, data_parallel, ...")
    parser.add_argument(
        "--logdir",
        default=None,
        help="where to write checkpoints, TensorBoard events, history.csv and history.png "
        "(default: a temporary directory)",
    )
    parser.add_argument("--min-accuracy", type=float, default=0.95, help="fail under this test accuracy")
    args = parser.parse_args()

    train, test = load_data()
    state = ciclo.create_flax_state(
        CNN(),
        inputs=jnp.zeros((1, 8, 8, 1)),
        tx=optax.inject_hyperparams(optax.adam)(learning_rate=optax.cosine_decay_schedule(3e-3, args.steps)),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": accuracy},
        strategy=args.strategy,
        key=0,
    )
    steps_per_epoch = len(train["target"]) // args.batch_size
    logdir = args.logdir or tempfile.mkdtemp(prefix="ciclo-flax-digits-")

    start = time.perf_counter()
    state, history, elapsed = ciclo.train_loop(
        state,
        batches(train, args.batch_size, seed=0),
        callbacks=[
            ciclo.keras_bar(total=args.steps),
            # overwrite=True: running again with the same --logdir replaces the last run's checkpoints.
            ciclo.checkpoint(logdir, monitor="accuracy_test", mode="max", overwrite=True),
            ciclo.tensorboard(logdir),
            ciclo.csv_logger(os.path.join(logdir, "history.csv")),
        ],
        test_dataset=lambda: batches(test, 64, seed=None),
        epoch_duration=steps_per_epoch,
        stop=args.steps,
    )
    seconds = time.perf_counter() - start

    best = ciclo.restore_checkpoint(logdir, state, step="best")
    test_accuracy = evaluate(best, test)
    # `best.model` is the trained variables dict, {"params": ..., "batch_stats": ...}, for flax's apply.
    logits = CNN().apply(best.model, test["inputs"], training=False)
    model_accuracy = float(np.mean(np.asarray(logits).argmax(-1) == test["target"]))
    print(f"trained {elapsed.steps} steps ({elapsed.samples} samples) in {seconds:.1f}s")
    print(f"last epoch's test accuracy: {history.collect('accuracy_test')[-1]:.4f}")
    print(f"final test accuracy (best checkpoint, restored from {logdir}): {test_accuracy:.4f}")
    print(f"test accuracy of best.model through CNN().apply: {model_accuracy:.4f}")
    history.plot("loss", "accuracy", "learning_rate", path=os.path.join(logdir, "history.png"))
    print(f"TensorBoard events, history.csv and history.png are in {logdir}")
    if min(test_accuracy, model_accuracy) < args.min_accuracy:
        raise SystemExit(
            f"test accuracy {min(test_accuracy, model_accuracy):.4f} is under {args.min_accuracy}"
        )


if __name__ == "__main__":
    main()
