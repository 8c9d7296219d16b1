"""The runnable python blocks of docs/guide.md run as written, in page order, in one namespace.

Blocks marked `<!-- not run: a sketch ... -->` are the seeds' snippets, which
tests/core/test_seeds.py runs in their full form.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.docs import DOCS, Session

PAGE = DOCS / "guide.md"
BLOCKS = Session(PAGE).blocks


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    # Blocks may write checkpoints to relative paths: keep them in a temporary directory.
    cwd = Path.cwd()
    os.chdir(tmp_path_factory.mktemp("guide"))
    try:
        yield Session(PAGE)
    finally:
        os.chdir(cwd)


def test_the_page_has_runnable_blocks() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_block_runs(session: Session, index: int) -> None:
    session.run_upto(index)
    assert session.done == index + 1
