"""Bounded reprs of user values, for error messages and notes: a 200-batch dataset is not quoted whole."""

from __future__ import annotations

import math
import reprlib
from collections.abc import Sequence
from typing import Any

LIMIT = 300
_ARRAY_ITEMS = 16  # a larger array is shown by type, shape and dtype


class _Short(reprlib.Repr):
    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = self.maxfrozenset = self.maxdeque = 8
        self.maxstring = 160
        self.maxlong = 60
        self.maxother = 160

    def repr1(self, x: Any, level: int) -> str:
        shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        if isinstance(shape, tuple) and dtype is not None:
            if math.prod(d for d in shape if isinstance(d, int)) > _ARRAY_ITEMS:
                return f"{type(x).__name__} of shape {shape} and dtype {dtype}"
        return super().repr1(x, level)


_SHORT = _Short()


def short(value: Any, limit: int = LIMIT) -> str:
    """`repr(value)`, cut to at most `limit` characters; large arrays as type, shape and dtype.

    Example:
        >>> import numpy as np
        >>> short("a"), short([1, 2])
        ("'a'", '[1, 2]')
        >>> short(list(range(1000)))
        '[0, 1, 2, 3, 4, 5, 6, 7, ...]'
        >>> short(np.zeros((200, 64), np.float32))
        'ndarray of shape (200, 64) and dtype float32'
    """
    try:
        text = _SHORT.repr(value)
    except Exception:  # a broken __repr__ must not hide the error being reported
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cut(text: str, limit: int = LIMIT) -> str:
    """`text` of ciclo's own making, cut in its middle to at most `limit` characters (no quotes added).

    Example:
        >>> cut("backup['a']['b']"), len(cut("state" + "['key']" * 1000))
        ("backup['a']['b']", 300)
    """
    if len(text) <= limit:
        return text
    head = (limit - 3) // 2
    return text[:head] + "..." + text[len(text) - (limit - 3 - head) :]


def key_names(path: Sequence[Any]) -> tuple[str, ...]:
    """A pytree path's keys as strings (jax's key path or names; orbax stores dataclasses as dicts)."""
    return tuple(str(getattr(key, "key", getattr(key, "idx", getattr(key, "name", key)))) for key in path)


def path_name(path: Sequence[Any]) -> str:
    """A state's leaf as ciclo names it: its keys joined by "/", without a last `value` (nnx variables).

    The one spelling of `ciclo.summary`, restore reports, structure errors and mesh rules.

    Example:
        >>> import jax
        >>> tree = {"dense": {"kernel": 1}, "out": {"bias": {"value": 2}}}
        >>> [path_name(path) for path, _ in jax.tree_util.tree_leaves_with_path(tree)]
        ['dense/kernel', 'out/bias']
    """
    names = key_names(path)
    return "/".join(names[:-1] if len(names) > 1 and names[-1] == "value" else names)
