"""What only shows with several devices: layouts, per-device keys, batches that do not split."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support import training

import ciclo
from ciclo import managed


def _specs(tree: Any) -> list[str]:
    return [str(leaf.sharding.spec) for leaf in jax.tree.leaves(tree)]


def test_data_parallel_replicates_the_state_and_shards_batches() -> None:
    state = training.managed_state("mlp", "data_parallel")
    assert set(_specs(state)) == {"P()"}
    assert all(leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(state))
    batch = state.strategy.lift_batch(training.batches(1)[0])
    assert _specs(batch) == ["P('data',)"] * 2
    _, state = training.train_step(state, training.batches(1)[0])
    assert set(_specs(state)) == {"P()"}


def test_fsdp_shards_large_parameters_and_their_optimizer_state() -> None:
    state = training.managed_state("mlp", "fsdp")
    for tree in (state, *training.train_step(state, training.batches(1)[0])[1:]):
        assert tree.params[1]["w"].sharding.spec[0] == "data"
        mu = tree.opt_state[0].mu[1]["w"]
        assert mu.sharding.spec == tree.params[1]["w"].sharding.spec
        assert tree.params[1]["b"].sharding.is_fully_replicated
        shard = tree.params[1]["w"].addressable_shards[0].data
        assert shard.shape == (16, 64)


def test_fsdp_splits_the_largest_divisible_dimension() -> None:
    fsdp = ciclo.strategies.FSDP(min_size=8)
    assert fsdp.state_spec((6, 8)) == jax.sharding.PartitionSpec(None, "data")
    assert fsdp.state_spec((12, 8)) == jax.sharding.PartitionSpec("data", None)
    assert fsdp.state_spec((3, 5)) == jax.sharding.PartitionSpec()
    assert fsdp.state_spec((2,)) == jax.sharding.PartitionSpec()


def test_pmap_gives_each_device_its_own_key_and_a_copy_of_the_rest() -> None:
    class State(managed.ManagedState):
        key: jax.Array

    state = State.create(params=jnp.ones(3), tx=optax.sgd(0.1), key=jax.random.key(0), strategy="pmap")
    assert state.params.shape == (4, 3) and state.key.shape == (4,)
    keys = jax.random.key_data(state.key)
    assert len({tuple(np.asarray(k)) for k in keys}) == 4
    host = state.with_strategy("eager")
    assert host.params.shape == (3,) and host.key.shape == ()


@pytest.mark.parametrize("strategy", ["data_parallel", "fsdp", "pmap"])
def test_a_batch_that_does_not_split_says_how_to_fix_it(strategy: str) -> None:
    state = training.managed_state("linear", strategy)
    x, y = training.batches(1, batch=6)[0]
    with pytest.raises(ValueError, match=r"batch leaf \[0\] has 6 rows .* multiple of 4"):
        training.train_step(state, (x, y))


def test_with_strategy_moves_between_every_layout() -> None:
    state = training.managed_state("mlp", "eager")
    expected = state.params
    for name in ["pmap", "fsdp", "data_parallel", "jit", "pmap", "eager"]:
        state = state.with_strategy(name)
    training.assert_trees_close(state.params, expected, rtol=0, atol=0)
    assert {leaf.sharding.device_set.pop() for leaf in jax.tree.leaves(state.params)} == {jax.devices()[0]}
