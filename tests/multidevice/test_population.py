"""A population on 4 devices: its members sharded over the mesh axis "member", trained as on one device."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support.linear import FEATURES, Linear, batches

import ciclo

DATA = batches(4)


def make(seed: int, learning_rate: float = 0.01) -> Any:
    return ciclo.create_model_state(
        Linear(),
        inputs=jnp.zeros((1, FEATURES)),
        key=seed,
        tx=optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
    )


@pytest.mark.parametrize(("members", "mesh", "per_device"), [(8, (4, 1), 2), (6, (2, 2), 3), (2, (2, 2), 1)])
def test_members_are_sharded_over_the_member_axis(
    members: int, mesh: tuple[int, int], per_device: int
) -> None:
    # Members over "member"; the devices that share members split their batches over "data".
    pop = ciclo.population(make, seeds=range(members))
    sharding = pop.members.params["w"].sharding
    assert isinstance(sharding, jax.sharding.NamedSharding) and sharding.mesh is pop.mesh
    assert dict(pop.mesh.shape) == {"member": mesh[0], "data": mesh[1]} and sharding.spec[0] == "member"
    assert {shard.data.shape[0] for shard in pop.members.params["w"].addressable_shards} == {per_device}
    pop, history, _ = ciclo.train_loop(pop, DATA * 3, stop=12)
    assert np.shape(history.collect("loss")) == (12, members)
    assert pop.members.params["w"].sharding.spec[0] == "member"
    for i in (0, members - 1):
        alone, _, _ = ciclo.train_loop(make(i), DATA * 3, stop=12)
        member = pop.member(i)
        assert member.params["w"].devices() == {jax.devices()[0]}
        np.testing.assert_allclose(member.params["w"], alone.params["w"], rtol=5e-6, atol=1e-6)


def test_each_member_s_batch_is_split_over_data() -> None:
    pop = ciclo.population(make, seeds=range(2), batch_axis="member")
    x, y = DATA[0]
    batch = (np.stack([x, -x]), np.stack([y, y]))
    text = ciclo.types.Population.train_step.lower(pop, batch).compile().as_text()
    assert "all-reduce" in text or "all_reduce" in text  # the gradients summed over "data"
    logs, after = pop.train_step(batch)
    alone = make(1).train_step((-x, y))[1]
    np.testing.assert_allclose(after.member(1).params["w"], alone.params["w"], rtol=5e-6, atol=1e-6)


def test_a_frozen_member_on_another_device_stays_as_it_was() -> None:
    pop = ciclo.population(make, seeds=range(4))
    frozen = pop.replace(active=jnp.arange(4) != 3)
    _, after = frozen.train_step(DATA[0])
    np.testing.assert_array_equal(after.member(3).params["w"], frozen.member(3).params["w"])
    assert not np.array_equal(after.member(2).params["w"], frozen.member(2).params["w"])
