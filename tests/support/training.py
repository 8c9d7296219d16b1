"""Small models, data and a hand-written reference trainer for the strategy tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import ciclo
from ciclo import managed

BATCH = 8  # splits over 1, 2, 4 and 8 devices
STEPS = 20
FEATURES = 8


def batches(steps: int = STEPS, batch: int = BATCH, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """A regression task with a non-linear target, as numpy (host) batches."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        x = rng.normal(size=(batch, FEATURES)).astype(np.float32)
        y = (np.sin(x[:, :1]) + x[:, 1:2] * x[:, 2:3]).astype(np.float32)
        out.append((x, y))
    return out


def init_linear(key: jax.Array) -> dict[str, jax.Array]:
    return {"w": 0.1 * jax.random.normal(key, (FEATURES, 1)), "b": jnp.zeros((1,))}


def apply_linear(params: Any, x: jax.Array) -> jax.Array:
    return x @ params["w"] + params["b"][None]


def init_mlp(key: jax.Array) -> list[dict[str, jax.Array]]:
    # The middle layer has 64 * 64 elements: fsdp shards it (min_size 1024).
    sizes = [FEATURES, 64, 64, 1]
    keys = jax.random.split(key, len(sizes) - 1)
    return [
        {"w": jax.random.normal(k, (m, n)) / np.sqrt(m), "b": jnp.zeros((n,))}
        for k, m, n in zip(keys, sizes[:-1], sizes[1:], strict=True)
    ]


def apply_mlp(params: Any, x: jax.Array) -> jax.Array:
    for layer in params[:-1]:
        x = jnp.tanh(x @ layer["w"] + layer["b"][None])
    return x @ params[-1]["w"] + params[-1]["b"][None]


MODELS: dict[str, tuple[Callable[[jax.Array], Any], Callable[[Any, jax.Array], jax.Array]]] = {
    "linear": (init_linear, apply_linear),
    "mlp": (init_mlp, apply_mlp),
}


class LinearClassifier:
    """A pure-JAX `ciclo.types.ModelAdapter`: a 3-class linear classifier over the last axis of the inputs."""

    def init(self, key: Any, inputs: Any) -> tuple[Any, Any]:
        return {"w": jnp.zeros((inputs.shape[-1], 3)), "b": jnp.zeros((3,))}, None

    def apply(self, params: Any, model_state: Any, inputs: Any, *, key: Any, training: bool) -> Any:
        return inputs @ params["w"] + params["b"][None], model_state


class MLPAdapter:
    """`init_mlp` / `apply_mlp` as a pure-JAX `ciclo.types.ModelAdapter` (fsdp shards its middle weight)."""

    def init(self, key: Any, inputs: Any) -> tuple[Any, Any]:
        return init_mlp(key), None

    def apply(self, params: Any, model_state: Any, inputs: Any, *, key: Any, training: bool) -> Any:
        return apply_mlp(params, inputs), model_state


def mlp_state(strategy: Any, key: int = 0) -> ciclo.types.ModelState:
    """An `MLPAdapter` state trained with adam on the squared error of `batches()`."""
    return ciclo.create_model_state(
        MLPAdapter(),
        inputs=jnp.zeros((1, FEATURES)),
        tx=optimizer(),
        losses={"mse": lambda preds, target: (preds - target) ** 2},
        strategy=strategy,
        key=key,
    )


def optimizer() -> optax.GradientTransformation:
    return optax.adam(1e-2)


def mse(apply: Callable[[Any, jax.Array], jax.Array], params: Any, batch: Any) -> jax.Array:
    x, y = batch
    return jnp.mean((apply(params, x) - y) ** 2)


def reference_params(model: str, data: list[Any]) -> Any:
    """Parameters after one optax update per batch, written by hand without ciclo."""
    init, apply = MODELS[model]
    params = init(jax.random.key(0))
    tx = optimizer()
    opt_state = tx.init(params)
    grad = jax.jit(jax.grad(lambda p, b: mse(apply, p, b)))
    for batch in data:
        updates, opt_state = tx.update(grad(params, batch), opt_state, params)
        params = optax.apply_updates(params, updates)
    return params


def managed_state(model: str, strategy: str) -> managed.ManagedState:
    init, apply = MODELS[model]
    return managed.ManagedState.create(
        params=init(jax.random.key(0)), tx=optimizer(), apply_fn=apply, strategy=strategy
    )


@managed.train_step
def train_step(state: managed.ManagedState, batch: Any) -> tuple[ciclo.types.Logs, managed.ManagedState]:
    assert state.apply_fn is not None
    loss = mse(state.apply_fn, state.params, batch)
    return ciclo.logs().add_loss("mse", loss).add_metric("mse", loss), state


@managed.step
def eval_step(state: managed.ManagedState, batch: Any) -> tuple[ciclo.types.Logs, managed.ManagedState]:
    assert state.apply_fn is not None
    x, y = batch
    preds = state.apply_fn(state.params, x)
    logs = ciclo.logs().add_metric("mse", jnp.mean((preds - y) ** 2)).add_output("preds", preds)
    return logs, state


def assert_trees_close(actual: Any, expected: Any, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol)


def best_weights_run(state: managed.ManagedState) -> tuple[managed.ManagedState, Any]:
    """Trains 4 steps; the score gets worse after step 0, so early stopping keeps the state of step 0."""

    def score(elapsed: ciclo.types.Elapsed) -> ciclo.types.Logs:
        return ciclo.logs().add_metric("score", float(elapsed.steps))

    stopper = ciclo.early_stopping("score", patience=2, restore_best_weights=True)
    state, _, elapsed = ciclo.loop(state, batches(), {ciclo.every(1): [train_step, score, stopper]})
    assert elapsed.steps == 4  # best at step 0, then 3 checks without improvement
    return state, reference_params("linear", batches()[:1])


TRAINING_OPTIONS: dict[str, Any] = {
    # A loss scale these gradients fit in float16 from the first step.
    "precision": ciclo.types.Precision(
        jnp.float16, loss_scaling=True, initial_scale=2.0**8, growth_interval=3
    ),
    "accumulate_steps": 2,
    "ema_decay": 0.5,
}
"""Every training option of `ciclo.create_model_state` at once, for the several-device cases."""


def class_batches(steps: int = 6) -> list[tuple[np.ndarray, np.ndarray]]:
    """`batches(steps)` made a 3-class task: the class is the sign of the target, plus one."""
    return [(x, np.sign(y[:, 0]).astype(np.int32) + 1) for x, y in batches(steps)]


def options_state(strategy: Any) -> ciclo.types.ModelState:
    """A `LinearClassifier` state with every training option (`TRAINING_OPTIONS`)."""
    return ciclo.create_model_state(
        LinearClassifier(),
        inputs=jnp.zeros((1, FEATURES)),
        tx=optax.sgd(0.5),
        losses=optax.softmax_cross_entropy_with_integer_labels,
        strategy=strategy,
        **TRAINING_OPTIONS,
    )
