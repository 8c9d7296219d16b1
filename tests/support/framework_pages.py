"""Runs a framework page of docs/frameworks/ from its first block to its last, in a scratch directory."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from support.docs import DOCS, Session

FRAMEWORK_PAGES = DOCS / "frameworks"


def run_page(name: str, directory: Path, context: Any = None) -> dict[str, Any]:
    """Runs every block of `docs/frameworks/<name>.md` in `directory`; returns the page's namespace."""
    session = Session(FRAMEWORK_PAGES / f"{name}.md")
    assert session.blocks, f"{name}.md has no python blocks"
    cwd = Path.cwd()
    os.chdir(directory)
    try:
        with context if context is not None else contextlib.nullcontext():
            session.run_upto(len(session.blocks) - 1)
    finally:
        os.chdir(cwd)
    return session.namespace
