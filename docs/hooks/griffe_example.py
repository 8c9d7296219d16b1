"""A griffe extension: ciclo's docstrings head their doctests `Example:`, which griffe reads as `Examples:`.

Google's style guide and ruff accept both headings; griffe renders only
`Examples:` as code, and would read the `>>>` lines of an `Example:` section as
markdown (where `[0, 2, 4]` in an output is a link).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_HEADING = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Renames each docstring's `Example:` heading to `Examples:` before griffe parses it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:  # noqa: D102
        if obj.docstring is not None:
            obj.docstring.value = _HEADING.sub(r"\1Examples:", obj.docstring.value)
