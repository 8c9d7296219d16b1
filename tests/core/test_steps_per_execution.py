"""`train_loop(..., steps_per_execution=k)`: fused managed steps, seen one by one by epochs and history."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support import training

import ciclo

FEATURES, CLASSES = 4, 3


class Linear:
    """A plain-JAX `ciclo.types.ModelAdapter`: logits of a linear layer."""

    def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Any, None]:
        return {"w": 0.1 * jax.random.normal(key, (FEATURES, CLASSES)), "b": jnp.zeros(CLASSES)}, None

    def apply(
        self, params: Any, model_state: Any, inputs: Any, *, key: Any, training: bool
    ) -> tuple[Any, Any]:
        return inputs @ params["w"] + params["b"][None, :], model_state


def model_state(strategy: str) -> ciclo.types.ModelState:
    return ciclo.create_model_state(
        Linear(),
        inputs=jnp.ones((1, FEATURES)),
        tx=optax.adam(0.05),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": lambda preds, target: preds.argmax(-1) == target},
        strategy=strategy,
    )


def data(steps: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(size=(8, FEATURES)).astype(np.float32), rng.integers(0, CLASSES, 8).astype(np.int32))
        for _ in range(steps)
    ]


def run(
    strategy: str, steps_per_execution: int, **kwargs: Any
) -> tuple[Any, ciclo.types.History, ciclo.types.Elapsed]:
    test = data(3, seed=1)
    return ciclo.train_loop(
        model_state(strategy),
        data(40),
        test_dataset=lambda: test,
        epoch_duration=10,
        stop=35,
        steps_per_execution=steps_per_execution,
        **kwargs,
    )


@pytest.mark.parametrize("strategy", ["jit", "data_parallel"])
def test_fused_training_equals_single_steps_and_sees_every_step(strategy: str) -> None:
    single_state, single, single_elapsed = run(strategy, 1)
    fused_state, fused, fused_elapsed = run(strategy, 4)
    training.assert_trees_close(fused_state.params, single_state.params)
    assert fused_elapsed.steps == single_elapsed.steps == 35
    # One history entry per step, the same losses and running metrics at each.
    assert fused.collect("steps") == single.collect("steps") == list(range(35))
    np.testing.assert_allclose(fused.collect("loss"), single.collect("loss"), rtol=1e-5)
    np.testing.assert_allclose(fused.collect("accuracy"), single.collect("accuracy"), rtol=1e-5)
    # Epochs end exactly: the test loop ran after steps 10, 20, 30, on the same states.
    assert fused.collect("steps", "loss_test")[0] == [9, 19, 29]
    np.testing.assert_allclose(fused.collect("loss_test"), single.collect("loss_test"), rtol=1e-5)


def test_groups_are_cut_at_epoch_ends_and_at_stop() -> None:
    sizes: list[int] = []

    def record(state: Any, batch: Any) -> None:
        sizes.append(batch.steps)

    run("jit", 4, tasks={ciclo.on_train_batch_begin: [record]})
    # Epochs of 10 steps, stop at 35: 4 + 4 + 2 per epoch, then 4 + 1.
    assert sizes == [4, 4, 2] * 3 + [4, 1]


def test_a_resumed_loop_keeps_its_groups_on_the_epochs() -> None:
    sizes: list[int] = []
    ciclo.train_loop(
        model_state("jit"),
        data(20),
        {ciclo.on_train_batch_begin: [lambda state, batch: sizes.append(batch.steps)]},
        epoch_duration=10,
        stop=20,
        elapsed=ciclo.types.Elapsed.create(steps=7),
        steps_per_execution=4,
    )
    assert sizes == [3, 4, 4, 2]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps_per_execution": 0}, "steps_per_execution must be a positive int"),
        (
            {"steps_per_execution": 4, "epoch_duration": ciclo.at(samples=80)},
            "epoch_duration must be a number of steps",
        ),
        ({"steps_per_execution": 4, "stop": ciclo.at(time=10.0)}, "stop must be a number of steps"),
    ],
)
def test_groups_need_steps(kwargs: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {"epoch_duration": 10, "stop": 20, **kwargs}
    with pytest.raises(ValueError, match=message):
        ciclo.train_loop(model_state("jit"), data(20), **arguments)
