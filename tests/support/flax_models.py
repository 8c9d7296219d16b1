"""Two small flax models with batch statistics and dropout, one linen and one nnx (4 inputs, 3 outputs).

Only the flax tests import this module: it imports flax.
"""

from __future__ import annotations

import flax.linen as nn
import jax
from flax import nnx


class Linen(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array, training: bool = False) -> jax.Array:
        x = nn.BatchNorm(use_running_average=not training)(nn.Dense(16)(x))
        return nn.Dense(3)(nn.Dropout(0.5, deterministic=not training)(x))


class Nnx(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.dense = nnx.Linear(4, 16, rngs=rngs)
        self.norm = nnx.BatchNorm(16, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)
        self.out = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(self.dropout(self.norm(self.dense(x))))
