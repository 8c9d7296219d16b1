"""Train a flax MLP on scikit-learn's bundled digits, fed by a grain pipeline, with `ciclo.train_loop`.

Run with `python examples/grain/digits_grain.py` where ciclo-flax, grain
(Python >= 3.11), scikit-learn and `ciclo-core[checkpoint]` (orbax) are
installed. Nothing is downloaded: the digits ship inside scikit-learn.

The data pipeline is grain's: a `grain.MapDataset` over the digits, cut to
this process's share of the rows (`grain.sharding.ShardByJaxProcess`: all of
them in one process, a slice each under `jax.distributed`), shuffled again at
each epoch and batched. `train_loop(..., prefetch=2)` puts each batch on the
device two steps ahead of the step that takes it. With `--backup DIR`, a run
killed or preempted (SIGTERM) goes on from its last backup at the next batch
it had not trained on: the backup holds the grain iterator's `get_state()`.
The checkpoint with the best test accuracy is kept and restored at the end,
and `best.model` is run on the test set. The script exits with an error when
the final test accuracy is under `--min-accuracy`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import flax.linen as nn
import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import ciclo


def load_rows(seed: int = 0) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    """The 1797 8x8 digits as records, flattened and scaled to [0, 1], split 80/20 into train and test."""
    digits = load_digits()
    images = (digits.images.reshape(len(digits.images), -1) / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(images))
    split = int(0.8 * len(images))
    # ciclo.types.ModelState reads a mapping batch's "inputs" and "target".
    rows = [{"inputs": images[i], "target": labels[i]} for i in order]
    return rows[:split], rows[split:]


def pipelines(
    train_rows: list[Any], test_rows: list[Any], batch_size: int, seed: int = 0
) -> tuple[grain.IterDataset, int, grain.MapDataset]:
    """The training batches (endless, reshuffled each epoch), the steps of an epoch, the test batches."""
    # This process's rows: under jax.distributed each process reads its own share and feeds it.
    shard = grain.sharding.ShardByJaxProcess(drop_remainder=True)
    train = grain.MapDataset.source(train_rows)[shard.shard_index :: shard.shard_count]
    # Full batches only, so that an epoch is a whole number of steps.
    epoch = train.shuffle(seed=seed).batch(batch_size, drop_remainder=True)
    test = grain.MapDataset.source(test_rows).batch(64)  # keeps the last, smaller batch
    # repeat() shuffles each epoch anew; to_iter_dataset() reads ahead on grain's threads, a few
    # batches: grain's default (500 elements on 16 threads) costs each iterator about a CPU second.
    read_ahead = grain.ReadOptions(num_threads=2, prefetch_buffer_size=4)
    return epoch.repeat().to_iter_dataset(read_ahead), len(epoch), test


class MLP(nn.Module):
    """One hidden layer with dropout: ciclo sets `training` for each step."""

    @nn.compact
    def __call__(self, x: jax.Array, training: bool = False) -> jax.Array:
        x = nn.Dropout(0.1, deterministic=not training)(nn.relu(nn.Dense(128)(x)))
        return nn.Dense(10)(x)


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return jnp.argmax(logits, -1) == labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--strategy", default="jit", help="a ciclo strategy: jit, data_parallel, ...")
    parser.add_argument("--logdir", default=None, help="where to checkpoint (default: a temporary directory)")
    parser.add_argument("--backup", default=None, help="back up here, and resume from a backup found here")
    parser.add_argument("--min-accuracy", type=float, default=0.95, help="fail under this test accuracy")
    args = parser.parse_args()

    train_rows, test_rows = load_rows()
    train, steps_per_epoch, test = pipelines(train_rows, test_rows, args.batch_size)
    state = ciclo.create_flax_state(
        MLP(),
        inputs=jnp.zeros((1, 64)),
        tx=optax.adam(3e-3),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": accuracy},
        strategy=args.strategy,
        key=0,
    )
    logdir = args.logdir or tempfile.mkdtemp(prefix="ciclo-grain-digits-")
    iterator: Any = iter(train)  # a grain DatasetIterator: get_state() / set_state()

    start = time.perf_counter()
    state, history, elapsed = ciclo.train_loop(
        state,
        iterator,
        callbacks=[
            ciclo.keras_bar(total=args.steps),
            # overwrite=True: running again with the same --logdir replaces the last run's checkpoints.
            ciclo.checkpoint(logdir, monitor="accuracy_test", mode="max", overwrite=True),
        ],
        test_dataset=lambda: test,  # a MapDataset: each pass iterates it afresh
        epoch_duration=steps_per_epoch,
        stop=args.steps,
        prefetch=2,
        backup=args.backup,
    )
    seconds = time.perf_counter() - start

    best = ciclo.restore_checkpoint(logdir, state, step="best")
    _, test_history, _ = ciclo.test_loop(best, test)
    test_accuracy = float(test_history.collect("accuracy")[-1])
    # `best.model` is the trained variables dict, {"params": ...}, for flax's apply.
    images = np.stack([row["inputs"] for row in test_rows])
    labels = np.stack([row["target"] for row in test_rows])
    logits = MLP().apply(best.model, images)
    model_accuracy = float(np.mean(np.asarray(logits).argmax(-1) == labels))
    print(f"trained {elapsed.steps} steps ({elapsed.samples} samples) in {seconds:.1f}s")
    print(f"the grain iterator stands after the last batch trained on: {iterator.get_state()}")
    print(f"final test accuracy (best checkpoint, restored from {logdir}): {test_accuracy:.4f}")
    print(f"test accuracy of best.model through MLP().apply: {model_accuracy:.4f}")
    if min(test_accuracy, model_accuracy) < args.min_accuracy:
        raise SystemExit(
            f"test accuracy {min(test_accuracy, model_accuracy):.4f} is under {args.min_accuracy}"
        )


if __name__ == "__main__":
    main()
