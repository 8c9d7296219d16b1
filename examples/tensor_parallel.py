"""Train a transformer-style MLP block on scikit-learn's digits, tensor-parallel on 8 CPU devices.

Run with `python examples/tensor_parallel.py` where `ciclo-core[checkpoint]`
(orbax) and scikit-learn are installed. Unless `XLA_FLAGS` already sets a
device count, the script asks XLA for 8 CPU devices (it must, before JAX is
imported).

The mesh is `ciclo.strategies.MeshParallel(axes={"data": 2, "fsdp": 1, "tensor": 4})`:
batches split over "data", the block's kernels split over "tensor" as
Megatron does (the up-projection by its output, `P("fsdp", "tensor")`; the
down-projection by its input, `P("tensor", "fsdp")`), each bias laid out as its
kernel's output dimension: `P("tensor")` and `P("fsdp")`. A bias laid out
another way is refused (docs/strategies.md, "Meshes"). The script first trains
a few steps under the mesh and under `jit` on one device and checks that the
losses agree, then prints `ciclo.summary` (the layout, bytes per device) and
`ciclo.preflight` (memory and FLOPs of the compiled step), trains, keeps the
checkpoint with the best test accuracy and runs `best.model` on the test set.
The script exits with an error when the final test accuracy is under
`--min-accuracy`.
"""

from __future__ import annotations

import os

# Before JAX is imported: 8 CPU devices, unless the caller chose its own.
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import itertools  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import ciclo  # noqa: E402

Params = dict[str, Any]

RULES = [
    (r"^up/w$", P("fsdp", "tensor")),
    (r"^up/b$", P("tensor")),  # the up-projection's output dimension
    (r"^down/w$", P("tensor", "fsdp")),
    (r"^down/b$", P("fsdp")),  # the down-projection's output dimension, not "tensor"
]
"""The block's kernels split over "tensor"; the embedding, norms and head follow the fallback."""


def load_data(seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The 1797 8x8 digits, flattened and scaled to [0, 1], split 80/20 into train and test."""
    digits = load_digits()
    images = (digits.images.reshape(len(digits.images), -1) / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(images))
    train, test = order[: int(0.8 * len(images))], order[int(0.8 * len(images)) :]
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
        # The test pass keeps the last, smaller batch (360 % 64 = 40 rows: still split over "data").
        stop = size - batch_size + 1 if seed is not None else size
        for start in range(0, stop, batch_size):
            index = order[start : start + batch_size]
            yield {key: value[index] for key, value in data.items()}
        if seed is None:
            return


def dense(key: jax.Array, fan_in: int, fan_out: int) -> dict[str, jax.Array]:
    return {"w": jax.random.normal(key, (fan_in, fan_out)) / jnp.sqrt(fan_in), "b": jnp.zeros(fan_out)}


def layer_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    return (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5) * scale


def forward(params: Params, images: jax.Array) -> jax.Array:
    """Embed, one pre-norm residual MLP block (up, gelu, down), then the classifier head."""
    h = images @ params["embed"]["w"] + params["embed"]["b"]
    up = jax.nn.gelu(layer_norm(h, params["norm"]) @ params["up"]["w"] + params["up"]["b"])
    h = h + up @ params["down"]["w"] + params["down"]["b"]
    return layer_norm(h, params["final_norm"]) @ params["head"]["w"] + params["head"]["b"]


@dataclasses.dataclass(frozen=True, eq=False)  # hashable: the adapter is a static field of the state
class Block:
    """A `ciclo.types.ModelAdapter`: the transformer MLP block, in plain JAX."""

    width: int = 64
    classes: int = 10

    def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Params, None]:
        keys = jax.random.split(key, 4)
        params = {
            "embed": dense(keys[0], inputs.shape[-1], self.width),
            "norm": jnp.ones(self.width),
            "up": dense(keys[1], self.width, 4 * self.width),
            "down": dense(keys[2], 4 * self.width, self.width),
            "final_norm": jnp.ones(self.width),
            "head": dense(keys[3], self.width, self.classes),
        }
        return params, None

    def apply(
        self, params: Params, model_state: None, images: jax.Array, *, key: jax.Array, training: bool
    ) -> tuple[jax.Array, None]:
        return forward(params, images), model_state

    def to_model(self, params: Params, model_state: None) -> Callable[[jax.Array], jax.Array]:
        """The trained model, for `state.model`: a compiled function from images to logits."""
        return jax.jit(lambda images: forward(params, images))


def accuracy(preds: jax.Array, target: jax.Array) -> jax.Array:
    return preds.argmax(-1) == target


def create_state(strategy: Any) -> ciclo.types.ModelState:
    return ciclo.create_model_state(
        Block(),
        inputs=jnp.zeros((1, 64)),
        tx=optax.adam(3e-3),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": accuracy},
        strategy=strategy,
        key=0,
    )


def compare_with_jit(mesh: ciclo.strategies.MeshParallel, data: list[Any]) -> float:
    """The largest relative difference of the losses of `len(data)` steps under `mesh` and under `jit`.

    A split matmul sums its partial products in another order than one device does: the losses agree to
    float32 rounding, not bit for bit.
    """
    losses = []
    for strategy in (mesh, "jit"):
        state, run = create_state(strategy), []
        for batch in data:
            logs, state = state.train_step(batch)
            run.append(float(logs.losses.loss))
        losses.append(np.array(run))
    return float(np.max(np.abs(losses[0] - losses[1]) / np.abs(losses[1])))


def check_floor(accuracy: float, floor: float) -> None:
    """Exits with an error (status 1) when `accuracy` is under `floor`."""
    if accuracy < floor:
        raise SystemExit(f"test accuracy {accuracy:.4f} is under the floor {floor}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=360)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--logdir", default=None, help="where to checkpoint (default: a temporary directory)")
    parser.add_argument("--min-accuracy", type=float, default=0.95, help="fail under this test accuracy")
    args = parser.parse_args()

    mesh = ciclo.strategies.MeshParallel(axes={"data": 2, "fsdp": 1, "tensor": 4}, rules=RULES)
    train, test = load_data()
    first = list(itertools.islice(batches(train, args.batch_size, seed=0), 10))
    difference = compare_with_jit(mesh, first)
    print(f"losses of {len(first)} steps under the mesh and under jit: relative difference {difference:.1e}")
    if difference > 1e-5:
        raise SystemExit(f"the losses differ from jit's by {difference:.1e}, more than float32 rounding")

    state = create_state(mesh)
    ciclo.summary(state)
    print(ciclo.preflight(state, first[0]))

    logdir = args.logdir or tempfile.mkdtemp(prefix="ciclo-tensor-parallel-")
    start = time.perf_counter()
    state, history, elapsed = ciclo.train_loop(
        state,
        batches(train, args.batch_size, seed=0),
        test_dataset=lambda: batches(test, 64, seed=None),
        epoch_duration=len(train["target"]) // args.batch_size,
        callbacks=[ciclo.checkpoint(logdir, monitor="accuracy_test", mode="max")],
        stop=args.steps,
    )
    seconds = time.perf_counter() - start

    best = ciclo.restore_checkpoint(logdir, state, step="best")
    _, test_history, _ = ciclo.test_loop(best, batches(test, 64, seed=None))
    test_accuracy = float(test_history.collect("accuracy")[-1])
    model: Any = best.model
    model_accuracy = float(np.mean(np.asarray(model(test["inputs"])).argmax(-1) == test["target"]))

    print(f"trained {elapsed.steps} steps on {jax.device_count()} devices in {seconds:.1f}s")
    print(f"test accuracy after each epoch: {[round(float(a), 4) for a in history.collect('accuracy_test')]}")
    print(f"final test accuracy (best checkpoint, restored from {logdir}): {test_accuracy:.4f}")
    print(f"test accuracy of best.model, the plain function: {model_accuracy:.4f}")
    check_floor(min(test_accuracy, model_accuracy), args.min_accuracy)


if __name__ == "__main__":
    main()
