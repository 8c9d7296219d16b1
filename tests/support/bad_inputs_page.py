"""docs/bad_inputs.md's tables, read for the tests that raise each row's case and compare its quotes.

A row is `| mistake | message (abridged) | fix |`; each `code span` of its message
cell quotes the message (or a note or warning) that the row's case raises, `...`
standing for the text left out. A test links each row, by its mistake cell, to the
case that raises it (tests/core/test_bad_inputs.py, and for what needs a framework
tests/adapters/flax/test_bad_inputs.py), so the page's quotes cannot drift from the code.
"""

from __future__ import annotations

import re

from support.docs import DOCS

PAGE = DOCS / "bad_inputs.md"

FRAMEWORK_ROWS = frozenset({"a model that is not a flax module", "an nnx module given inputs="})
"""The rows whose case needs flax: tests/adapters/flax/test_bad_inputs.py links them."""


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split(" | ")]


def rows() -> dict[str, list[str]]:
    """Each row's mistake cell -> the quotes of its message cell, for every table of the page."""
    found: dict[str, list[str]] = {}
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| ") or line.startswith(("| Mistake |", "|---")):
            continue
        mistake, message, _ = _cells(line)
        assert mistake not in found, f"two rows for {mistake}"
        # A quote holding a backtick is written ``like `this` one``.
        found[mistake] = [double or single for double, single in re.findall(r"``(.+?)``|`([^`]+)`", message)]
        assert found[mistake], f"the row {mistake} quotes no message"
    return found


def pattern(quote: str) -> str:
    """The regex of a quote: its text as written, `...` matching any text left out, a space any spaces.

    A table cell holds one line: a space of the quote stands for a line break of the message too.
    """
    parts = (re.sub(r"(\\ )+", r"\\s+", re.escape(part.strip())) for part in quote.split("..."))
    return r"[\s\S]*?".join(parts)


def check(mistake: str, message: str) -> None:
    """Asserts that `message` (with its notes) says each quote of the row `mistake` of the page."""
    for quote in rows()[mistake]:
        assert re.search(pattern(quote), message), (
            f"docs/bad_inputs.md, row {mistake}: the quote\n  {quote}\nis not in the message\n  {message}"
        )
