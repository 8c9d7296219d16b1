"""The smallest model with a matrix product to cast, and its batches, for the training options' tests."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

FEATURES, CLASSES, BATCH = 4, 3, 8


class Linear:
    """A linear classifier: the smallest model with a matrix product to cast."""

    def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Any, None]:
        return {"w": 0.1 * jax.random.normal(key, (inputs.shape[-1], CLASSES))}, None

    def apply(self, params: Any, model_state: None, inputs: jax.Array, *, key: Any, training: bool) -> Any:
        return inputs @ params["w"], model_state


def batches(count: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (
            rng.normal(size=(BATCH, FEATURES)).astype(np.float32),
            rng.integers(0, CLASSES, BATCH).astype(np.int32),
        )
        for _ in range(count)
    ]
