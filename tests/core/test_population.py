"""`ciclo.population`: members stacked on a leading axis, trained by one vmapped step.

A population trained by `train_loop` matches separate runs of its members; an inactive member stays
bit for bit as it was, with no recompile; members that cannot share one program are refused.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support.linear import FEATURES, Linear, batches
from support.population import RATES, SEEDS, Regression, adam, assert_matches_separate_runs

import ciclo
from ciclo import managed

DATA = batches(8)


def make_plain(seed: int, learning_rate: float) -> Regression:
    w = jax.random.normal(jax.random.key(seed), (FEATURES,))
    return Regression.create(params={"w": w}, tx=adam(learning_rate))


def make_model(seed: int, learning_rate: float = 0.1, **options: Any) -> Any:
    return ciclo.create_model_state(
        Linear(),
        inputs=jnp.zeros((1, FEATURES)),
        key=seed,
        tx=adam(learning_rate),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": lambda preds, target: (preds.argmax(-1) == target).mean()},
        **options,
    )


def regression_data() -> list[tuple[np.ndarray, np.ndarray]]:
    return [(x, (x @ np.arange(FEATURES, dtype=np.float32))) for x, _ in DATA]


def test_plain_managed_state_matches_separate_runs() -> None:
    assert_matches_separate_runs(make_plain, regression_data(), "mse")


def test_model_state_matches_separate_runs_with_accumulation_and_ema() -> None:
    # Training options live in each member's optax chain: they work per member.
    def make(seed: int, learning_rate: float) -> Any:
        return make_model(seed, learning_rate, accumulate_steps=2, ema_decay=0.5)

    assert_matches_separate_runs(make, DATA, "loss", steps=20)


def test_inactive_member_is_frozen_without_recompiling() -> None:
    pop = ciclo.population(make_model, seeds=SEEDS, hparams={"learning_rate": RATES})
    _, pop = pop.train_step(DATA[0])
    compiles = ciclo.types.Population.train_step.compiles
    frozen = pop.replace(active=jnp.array([True, False, True, True]), hparams=dict(pop.hparams))
    before = jax.tree.map(np.asarray, frozen.member(1))
    _, after = frozen.train_step(DATA[1])
    _, after = after.train_step(DATA[2])
    assert ciclo.types.Population.train_step.compiles == compiles
    for got, want in zip(jax.tree.leaves(after.member(1)), jax.tree.leaves(before), strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)
    assert int(after.member(0).step) == 3
    assert not np.array_equal(after.member(0).params["w"], frozen.member(0).params["w"])


def test_a_stepped_population_is_rebuilt_only_when_read() -> None:
    # As a managed state: each step returns the population flat, and the next step takes its leaves.
    pop = ciclo.population(make_plain, seeds=SEEDS, hparams={"learning_rate": RATES})
    data = regression_data()
    _, pop = pop.train_step(data[0])
    compiles = ciclo.types.Population.train_step.compiles
    _, pop = pop.train_step(data[1])
    _, pop = pop.train_step(data[2])
    assert "members" not in vars(pop) and "active" not in vars(pop)  # its leaves, tree and static fields
    assert pop.hparams["learning_rate"] == tuple(RATES * len(SEEDS)) and "members" not in vars(pop)
    assert ciclo.types.Population.train_step.compiles == compiles
    assert pop.size == 4 and "members" in vars(pop)  # a field read rebuilds it
    assert [int(pop.member(i).step) for i in range(4)] == [3] * 4


def test_batch_axis_member_gives_each_member_its_batch() -> None:
    pop = ciclo.population(make_model, seeds=[0, 0], batch_axis="member")
    x, y = DATA[0]
    logs, pop = pop.train_step((np.stack([x, -x]), np.stack([y, y])))
    assert logs.losses.loss.shape == (2,)
    assert not np.array_equal(pop.member(0).params["w"], pop.member(1).params["w"])


def test_test_and_predict_steps_and_reset() -> None:
    pop = ciclo.population(make_model, seeds=SEEDS, hparams={"learning_rate": RATES})
    pop, history, _ = ciclo.test_loop(pop, DATA[:3])
    assert np.asarray(history.collect("accuracy")).shape[-1] == 4
    logs, _ = pop.predict_step(DATA[0])
    assert logs.outputs.preds.shape == (4, *DATA[0][1].shape, 3)


def test_members_differing_in_a_shape_are_refused() -> None:
    def make(seed: int) -> Regression:
        return Regression.create(params={"w": jnp.zeros(FEATURES + seed)}, tx=optax.sgd(0.1))

    with pytest.raises(ValueError, match=r"member 1 differs from member 0 at params/w float32\[5\]") as error:
        ciclo.population(make, seeds=[0, 1])
    assert len(str(error.value)) < 2000


def test_a_varying_hyperparameter_that_is_not_injected_is_refused() -> None:
    def make(seed: int, learning_rate: float) -> Regression:
        return Regression.create(params={"w": jnp.zeros(FEATURES)}, tx=optax.adam(learning_rate))

    with pytest.raises(
        ValueError, match=r"'learning_rate' varies .* member 0's .*inject_hyperparams"
    ) as error:
        ciclo.population(make, seeds=[0], hparams={"learning_rate": RATES})
    assert len(str(error.value)) < 2000


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "needs seeds="),
        ({"hparams": {"a": [1, 2], "b": [1]}}, "one length; got a: 2, b: 1"),
        ({"seeds": [0], "batch_axis": "batch"}, "batch_axis must be None"),
        ({"seeds": [0], "hparams": {"seed": [1]}}, "give the seeds once"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ciclo.population(make_plain, **kwargs)


def test_members_for_several_devices_are_refused() -> None:
    def make(seed: int) -> Regression:
        return Regression.create(
            params={"w": jnp.zeros(FEATURES)}, tx=optax.sgd(0.1), strategy="data_parallel"
        )

    with pytest.raises(ValueError, match="places its members itself .* strategy='jit'"):
        ciclo.population(make, seeds=[0, 1])


def test_a_step_that_is_not_managed_is_named() -> None:
    class Plain(managed.ManagedState):
        def train_step(self, batch: Any) -> Any:
            return None, self

    pop = ciclo.population(lambda seed: Plain.create(params=jnp.zeros(2), tx=optax.sgd(0.1)), seeds=[0, 1])
    with pytest.raises(TypeError, match="Plain.train_step is .* not a managed step"):
        pop.train_step(jnp.ones(2))
