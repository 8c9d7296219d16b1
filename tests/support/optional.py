"""Optional test dependencies: the cases that need one exist only where it is installed."""

from __future__ import annotations

import importlib
from types import ModuleType


def optional(module: str) -> ModuleType | None:
    """`module` imported, or None where it is not installed (jax_metrics needs Python < 3.12).

    Tests build their parameter lists from it, so a missing dependency leaves
    its cases out instead of reporting them skipped.
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        return None
