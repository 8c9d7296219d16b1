"""Frozen dataclasses as pytrees that jax takes apart and rebuilds with no Python `__init__`.

A managed state crosses every compiled step twice. Unlike `register_dataclass`, rebuilding sets the
fields at once, with no `__init__`, and keeps the `(children, statics)` it was made from, so flattening
again is one attribute read (the fields are frozen). Key paths are the fields' names.

A compiled step returns its state flat (`as_flat`): its leaves and tree, rebuilt only when a field is
read (`rebuild`), so a loop that only steps never builds its dicts; such an object flattens as its
rebuilt self.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeVar

import jax

T = TypeVar("T", bound=type)

FLAT: Final = "_pytree_flat"  # an object's `(children, statics)`, in its `__dict__` once flattened or rebuilt
LAZY: Final = "_pytree_lazy"  # a flat object's `(leaves, tree)`, in its `__dict__` until it is rebuilt


class Flat:
    """The aux data of an object a compiled step returns flat: its tree, and its static fields."""

    __slots__ = ("statics", "tree")

    def __init__(self, tree: Any, statics: dict[str, Any]) -> None:
        self.tree, self.statics = tree, statics

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Flat) and other.tree == self.tree

    def __hash__(self) -> int:
        return hash(self.tree)


def as_flat(obj: Any) -> Any:
    """`obj` (of a `register_frozen` class) as an object of its class holding only its leaves and tree.

    Its static fields read as usual; reading another field rebuilds it (`rebuild`). Jax flattens it
    to the same leaves under a `Flat` node until `vars(obj).pop(FLAT)`, after which it flattens
    rebuilt (what a compiled step's caller does once jax has unflattened it).
    """
    leaves, tree = jax.tree.flatten(obj)
    statics = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.metadata.get("static")}
    return _lazy(type(obj), Flat(tree, statics), tuple(leaves))


def rebuild(obj: Any, name: str) -> Any:
    """`getattr(obj, name)` once `obj`, if flat, is rebuilt in place (`obj.__getattr__`)."""
    lazy = vars(obj).get(LAZY)
    if lazy is None or name.startswith("__"):  # the attribute's own AttributeError (a property's)
        return object.__getattribute__(obj, name)
    leaves, tree = lazy
    object.__setattr__(obj, "__dict__", vars(tree.unflatten(leaves)))
    return getattr(obj, name)


class Lazy:
    """A base of `register_frozen` classes whose objects a compiled step returns flat (`as_flat`).

    Such an object is rebuilt in place when a field is first read; until then a managed step passes
    its leaves straight to the program that returned it (`managed.ManagedStep`).
    """

    # `(leaves, tree)` of an object a compiled step returned flat, until a field is read.
    _pytree_lazy: ClassVar[Any] = None

    if not TYPE_CHECKING:  # typed, a `__getattr__` would make every misspelt attribute an `Any`

        def __getattr__(self, name: str) -> Any:
            return rebuild(self, name)


def _lazy(cls: type, aux: Flat, leaves: Any) -> Any:
    obj: Any = object.__new__(cls)
    values = aux.statics.copy()
    values[LAZY] = (leaves, aux.tree)
    values[FLAT] = (leaves, aux)
    object.__setattr__(obj, "__dict__", values)
    return obj


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

    def flatten_with_keys(obj: Any) -> tuple[list[tuple[Any, Any]], Any]:
        children, statics = getattr(obj, FLAT)
        if type(statics) is Flat:  # jax reads a compiled step's output with paths too
            return [(jax.tree_util.FlattenedIndexKey(i), child) for i, child in enumerate(children)], statics
        return list(zip(keys, children, strict=True)), statics

    def unflatten(statics: Any, children: Any) -> Any:
        children = tuple(children)
        if type(statics) is Flat:
            return _lazy(cls, statics, children)
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
