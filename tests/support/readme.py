"""The python blocks of a package's README (its page on the package index), run in page order."""

from __future__ import annotations

from pathlib import Path

from support import docs

PACKAGES = Path(__file__).parents[2] / "packages"


def run_readme(distribution: str) -> dict[str, object]:
    """Runs every python block of `packages/<distribution>/README.md` in one namespace; returns it."""
    session = docs.Session(PACKAGES / distribution / "README.md")
    assert session.blocks, f"{distribution}'s README has no python block"
    session.run_upto(len(session.blocks) - 1)
    return session.namespace
