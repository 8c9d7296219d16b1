"""The conformance suite's fixtures: every installed adapter, under every strategy it must support."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import jax
import numpy as np
import optax
import pytest
from conformance.adapters import TABLE, Adapter
from support.blobs import blob_batches

import ciclo

# The adapter modules import their framework: only the fixture loads them, for installed frameworks.
collect_ignore = ["adapters"]

STRATEGIES = ["eager", "jit", "data_parallel", "fsdp"]
"""The strategies every adapter is checked under (pmap keeps its own, older semantics)."""

KINDS = ["mlp", "bn_dropout"]
"""The models every adapter module builds (see `conformance.adapters`)."""

FEATURES, CLASSES, BATCH = 16, 10, 64

Batch = tuple[np.ndarray, np.ndarray]

blobs: Callable[..., list[Batch]] = functools.partial(
    blob_batches, features=FEATURES, classes=CLASSES, batch=BATCH, centres_dtype=np.float64
)
"""`blobs(batches, seed)`: a separable 10-class task, points around 10 fixed centres, in batches of 64."""


INSTALLED = [row for row in TABLE if row.available]
"""The adapters whose framework is installed in this environment (nox installs one per session)."""


@pytest.fixture(params=INSTALLED, ids=[row.name for row in INSTALLED])
def adapter(request: pytest.FixtureRequest) -> ModuleType:
    row: Adapter = request.param
    return row.load()


STANDARD_PROMOTION = {
    "equinox": "BatchNorm(mode='batch') computes `momentum**counter`, a Python float to an int32 power",
    "haiku": "BatchNorm's moving averages compute `decay**counter`; hk.dropout multiplies a bool mask",
}
"""The adapters whose framework strict dtype promotion rejects, and why: their rows run with standard."""


@pytest.fixture(autouse=True)
def _framework_dtype_promotion(request: pytest.FixtureRequest) -> Iterator[None]:
    """Standard dtype promotion for the rows of `STANDARD_PROMOTION`, strict for the others."""
    if "adapter" in request.fixturenames:
        name = request.getfixturevalue("adapter").NAME
    else:  # a class of the kit's clauses (test_conformance.ConformanceTests)
        name = getattr(request.cls, "adapter_name", None)
    if name in STANDARD_PROMOTION:
        with jax.numpy_dtype_promotion("standard"):
            yield
    else:
        yield


@pytest.fixture(params=STRATEGIES)
def strategy(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def accuracy(preds: jax.Array, target: jax.Array) -> jax.Array:
    return preds.argmax(-1) == target


TX = optax.adam(1e-2)
"""One optimizer for every state: it is a static field, and a new one would be a new program to trace."""

_SHARED: dict[tuple[str, str, str], ciclo.types.ModelState] = {}


def build(
    adapter: ModuleType, kind: str = "mlp", *, strategy: str, **overrides: Any
) -> ciclo.types.ModelState:
    """The state of model `kind` of `adapter` under `strategy`, with the suite's defaults.

    A state with the defaults is built once per adapter, model and strategy of
    `STRATEGIES` (none of which donates its buffers) and shared by the tests, so
    its steps compile once; a state with `overrides` is built from nothing.
    """
    if not overrides and strategy in STRATEGIES:
        key = (adapter.NAME, kind, strategy)
        if key not in _SHARED:
            _SHARED[key] = _build(adapter, kind, strategy=strategy)
        return _SHARED[key]
    return _build(adapter, kind, strategy=strategy, **overrides)


def _build(adapter: ModuleType, kind: str, *, strategy: str, **overrides: Any) -> ciclo.types.ModelState:
    settings: dict[str, Any] = {
        "tx": TX,
        "losses": {"loss": optax.softmax_cross_entropy_with_integer_labels},
        "metrics": {"accuracy": accuracy},
        "strategy": strategy,
        "key": jax.random.key(0),
        **overrides,
    }
    return adapter.make_state(kind, features=FEATURES, classes=CLASSES, **settings)


@pytest.fixture
def make_state(adapter: ModuleType, strategy: str) -> Callable[..., ciclo.types.ModelState]:
    """`make_state(kind, **overrides)` for the adapter and strategy under test, with the suite's defaults."""
    return functools.partial(build, adapter, strategy=strategy)
