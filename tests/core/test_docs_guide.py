"""docs/guide.md, the loop language: its runnable blocks run in tests/core/test_docs_pages.py.

Blocks marked `<!-- not run: a sketch ... -->` are the seeds' snippets, which
tests/core/test_seeds.py runs in their full form.
"""

from __future__ import annotations

from support.docs import DOCS, Session

PAGE = DOCS / "guide.md"


def test_the_page_has_runnable_blocks() -> None:
    assert len(Session(PAGE).blocks) >= 4


def test_the_page_shows_restore_best_weights() -> None:
    assert any("restore_best_weights=True" in code for code, _ in Session(PAGE).blocks)
