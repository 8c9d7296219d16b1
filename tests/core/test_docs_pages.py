"""Every python block of every page under docs/ runs as written, in page order, one namespace per page.

A reader pastes a page's blocks into one session: later blocks use the names
that earlier ones define. A block preceded by `<!-- not run: ... -->` is a
sketch (the seeds' snippets run in full in tests/core/test_seeds.py); a block
preceded by `<!-- requires MODULE -->` needs MODULE, and where MODULE is not
installed that block and the rest of its page are left out (later blocks may
use its names), as the other optional cases of the suite are.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import jax
import pytest
from support.docs import DOCS, Session, installed

from ciclo._src.strategies import _registry

PAGES = sorted(DOCS.rglob("*.md"))


def runnable(page: Path) -> int:
    """How many of the page's blocks run here: up to the first that needs a module not installed."""
    for index, (_, requirement) in enumerate(Session(page).blocks):
        if requirement is not None and not installed(requirement):
            return index
    return len(Session(page).blocks)


CASES = [
    pytest.param(page, index, id=f"{page.relative_to(DOCS).as_posix()}[{index}]")
    for page in PAGES
    for index in range(runnable(page))
]

# Keras adds biases with implicit rank promotion, which the test suite otherwise forbids; haiku's
# BatchNorm (`decay**counter`) and hk.dropout (a bool mask times float32) need standard dtype promotion.
CONTEXTS = {
    "keras": lambda: jax.numpy_rank_promotion("allow"),
    "haiku": lambda: jax.numpy_dtype_promotion("standard"),
}


PAGE_CONTEXTS = {
    # optax's warmup and cosine schedules compute with Python floats and the int32 step count.
    "recipes.md": lambda: jax.numpy_dtype_promotion("standard"),
}
"""Pages whose blocks run with a context of their own, whatever they require."""


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Path, Session]]:
    # Blocks write checkpoints to relative paths and register strategies: keep both out of
    # the repository and of the other tests' registry.
    cwd = Path.cwd()
    os.chdir(tmp_path_factory.mktemp("docs"))
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_registry, "_strategies", dict(_registry._strategies))
            yield {}
    finally:
        os.chdir(cwd)


def test_the_pages_have_runnable_blocks() -> None:
    pages = {page.relative_to(DOCS).as_posix() for page, *_ in (case.values for case in CASES)}
    assert {"index.md", "getting-started.md", "guide.md", "loops.md", "metrics.md", "strategies.md"} <= pages
    assert {"adapter.md", "migration.md"} <= pages


@pytest.mark.parametrize(("page", "index"), CASES)
def test_block_runs(sessions: dict[Path, Session], page: Path, index: int) -> None:
    session = sessions.setdefault(page, Session(page))
    _, requirement = session.blocks[index]
    context = CONTEXTS.get(requirement or "", PAGE_CONTEXTS.get(page.name, contextlib.nullcontext))
    with context():
        session.run_upto(index)
    assert session.done == index + 1
