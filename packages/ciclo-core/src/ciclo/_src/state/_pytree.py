"""Frozen dataclasses as pytrees that jax takes apart and rebuilds with no Python `__init__`.

A managed state crosses every compiled step twice. Unlike `register_dataclass`, rebuilding sets the
fields at once, with no `__init__`, and keeps the `(children, statics)` it was made from, so flattening
again is one attribute read (the fields are frozen). Key paths are the fields' names.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any, Final, TypeVar

import jax

T = TypeVar("T", bound=type)

FLAT: Final = "_pytree_flat"  # an object's `(children, statics)`, in its `__dict__` once flattened or rebuilt


def register_frozen(cls: T) -> T:
    """Registers the frozen dataclass `cls` as a pytree: fields with `metadata={"static": True}` are static.

    Example:
        >>> import dataclasses, jax
        >>> @register_frozen
        ... @dataclasses.dataclass(frozen=True)
        ... class Pair:
        ...     value: float
        ...     name: str = dataclasses.field(metadata={"static": True})
        >>> leaves, tree = jax.tree.flatten(Pair(1.0, "a"))
        >>> leaves, jax.tree.unflatten(tree, [2.0])
        ([1.0], Pair(value=2.0, name='a'))
    """
    fields = dataclasses.fields(cls)
    data = tuple(f.name for f in fields if not f.metadata.get("static"))
    static = tuple(f.name for f in fields if f.metadata.get("static"))
    names = data + static
    keys = tuple(jax.tree_util.GetAttrKey(name) for name in data)
    new, set_ = object.__new__, object.__setattr__

    def flat(self: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return tuple(getattr(self, name) for name in data), tuple(getattr(self, name) for name in static)

    def flatten_with_keys(obj: Any) -> tuple[list[tuple[Any, Any]], tuple[Any, ...]]:
        children, statics = getattr(obj, FLAT)
        return list(zip(keys, children, strict=True)), statics

    def unflatten(statics: tuple[Any, ...], children: Any) -> Any:
        children = tuple(children)
        obj: Any = new(cls)  # no `__init__` and no validation: jax also rebuilds with placeholders as leaves
        # No `strict=` (jax passes one child per data field): a keyword makes `zip` ~0.2 µs slower.
        values = dict(zip(names, children + statics), _pytree_flat=(children, statics))  # noqa: B905
        set_(obj, "__dict__", values)
        return obj

    cached = functools.cached_property(flat)
    cached.__set_name__(cls, FLAT)
    setattr(cls, FLAT, cached)
    jax.tree_util.register_pytree_with_keys(
        cls, flatten_with_keys, unflatten, flatten_func=operator.attrgetter(FLAT)
    )
    return cls
