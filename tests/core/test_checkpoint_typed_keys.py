"""A state holding a typed random key (as an nnx module's rng streams do) checkpoints and restores."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

import ciclo
from ciclo import managed


class KeyedState(managed.ManagedState):
    # Not a KEY role: a typed key that travels as plain model state, as flax nnx's RngKey variables do.
    rng: jax.Array = managed.field(role=managed.Role.MODEL_STATE)


def test_a_typed_key_round_trips(tmp_path) -> None:
    state = KeyedState.create(params=jnp.zeros(2), tx=optax.sgd(0.1), rng=jax.random.key(0))
    saved = state.replace(rng=jax.random.split(state.rng)[0]).apply_gradients(grads=jnp.ones(2))
    checkpoint = ciclo.checkpoint(tmp_path, keep=None, async_save=False)
    checkpoint.save(1, saved, ciclo.logs())
    checkpoint.close()
    restored = ciclo.restore_checkpoint(tmp_path, state, step=1)
    assert jax.dtypes.issubdtype(restored.rng.dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(restored.rng), jax.random.key_data(saved.rng))
    np.testing.assert_array_equal(restored.params, saved.params)
