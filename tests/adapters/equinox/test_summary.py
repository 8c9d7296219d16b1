"""ciclo.summary of equinox states: one row per field of the module holding arrays."""

from __future__ import annotations

import io

import equinox as eqx
import jax
import optax
from support import summary

import ciclo


class Mlp(eqx.Module):
    hidden: eqx.nn.Linear
    out: eqx.nn.Linear
    activation: object = eqx.field(static=True, default=jax.nn.relu)

    def __init__(self, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.hidden = eqx.nn.Linear(4, 8, key=k1)
        self.out = eqx.nn.Linear(8, 3, use_bias=False, key=k2)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(self.activation(self.hidden(x)))


def test_equinox() -> None:
    state = ciclo.create_equinox_state(Mlp(jax.random.key(0)), tx=optax.adam(1e-3))
    rows = summary.parse(ciclo.summary(state, file=io.StringIO()))

    modules = {"hidden": state.params.hidden, "out": state.params.out}
    assert rows == summary.expected_rows(state, modules)
    assert rows["hidden"] == (4 * 8 + 8, 4 * 40) and rows["out"] == (24, 96)
    assert rows["optimizer state"] == (None, 2 * rows["params"][1] + 4)
