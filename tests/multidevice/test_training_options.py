"""The training options of `ciclo.create_model_state` over 4 devices: one result under every strategy."""

from __future__ import annotations

import jax
import pytest
from support import training

import ciclo

DATA = training.class_batches()


def trained(strategy: str) -> ciclo.types.ModelState:
    state = training.options_state(strategy)
    for batch in DATA:
        _, state = state.train_step(batch)
    return state.with_strategy("eager")


@pytest.fixture(scope="module")
def on_one_device() -> ciclo.types.ModelState:
    return trained("jit")


@pytest.mark.parametrize("strategy", ["data_parallel", "fsdp", "pmap"])
def test_every_option_trains_as_on_one_device(strategy: str, on_one_device: ciclo.types.ModelState) -> None:
    state = trained(strategy)
    # To float16 rounding: the devices sum their rows' float16 gradients in another order.
    training.assert_trees_close(
        (state.params, state.ema_params, state.opt_state, state.loss_scale),
        (on_one_device.params, on_one_device.ema_params, on_one_device.opt_state, on_one_device.loss_scale),
        rtol=2e-3,
        atol=1e-4,
    )


def test_fsdp_shards_the_ema_weights_as_the_parameters() -> None:
    state = training.options_state(ciclo.strategies.FSDP(min_size=8))  # shards the 8x3 weights
    _, state = state.train_step(DATA[0])
    params = [leaf.sharding.spec for leaf in jax.tree.leaves(state.params)]
    assert [leaf.sharding.spec for leaf in jax.tree.leaves(state.ema_params)] == params
    assert any(spec != jax.sharding.PartitionSpec() for spec in params), "nothing sharded: a vacuous check"
