"""The haiku entry of the conformance suite: the suite's models built as haiku functions."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

import ciclo

NAME = "haiku"
REQUIRES = "haiku"  # module that must be importable, else the suite skips this adapter
ENTRY_POINT = "create_haiku_state"

HIDDEN = 64
DROPOUT = 0.3


def make_state(kind: str, *, features: int, classes: int, **settings: Any) -> ciclo.types.ModelState:
    """Builds the suite's model `kind` (`"mlp"` or `"bn_dropout"`) and its state through the entry point."""
    # Imported here: the suite reads REQUIRES before it knows haiku is installed.
    import haiku as hk

    if kind == "mlp":

        def mlp(x: jax.Array) -> jax.Array:
            return hk.Linear(classes)(jax.nn.relu(hk.Linear(HIDDEN)(x)))

        model: Any = hk.transform(mlp)
    elif kind == "bn_dropout":

        def bn_dropout(x: jax.Array, is_training: bool) -> jax.Array:
            x = hk.Linear(HIDDEN)(x)
            x = hk.BatchNorm(create_scale=True, create_offset=True, decay_rate=0.9)(
                x, is_training=is_training
            )
            x = jax.nn.relu(x)
            if is_training:
                x = hk.dropout(hk.next_rng_key(), DROPOUT, x)
            return hk.Linear(classes)(x)

        model = hk.transform_with_state(bn_dropout)
    else:
        raise ValueError(f"unknown model kind {kind!r}; the haiku adapter builds 'mlp' and 'bn_dropout'")
    return ciclo.create_haiku_state(model, inputs=jnp.zeros((1, features)), **settings)
