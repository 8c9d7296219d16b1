"""The python blocks of the repository's README.md run, in page order, in one namespace.

The README's snippets leave the reader's own data, model and update function
unnamed (`train_batches`, `model`, `update`, ...): `GIVEN` defines those, small
and synthetic, and nothing else, so a snippet that forgets an import (as the
first one did with `jnp`) fails here. A block preceded by
`<!-- requires MODULE -->` is skipped where MODULE is not installed; the blocks
after it do not use its names.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.docs import Session, installed

README = Path(__file__).parents[2] / "README.md"
BLOCKS = Session(README).blocks


def available(module: str) -> bool:
    """`support.docs.installed`, also for a dotted name whose parent package is missing."""
    try:
        return installed(module)
    except ModuleNotFoundError:
        return False


def given() -> dict[str, Any]:
    """What the README's prose leaves to the reader: data, a model and an update function."""
    rng = np.random.default_rng(0)

    def digits(n: int) -> list[tuple[np.ndarray, np.ndarray]]:
        return [
            (rng.normal(size=(8, 64)).astype(np.float32), rng.integers(0, 10, size=8).astype(np.int32))
            for _ in range(n)
        ]

    x = rng.normal(size=(8, 2)).astype(np.float32)
    return {
        # "Keras-like training": two epochs of 100 steps, each with its test loop.
        "train_batches": digits(200),
        "test_batches": digits(2),
        # "The loop language": any pytree as state and a function that updates it.
        "update": lambda state, batch: (state + 1, (batch**2).mean()),
        "total_steps": 6,
        # "The managed API": a linear model, and the batches the fused steps run over.
        "model": lambda params, x: x @ params,
        "params": np.zeros(2, np.float32),
        "batch": (x, x @ np.array([1.0, -1.0], np.float32)),
    }


@pytest.fixture(scope="module")
def namespace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    # The loop-language block checkpoints to a relative path: keep it out of the repository.
    cwd = Path.cwd()
    os.chdir(tmp_path_factory.mktemp("readme"))
    try:
        yield {"__name__": "readme", **given()}
    finally:
        os.chdir(cwd)


DONE = "__blocks_done__"
"""The namespace's count of the README blocks run in it."""

# Set up before the block that contains the key: the loop-language snippet's own state and dataset
# (not the state an earlier block trained), the fused snippet's 64 batches of the managed model.
SETUP = {
    "update(state, batch)": lambda names: names.update(
        state=np.float32(0.0), dataset=[np.ones(4, np.float32)] * 10
    ),
    "ciclo.stacked(dataset, 32)": lambda names: names.update(dataset=[names["batch"]] * 64),
}


def test_the_readme_has_python_blocks_and_each_setup_meets_one() -> None:
    assert len(BLOCKS) >= 4
    for key in SETUP:
        assert sum(key in code for code, _ in BLOCKS) == 1, key


def run_block(namespace: dict[str, Any], index: int) -> None:
    code, requirement = BLOCKS[index]
    if requirement is not None and not available(requirement):
        return  # the blocks after it do not use its names
    for key, setup in SETUP.items():
        if key in code:
            setup(namespace)
    exec(compile(code, f"README.md[block {index}]", "exec", dont_inherit=True), namespace)
    if "update(state, batch)" in code:
        assert namespace["steps"] == list(range(namespace["total_steps"]))


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_block_runs(namespace: dict[str, Any], index: int) -> None:
    _, requirement = BLOCKS[index]
    if requirement is not None and not available(requirement):
        pytest.skip(f"README block {index} needs {requirement}, which is not installed")
    # In page order, in this worker's namespace: a pytest-xdist worker given a later block alone
    # runs the blocks before it first.
    done = namespace.setdefault(DONE, 0)
    for earlier in range(done, index + 1):
        namespace[DONE] = earlier + 1
        run_block(namespace, earlier)
