"""An equinox module given to `managed.ManagedState.create`: refused clearly, and the split that works."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo import managed


def mlp() -> eqx.nn.MLP:
    return eqx.nn.MLP(in_size=2, out_size=1, width_size=8, depth=1, key=jax.random.key(0))


def test_a_module_as_params_is_refused_with_the_way_out() -> None:
    # Before: optax's zeros_like failed on the MLP's activation ("... got custom_jvp").
    with pytest.raises(TypeError, match=r"params/activation is .*not an array.*create_equinox_state"):
        managed.ManagedState.create(params=mlp(), tx=optax.adam(1e-2))


class State(managed.ManagedState):
    static: Any = managed.field(static=True)


@managed.train_step
def train_step(state: State, batch: Any) -> tuple[ciclo.types.Logs, State]:
    x, y = batch
    model = eqx.combine(state.params, state.static)
    loss = jnp.mean((jax.vmap(model)(x)[:, 0] - y) ** 2)
    return ciclo.logs().add_loss("mse", loss), state


def test_the_split_the_error_describes_trains_under_every_strategy(strategy: str) -> None:
    params, static = eqx.partition(mlp(), eqx.is_array)
    state = State.create(params=params, static=static, tx=optax.adam(1e-2), strategy=strategy)
    x = np.random.default_rng(0).normal(size=(16, 2)).astype(np.float32)
    batch = (x, x @ np.array([1.0, -2.0], np.float32))
    losses = []
    for _ in range(50):
        logs, state = train_step(state, batch)
        losses.append(float(logs.losses.mse))
    assert losses[-1] < 0.5 * losses[0]
    trained = eqx.combine(state.with_strategy("eager").params, static)
    assert isinstance(trained, eqx.nn.MLP) and trained.activation is jax.nn.relu
