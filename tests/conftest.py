"""Shared test configuration: stricter JAX, small synthetic datasets."""

from __future__ import annotations

import functools
import importlib.util
import signal
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import optax
import pytest

# Implicit rank promotion hides shape bugs; tests should fail loudly instead.
jax.config.update("jax_numpy_rank_promotion", "raise")
# Implicit dtype promotion (float32 + a Python float64 array, int + float) hides precision bugs.
jax.config.update("jax_numpy_dtype_promotion", "strict")


def _with_standard_promotion(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with jax.numpy_dtype_promotion("standard"):
            return fn(*args, **kwargs)

    return wrapped


# optax 0.2.8's bias correction (adam, adamw, nadam, ...) computes `decay**count`, a Python float
# to the power of the int32 step count, which strict promotion rejects. Only that one function runs
# with standard promotion (optax's transforms look it up as `optax.tree.bias_correction` at each
# call); the rest of optax, and all of ciclo, still run strict.
optax.tree.bias_correction = _with_standard_promotion(optax.tree.bias_correction)

# haiku's BatchNorm (its moving averages compute `decay**counter`) and hk.dropout (a bool mask times
# float32 inputs) reject strict promotion: ciclo-haiku's doctests run with standard promotion, and
# so do the haiku tests (tests/adapters/haiku, the haiku row of tests/conformance).
STANDARD_PROMOTION_DOCTESTS = ("ciclo_haiku",)


# Doctests of modules behind an optional extra run where the extra is installed (`tests(loggers)`).
DOCTEST_REQUIRES = {
    "ciclo._src.callbacks._loggers._tensorboard": "tensorboardX",
    # Its example is a grain iterator; grain installs on Python >= 3.11 only.
    "ciclo._src.data.prefetch.StatefulPrefetched": "grain",
    "ciclo._src.state.export": "flatbuffers",  # jax.export's serialization (the export extra)
}


SHARDED_STRATEGIES = ("data_parallel", "fsdp", "mesh", "pmap")
"""The strategies whose cases mean something more on several devices than on one."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--sharded-only",
        action="store_true",
        help="outside tests/multidevice, keep only the cases of the sharded strategies "
        f"({', '.join(SHARDED_STRATEGIES)}): `nox -s multidevice` runs them on 4 devices, "
        "after `tests(core)` ran every case on one",
    )


def _runs_on_several_devices(item: pytest.Item) -> bool:
    if "multidevice" in item.path.parts:
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("strategy") in SHARDED_STRATEGIES


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--sharded-only"):
        deselected = [item for item in items if not _runs_on_several_devices(item)]
        items[:] = [item for item in items if _runs_on_several_devices(item)]
        config.hook.pytest_deselected(items=deselected)
    for item in items:
        if isinstance(item, pytest.DoctestItem) and item.name.startswith(STANDARD_PROMOTION_DOCTESTS):
            item.runtest = _with_standard_promotion(item.runtest)  # type: ignore[method-assign]
        if isinstance(item, pytest.DoctestItem):
            for module, needed in DOCTEST_REQUIRES.items():
                if item.name.startswith(module) and importlib.util.find_spec(needed) is None:
                    item.add_marker(pytest.mark.skip(reason=f"needs {needed} (a ciclo-core extra)"))


@pytest.fixture(autouse=True, scope="session")
def ctrl_c_as_on_a_terminal() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt, as in a terminal, also where the suite was started with it ignored.

    A shell starts background jobs (and some CI runners start their steps) with SIGINT ignored, and
    Python then installs no handler: the tests that send a real SIGINT, and the processes they start,
    would see nothing. With the handler set here, child processes start with SIGINT at its default.
    """
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture
def standard_dtype_promotion() -> Iterator[None]:
    """Standard dtype promotion for one test, for third-party code strict promotion rejects.

    Use it with `@pytest.mark.usefixtures("standard_dtype_promotion")` and a
    comment saying which library needs it, and why.
    """
    with jax.numpy_dtype_promotion("standard"):
        yield


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


STRATEGIES = ["eager", "jit", "jit_donate", "data_parallel", "fsdp", "mesh", "pmap"]
"""Every built-in strategy; `test_registry` fails when one is missing here."""


@pytest.fixture(params=STRATEGIES)
def strategy(request: pytest.FixtureRequest) -> str:
    """Each built-in strategy's name in turn: one test body, every strategy."""
    return str(request.param)
