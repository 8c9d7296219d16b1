"""Runs the python blocks of a documentation page, in page order, in one namespace."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

DOCS = Path(__file__).parents[2] / "docs"
_BLOCK = re.compile(r"^```python\n(?P<code>.*?)^```$", re.DOTALL | re.MULTILINE)


def python_blocks(page: Path) -> list[tuple[str, str | None]]:
    """`(code, requirement)` for each ```python block not marked `<!-- not run ... -->`.

    A block right after `<!-- requires keras -->` needs the module `keras`.
    """
    text = page.read_text(encoding="utf-8")
    blocks = []
    for match in _BLOCK.finditer(text):
        before = text[: match.start()].rstrip().rsplit("\n", 1)[-1].strip()
        if before.startswith("<!-- not run"):
            continue
        required = re.fullmatch(r"<!-- requires (\S+) -->", before)
        blocks.append((match["code"], required[1] if required else None))
    return blocks


def installed(module: str) -> bool:
    """True when `module` is importable as a real module (not a namespace folder of the tests)."""
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.origin is not None


class Session:
    """One namespace for a whole page, and how far into the page it has run."""

    def __init__(self, page: Path) -> None:
        self.page = page
        self.blocks = python_blocks(page)
        self.namespace: dict[str, Any] = {"__name__": f"docs_{page.stem}"}
        self.done = 0

    def run_upto(self, index: int) -> None:
        while self.done <= index:
            code, _ = self.blocks[self.done]
            # dont_inherit: the blocks run without the caller's `from __future__ import annotations`.
            compiled = compile(code, f"{self.page.name}[block {self.done}]", "exec", dont_inherit=True)
            self.done += 1
            exec(compiled, self.namespace)


def reference_hook() -> ModuleType:
    """docs/hooks/reference.py, the mkdocs hook that generates the API reference, loaded as a module."""
    spec = importlib.util.spec_from_file_location("ciclo_docs_reference", DOCS / "hooks/reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module
