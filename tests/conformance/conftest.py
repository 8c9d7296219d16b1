"""The conformance suite's fixtures: every installed adapter, under every strategy it must support."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import jax
import numpy as np
import optax
import pytest
from conformance.adapters import TABLE, Adapter

import ciclo

# The adapter modules import their framework: only the fixture loads them, for installed frameworks.
collect_ignore = ["adapters"]

STRATEGIES = ["eager", "jit", "data_parallel", "fsdp"]
"""The strategies every adapter is checked under (pmap keeps its own, older semantics)."""

FEATURES, CLASSES, BATCH = 16, 10, 64

Batch = tuple[np.ndarray, np.ndarray]


INSTALLED = [row for row in TABLE if row.available]
"""The adapters whose framework is installed in this environment (nox installs one per session)."""


@pytest.fixture(params=INSTALLED, ids=[row.name for row in INSTALLED])
def adapter(request: pytest.FixtureRequest) -> ModuleType:
    row: Adapter = request.param
    return row.load()


@pytest.fixture(params=STRATEGIES)
def strategy(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def blobs(batches: int, seed: int) -> list[Batch]:
    """A separable 10-class task: noisy points around 10 fixed centers, in batches of 64."""
    centers = np.random.default_rng(1234).normal(size=(CLASSES, FEATURES)) * 3
    rng = np.random.default_rng(seed)
    target = rng.integers(0, CLASSES, batches * BATCH).astype(np.int32)
    inputs = (centers[target] + rng.normal(size=(target.size, FEATURES))).astype(np.float32)
    return [(inputs[i : i + BATCH], target[i : i + BATCH]) for i in range(0, target.size, BATCH)]


def accuracy(preds: jax.Array, target: jax.Array) -> jax.Array:
    return preds.argmax(-1) == target


@pytest.fixture
def make_state(adapter: ModuleType, strategy: str) -> Callable[..., ciclo.ModelState]:
    """`make_state(kind, **overrides)` for the adapter under test, with the suite's defaults."""

    def make(kind: str = "mlp", **overrides: Any) -> ciclo.ModelState:
        settings: dict[str, Any] = {
            "tx": optax.adam(1e-2),
            "losses": {"loss": optax.softmax_cross_entropy_with_integer_labels},
            "metrics": {"accuracy": accuracy},
            "strategy": strategy,
            "key": jax.random.key(0),
            **overrides,
        }
        return adapter.make_state(kind, features=FEATURES, classes=CLASSES, **settings)

    return make
