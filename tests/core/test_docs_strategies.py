"""The python blocks of docs/strategies.md run as written, and the page names every built-in strategy.

The blocks run in page order in one shared namespace, as a reader would paste them
into one session: later blocks use the model, data and steps defined by earlier ones.
Selecting one block (`-k`) first runs the blocks before it. A block preceded by an
HTML comment starting with `<!-- not run` (the multi-process script) is not collected.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ciclo
from ciclo._src.strategies import _registry

PAGE = Path(__file__).parents[2] / "docs" / "strategies.md"
BUILT_IN = ["eager", "jit", "jit_donate", "data_parallel", "fsdp", "pmap"]
_BLOCK = re.compile(r"^```python\n(?P<code>.*?)^```$", re.DOTALL | re.MULTILINE)


def runnable_blocks() -> list[str]:
    """The ```python blocks of the page, without those marked `<!-- not run ... -->`."""
    text = PAGE.read_text(encoding="utf-8")
    blocks = []
    for match in _BLOCK.finditer(text):
        before = text[: match.start()].rstrip().rsplit("\n", 1)[-1].strip()
        if not before.startswith("<!-- not run"):
            blocks.append(match["code"])
    return blocks


BLOCKS = runnable_blocks()


class _Session:
    """One namespace for the whole page, and how far into the page it has run."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {"__name__": "docs_strategies"}
        self.done = 0

    def run_upto(self, index: int) -> None:
        while self.done <= index:
            # dont_inherit: the blocks run without this module's `from __future__ import annotations`.
            code = compile(BLOCKS[self.done], f"{PAGE.name}[block {self.done}]", "exec", dont_inherit=True)
            self.done += 1
            exec(code, self.namespace)


@pytest.fixture(scope="module")
def session() -> Iterator[_Session]:
    # A block registers strategies: keep them out of the global registry of other tests.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_registry, "_registered", {})
        yield _Session()


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
def test_block_runs(session: _Session, index: int) -> None:
    session.run_upto(index)
    assert session.done == index + 1
