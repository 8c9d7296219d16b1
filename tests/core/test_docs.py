"""The python blocks of docs/strategies.md run as written (each on its own), and cover every strategy."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ciclo
from ciclo._src.strategies import _registry

PAGE = Path(__file__).parents[2] / "docs" / "strategies.md"
NOT_RUN = "<!-- not run: needs several processes -->"


def _blocks() -> list[str]:
    text = PAGE.read_text()
    blocks = []
    for match in re.finditer(r"(?P<before>[^\n]*)\n```python\n(?P<code>.*?)```", text, re.DOTALL):
        if match["before"].strip() != NOT_RUN:
            blocks.append(match["code"])
    return blocks


def test_the_page_has_runnable_blocks_and_names_every_strategy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_registry, "_registered", {})
    assert len(_blocks()) == 4
    text = PAGE.read_text()
    for name in ciclo.strategy_names():
        assert f"`{name}`" in text, name


@pytest.mark.parametrize("index", range(4))
def test_block_runs(index: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_registry, "_registered", {})  # the last block registers a strategy
    exec(compile(_blocks()[index], f"{PAGE.name}[{index}]", "exec"), {"__name__": "docs"})
