"""flax linen modules through ciclo-flax."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

import ciclo

NAME = "flax_linen"
REQUIRES = "flax"
ENTRY_POINT = "create_flax_state"
INITIALISED = False


class MLP(nn.Module):
    classes: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.classes)(nn.relu(nn.Dense(64)(x)))


class BatchNormDropout(nn.Module):
    classes: int

    @nn.compact
    def __call__(self, x, training: bool = False):
        x = nn.BatchNorm(use_running_average=not training)(nn.Dense(64)(x))
        x = nn.Dropout(0.3, deterministic=not training)(nn.relu(x))
        return nn.Dense(self.classes)(x)


MODELS = {"mlp": MLP, "bn_dropout": BatchNormDropout}


def call_model(kind: str, *, classes: int) -> Callable[[Any, Any], Any]:
    """`to_model` gives the variables dict: `module.apply` runs it (in evaluation mode by default)."""
    return lambda variables, inputs: MODELS[kind](classes).apply(variables, inputs)


def make_state(kind: str, *, features: int, classes: int, **settings: Any) -> ciclo.types.ModelState:
    if kind not in MODELS:
        raise ValueError(f"unknown model kind {kind!r}")
    return ciclo.create_flax_state(MODELS[kind](classes), inputs=jnp.zeros((1, features)), **settings)
