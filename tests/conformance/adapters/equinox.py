"""The equinox entry of the conformance suite: the suite's models built as equinox modules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import ciclo

NAME = "equinox"
REQUIRES = "equinox"  # module that must be importable, else the suite skips this adapter
ENTRY_POINT = "create_equinox_state"
INITIALISED = True

HIDDEN = 64


def _model_keys(key: Any, count: int) -> jax.Array:
    """Keys for the model's layers, derived from the state's `key` (an int seed or a key)."""
    if isinstance(key, int):
        key = jax.random.key(key)
    elif not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    # Folded, so that the weights do not share randomness with the state's own key split.
    return jax.random.split(jax.random.fold_in(key, 1), count)


def call_model(kind: str, *, classes: int) -> Callable[[Any, Any], Any]:
    """`to_model` gives the module (with its state for batch norm), for one example: vmapped, in inference."""
    import equinox as eqx

    if kind == "mlp":
        return lambda module, inputs: jax.vmap(eqx.nn.inference_mode(module))(inputs)

    def call(model: tuple[Any, Any], inputs: Any) -> Any:
        module, state = model
        run = jax.vmap(
            eqx.nn.inference_mode(module), in_axes=(0, None), out_axes=(0, None), axis_name="batch"
        )
        return run(inputs, state)[0]

    return call


def make_state(kind: str, *, features: int, classes: int, key: Any, **options: Any) -> ciclo.types.ModelState:
    """Builds the suite's model `kind` (`"mlp"` or `"bn_dropout"`) and its state through the entry point."""
    # Imported here: the suite reads REQUIRES before it knows equinox is installed.
    import equinox as eqx

    settings = {"key": key, **options}
    if kind == "mlp":
        k1, k2 = _model_keys(key, 2)
        model = eqx.nn.Sequential(
            [
                eqx.nn.Linear(features, HIDDEN, key=k1),
                eqx.nn.Lambda(jax.nn.relu),
                eqx.nn.Linear(HIDDEN, classes, key=k2),
            ]
        )
        return ciclo.create_equinox_state(model, **settings)
    if kind == "bn_dropout":
        k1, k2 = _model_keys(key, 2)
        model, state = eqx.nn.make_with_state(eqx.nn.Sequential)(
            [
                eqx.nn.Linear(features, HIDDEN, key=k1),
                eqx.nn.BatchNorm(HIDDEN, axis_name="batch", mode="batch"),
                eqx.nn.Lambda(jax.nn.relu),
                eqx.nn.Dropout(p=0.3),
                eqx.nn.Linear(HIDDEN, classes, key=k2),
            ]
        )
        return ciclo.create_equinox_state(model, state=state, **settings)
    raise ValueError(f"unknown model kind {kind!r}; the equinox adapter builds 'mlp' and 'bn_dropout'")
