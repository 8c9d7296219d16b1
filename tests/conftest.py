"""Shared test configuration: stricter JAX, small synthetic datasets."""

from __future__ import annotations

import jax
import numpy as np
import pytest

# Implicit rank promotion hides shape bugs; tests should fail loudly instead.
jax.config.update("jax_numpy_rank_promotion", "raise")


def make_batches(
    n: int, batch_size: int = 4, features: int = 3, seed: int = 0
) -> list[dict[str, np.ndarray]]:
    """`n` batches of a synthetic linear-regression task."""
    rng = np.random.default_rng(seed)
    w = np.arange(1, features + 1, dtype=np.float32)
    out = []
    for _ in range(n):
        x = rng.normal(size=(batch_size, features)).astype(np.float32)
        out.append({"x": x, "y": x @ w})
    return out


@pytest.fixture
def batches() -> list[dict[str, np.ndarray]]:
    return make_batches(20)


STRATEGIES = ["eager", "jit", "jit_donate", "data_parallel", "fsdp", "pmap"]
"""Every built-in strategy; `test_registry` fails when one is missing here."""


@pytest.fixture(params=STRATEGIES)
def strategy(request: pytest.FixtureRequest) -> str:
    """Each built-in strategy's name in turn: one test body, every strategy."""
    return str(request.param)
