"""Moving states and batches onto devices: what can be placed, and the errors when not."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support import training

import ciclo
from ciclo import managed
from ciclo._src.strategies._placement import check_divisible, gather, number_list, place

PLACING = ["data_parallel", "fsdp", "pmap"]


@pytest.mark.parametrize("strategy", PLACING)
def test_a_state_leaf_that_is_not_an_array_is_named(strategy: str) -> None:
    with pytest.raises(TypeError, match=r"cannot place state leaf \['name'\] on devices: it is a str"):
        ciclo.strategies.get_strategy(strategy).place({"w": jnp.ones(2), "name": "model"})

    class Named(managed.ManagedState):
        name: str

    # A state names the field; a dict handed to create names the key.
    with pytest.raises(
        TypeError, match=r"cannot place state leaf (\.name|\['name'\]) on devices: it is a str"
    ):
        Named.create(params=jnp.ones(2), tx=optax.sgd(0.1), strategy=strategy, name="model")


def test_a_batch_that_is_itself_a_list_of_numbers_is_found_at_the_root() -> None:
    assert number_list([[1.0, 2.0], [3.0, 4.0]]) == ("(the root)", [[1.0, 2.0], [3.0, 4.0]])
    assert number_list({"x": [np.float32(1)], "y": np.ones(2)}) == ("['x']", [np.float32(1)])
    assert number_list([np.ones(2), np.ones(2)]) is None


def test_check_divisible_names_the_leaf_and_the_fix() -> None:
    batch = {"x": np.zeros((8, 3)), "y": np.zeros((6,)), "n": 3}
    check_divisible({"x": batch["x"], "n": 3}, 4, "data_parallel")
    with pytest.raises(
        ValueError, match=r"batch leaf \['y'\] has 6 rows \(shape \(6,\)\), not a multiple of 4"
    ):
        check_divisible(batch, 4, "data_parallel")
    # A stacked group's rows are its second axis; a leaf without one (per-step scalars) is not split.
    check_divisible({"x": np.zeros((3, 8)), "n": np.zeros(3)}, 4, "data_parallel", axis=1)
    with pytest.raises(ValueError, match=r"has 6 rows \(shape \(2, 6, 3\)\)"):
        check_divisible({"x": np.zeros((2, 6, 3))}, 4, "data_parallel", axis=1)


@pytest.mark.parametrize("strategy", PLACING)
def test_batches_with_scalars_and_numpy_leaves_are_lifted(strategy: str) -> None:
    lifted = ciclo.strategies.get_strategy(strategy).lift_batch(
        {"x": np.ones((4, 2)), "scale": 2.0, "w": jnp.ones(4)}
    )
    assert all(isinstance(leaf, jax.Array) or np.ndim(leaf) for leaf in jax.tree.leaves(lifted))


@pytest.mark.parametrize("strategy", PLACING)
def test_a_traced_batch_is_lifted_as_a_host_batch_is(strategy: str) -> None:
    # As inside `ciclo.fuse(managed_step)`: the batch is a tracer, with no layout to keep.
    lift = ciclo.strategies.get_strategy(strategy).lift_batch
    batch = {"x": np.ones((4, 2), np.float32)}
    assert jax.jit(lift)(batch)["x"].shape == lift(batch)["x"].shape


def test_keys_survive_placing_and_gathering(strategy: str) -> None:
    class State(managed.ManagedState):
        key: jax.Array
        raw_key: jax.Array

    state = State.create(
        params=jnp.ones(2),
        tx=optax.sgd(0.1),
        key=jax.random.key(3),
        raw_key=jax.random.PRNGKey(3),
        strategy=strategy,
    )
    host = state.with_strategy("eager")
    assert jnp.issubdtype(host.key.dtype, jax.dtypes.prng_key)
    if strategy != "pmap":  # pmap splits the key per device; its first device keeps a split
        np.testing.assert_array_equal(jax.random.key_data(host.key), jax.random.key_data(jax.random.key(3)))
    np.testing.assert_array_equal(host.raw_key, jax.random.PRNGKey(3))


def test_place_and_gather_round_trip() -> None:
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    tree = {"a": np.arange(4.0), "k": jax.random.key(0), "n": 1}
    placed = place(tree, lambda shape: sharding)
    back = gather(placed)
    np.testing.assert_array_equal(back["a"], tree["a"])
    assert back["n"] == 1 and jnp.issubdtype(back["k"].dtype, jax.dtypes.prng_key)


def test_with_strategy_round_trips_the_state(strategy: str) -> None:
    state = training.managed_state("mlp", "eager")
    moved = state.with_strategy(strategy)
    assert moved.with_strategy(strategy) is moved
    back = moved.with_strategy("eager")
    training.assert_trees_close(back.params, state.params, rtol=0, atol=0)
    training.assert_trees_close(back.opt_state, state.opt_state, rtol=0, atol=0)


@pytest.mark.parametrize(
    "strategy",
    [
        ciclo.strategies.JIT(donate=True),
        ciclo.strategies.DataParallel(donate=True),
        ciclo.strategies.FSDP(donate=True),
    ],
    ids=repr,
)
def test_donating_strategies_accept_a_state_holding_one_array_twice(
    strategy: ciclo.strategies.Strategy,
) -> None:
    class Twice(managed.ManagedState):
        a: jax.Array
        b: jax.Array

    zero = jnp.zeros(())
    state = Twice.create(params=jnp.ones(()), tx=optax.sgd(0.25), a=zero, b=zero, strategy=strategy)
    step = managed.train_step(lambda state, batch: ciclo.logs().add_loss("l", state.params**2))
    _, state = step(state, None)
    assert float(state.params) == 0.5
