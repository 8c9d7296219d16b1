"""The python blocks of docs/strategies.md run as written, and the page names every built-in strategy.

The blocks run in page order in one shared namespace, as a reader would paste them
into one session: later blocks use the model, data and steps defined by earlier ones.
Selecting one block (`-k`) first runs the blocks before it. A block preceded by an
HTML comment starting with `<!-- not run` (the multi-process script) is not collected.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.docs import DOCS, Session

import ciclo
from ciclo._src.strategies import _registry

PAGE = DOCS / "strategies.md"
BUILT_IN = ["eager", "jit", "jit_donate", "data_parallel", "fsdp", "pmap"]
BLOCKS = Session(PAGE).blocks


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    # A block registers strategies: keep them out of the global registry of other tests.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_registry, "_registered", {})
        yield Session(PAGE)


def test_the_page_has_runnable_and_skipped_blocks() -> None:
    assert len(BLOCKS) >= 5
    assert PAGE.read_text(encoding="utf-8").count("<!-- not run: needs several processes -->") == 1


def test_the_page_names_every_built_in_strategy() -> None:
    built_in = set(BUILT_IN) & set(ciclo.strategy_names())
    assert built_in == set(BUILT_IN)
    text = PAGE.read_text(encoding="utf-8")
    for name in sorted(built_in):
        assert f"`{name}`" in text, name


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_block_runs(session: Session, index: int) -> None:
    session.run_upto(index)
    assert session.done == index + 1
