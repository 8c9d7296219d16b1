"""Sweep 8 learning rates in one program: a `ciclo.population` of MLPs on MNIST-sized synthetic digits.

Run with `python examples/population_sweep.py` where `ciclo-core[checkpoint]`
(orbax) is installed; with the plot extra (`ciclo-core[plot]`, matplotlib) it
also draws every member's loss and accuracy curves with `history.plot`. Nothing
is downloaded: the 28x28 "digits" are ten random prototypes with noise.

`ciclo.population` builds one state per learning rate (the rate injected into
adam with `optax.inject_hyperparams`, so each member's step reads its own) and
`ciclo.train_loop` trains all 8 with one compiled step, the member's step
under `jax.vmap`. Every logged entry has one value per member: the history's
losses are `(steps, 8)`. The member with the best test accuracy is taken out
as an ordinary state (`population.best(test_history, "accuracy")`), saved
with `ciclo.checkpoint`, restored, and `best.model` is run on the test set.
The script exits with an error when that accuracy is under `--min-accuracy`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import ciclo

Params = dict[str, dict[str, jax.Array]]
RATES = [1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2]


def synthetic_digits(n: int, seed: int) -> dict[str, np.ndarray]:
    """`n` 28x28 images, flattened: one of ten fixed random prototypes each, plus noise, and its label."""
    prototypes = np.random.default_rng(1234).normal(size=(10, 784)).astype(np.float32)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n).astype(np.int32)
    images = 0.15 * prototypes[labels] + rng.normal(size=(n, 784)).astype(np.float32)
    return {"inputs": images.astype(np.float32), "target": labels}


def batches(
    data: dict[str, np.ndarray], batch_size: int, *, seed: int | None
) -> Iterator[dict[str, np.ndarray]]:
    """Shuffled full batches forever (seed), or one ordered pass over every sample (seed=None)."""
    size = len(data["target"])
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(size) if seed is not None else np.arange(size)
        for start in range(0, size - batch_size + 1, batch_size):
            index = order[start : start + batch_size]
            yield {key: value[index] for key, value in data.items()}
        if seed is None:
            return


@dataclasses.dataclass(frozen=True, eq=False)  # hashable: the adapter is a static field of the state
class MLP:
    """A `ciclo.types.ModelAdapter`: a 784-64-10 MLP in plain JAX."""

    hidden: int = 64

    def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Params, None]:
        k1, k2 = jax.random.split(key)
        return {
            "hidden": {"w": jax.random.normal(k1, (784, self.hidden)) / 28.0, "b": jnp.zeros(self.hidden)},
            "out": {"w": jax.random.normal(k2, (self.hidden, 10)) / 8.0, "b": jnp.zeros(10)},
        }, None

    def apply(
        self, params: Params, model_state: None, images: jax.Array, *, key: jax.Array, training: bool
    ) -> Any:
        return forward(params, images), model_state

    def to_model(self, params: Params, model_state: None) -> Callable[[jax.Array], jax.Array]:
        """The trained model, for `state.model`: a compiled function from images to logits."""
        return jax.jit(lambda images: forward(params, images))


def forward(params: Params, images: jax.Array) -> jax.Array:
    h = jax.nn.relu(images @ params["hidden"]["w"] + params["hidden"]["b"])
    return h @ params["out"]["w"] + params["out"]["b"]


def make_state(learning_rate: float) -> ciclo.types.ModelState:
    """One member: the same initial weights, its own learning rate (a leaf of its optimizer state)."""
    return ciclo.create_model_state(
        MLP(),
        inputs=jnp.zeros((1, 784)),
        tx=optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": lambda preds, target: preds.argmax(-1) == target},
        key=0,
    )


def check_floor(accuracy: float, floor: float) -> None:
    """Exits with an error (status 1) when `accuracy` is under `floor`."""
    if accuracy < floor:
        raise SystemExit(f"test accuracy {accuracy:.4f} is under the floor {floor}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--logdir", default=None, help="where to checkpoint (default: a temporary directory)")
    parser.add_argument("--min-accuracy", type=float, default=0.9, help="fail under this test accuracy")
    args = parser.parse_args()

    train, test = synthetic_digits(6000, seed=0), synthetic_digits(1000, seed=1)
    population = ciclo.population(make_state, hparams={"learning_rate": RATES})
    logdir = args.logdir or tempfile.mkdtemp(prefix="ciclo-population-")

    start = time.perf_counter()
    population, history, elapsed = ciclo.train_loop(
        population,
        batches(train, args.batch_size, seed=0),
        test_dataset=lambda: batches(test, 100, seed=None),
        epoch_duration=len(train["target"]) // args.batch_size,
        stop=args.steps,
    )
    seconds = time.perf_counter() - start

    # The metrics are running means over the test set: the last step's value is the whole set's.
    _, test_history, _ = ciclo.test_loop(population, batches(test, 100, seed=None))
    final = test_history.collect("accuracy")[-1]  # one per member
    index, member = population.best(test_history, "accuracy")  # an ordinary one-model state
    checkpoint = ciclo.checkpoint(logdir, async_save=False)
    checkpoint.save(elapsed.steps, member)
    best = ciclo.restore_checkpoint(logdir, make_state(RATES[index]))
    model: Any = best.model  # the adapter's `to_model`: a function from images to logits
    model_accuracy = float(np.mean(np.asarray(model(test["inputs"])).argmax(-1) == test["target"]))

    print(f"trained {len(RATES)} members {elapsed.steps} steps each in one program, in {seconds:.1f}s")
    for member_index, (rate, accuracy) in enumerate(zip(RATES, final, strict=True)):
        print(f"  #{member_index} learning rate {rate:<8g} test accuracy {accuracy:.4f}")
    print(f"best: #{index}, learning rate {RATES[index]:g}; best.model, restored: {model_accuracy:.4f}")
    if importlib.util.find_spec("matplotlib") is not None:  # the plot extra: one curve per member
        history.plot("loss", "accuracy", path=f"{logdir}/members.png")
        print(f"the members' curves: {logdir}/members.png")
    check_floor(model_accuracy, args.min_accuracy)


if __name__ == "__main__":
    main()
