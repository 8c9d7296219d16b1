"""The haiku entry of the conformance suite: the suite's models built as haiku functions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import ciclo

NAME = "haiku"
REQUIRES = "haiku"  # module that must be importable, else the suite skips this adapter
ENTRY_POINT = "create_haiku_state"
INITIALISED = False

HIDDEN = 64
DROPOUT = 0.3


def call_model(kind: str, *, classes: int) -> Callable[[Any, Any], Any]:
    """`to_model` gives `params`, or `(params, state)` for the model with batch statistics."""
    model = transformed(kind, classes)
    if kind == "mlp":
        return lambda params, inputs: model.apply(params, None, inputs)
    return lambda variables, inputs: model.apply(*variables, None, inputs, False)[0]


def transformed(kind: str, classes: int) -> Any:
    """The suite's model `kind` as a haiku transformed function."""
    # Imported here: the suite reads REQUIRES before it knows haiku is installed.
    import haiku as hk

    if kind == "mlp":

        def mlp(x: jax.Array) -> jax.Array:
            return hk.Linear(classes)(jax.nn.relu(hk.Linear(HIDDEN)(x)))

        return hk.transform(mlp)
    if kind == "bn_dropout":

        def bn_dropout(x: jax.Array, is_training: bool) -> jax.Array:
            x = hk.Linear(HIDDEN)(x)
            x = hk.BatchNorm(create_scale=True, create_offset=True, decay_rate=0.9)(
                x, is_training=is_training
            )
            x = jax.nn.relu(x)
            if is_training:
                x = hk.dropout(hk.next_rng_key(), DROPOUT, x)
            return hk.Linear(classes)(x)

        return hk.transform_with_state(bn_dropout)
    raise ValueError(f"unknown model kind {kind!r}; the haiku adapter builds 'mlp' and 'bn_dropout'")


def make_state(kind: str, *, features: int, classes: int, **settings: Any) -> ciclo.types.ModelState:
    """Builds the suite's model `kind` (`"mlp"` or `"bn_dropout"`) and its state through the entry point."""
    return ciclo.create_haiku_state(transformed(kind, classes), inputs=jnp.zeros((1, features)), **settings)
