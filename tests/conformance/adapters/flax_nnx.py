"""flax nnx modules through ciclo-flax."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

import ciclo

NAME = "flax_nnx"
REQUIRES = "flax"
ENTRY_POINT = "create_flax_state"
INITIALISED = True


class MLP(nnx.Module):
    def __init__(self, features: int, classes: int, *, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(features, 64, rngs=rngs)
        self.out = nnx.Linear(64, classes, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


class BatchNormDropout(nnx.Module):
    def __init__(self, features: int, classes: int, *, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(features, 64, rngs=rngs)
        self.norm = nnx.BatchNorm(64, rngs=rngs)
        self.dropout = nnx.Dropout(0.3, rngs=rngs)
        self.out = nnx.Linear(64, classes, rngs=rngs)

    def __call__(self, x):
        return self.out(self.dropout(nnx.relu(self.norm(self.hidden(x)))))


def call_model(kind: str, *, classes: int) -> Callable[[Any, Any], Any]:
    """`to_model` gives the module in the mode it was built in: switched to evaluation first."""

    def call(module: nnx.Module, inputs: Any) -> Any:
        module.eval()
        return module(inputs)

    return call


def make_state(
    kind: str, *, features: int, classes: int, key: jax.Array, **settings: Any
) -> ciclo.types.ModelState:
    models = {"mlp": MLP, "bn_dropout": BatchNormDropout}
    if kind not in models:
        raise ValueError(f"unknown model kind {kind!r}")
    model_key, state_key = jax.random.split(key)
    model = models[kind](features, classes, rngs=nnx.Rngs(params=model_key, dropout=model_key))
    return ciclo.create_flax_state(model, key=state_key, **settings)
