"""docs/strategies.md names every built-in strategy; its blocks run in tests/core/test_docs_pages.py.

The blocks run in page order in one shared namespace, as a reader would paste them
into one session: later blocks use the model, data and steps defined by earlier ones.
A block preceded by an HTML comment starting with `<!-- not run` (the multi-process
script) is not run.
"""

from __future__ import annotations

from support.docs import DOCS, Session

import ciclo

PAGE = DOCS / "strategies.md"
BUILT_IN = ["eager", "jit", "jit_donate", "data_parallel", "fsdp", "pmap"]
BLOCKS = Session(PAGE).blocks


def test_the_page_has_runnable_and_skipped_blocks() -> None:
    assert len(BLOCKS) >= 5
    assert PAGE.read_text(encoding="utf-8").count("<!-- not run: needs several processes -->") == 1


def test_the_page_names_every_built_in_strategy() -> None:
    built_in = set(BUILT_IN) & set(ciclo.strategies.strategy_names())
    assert built_in == set(BUILT_IN)
    text = PAGE.read_text(encoding="utf-8")
    for name in sorted(built_in):
        assert f"`{name}`" in text, name
