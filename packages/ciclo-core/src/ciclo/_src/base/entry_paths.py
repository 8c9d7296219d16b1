"""Where a log key such as `"loss"` or `"metrics.loss"` lives among `(collection, name)` paths."""

from __future__ import annotations

from ciclo._src.base.reprs import short

EntryPath = tuple[str, str]


def entry_path(key: str, paths: set[EntryPath] | frozenset[EntryPath]) -> EntryPath | None:
    """The `(collection, name)` path of `key` among `paths`, or None; a ValueError if ambiguous.

    Example:
        >>> entry_path("loss", {("losses", "loss"), ("metrics", "accuracy")})
        ('losses', 'loss')
    """
    if not isinstance(key, str):
        raise TypeError(f"log keys are strings, got {short(key)}")
    collection, dot, name = key.partition(".")
    if dot:
        return (collection, name) if (collection, name) in paths else None
    found = sorted(path for path in paths if path[1] == key)
    if len(found) > 1:
        options = " and ".join(f"'{c}.{n}'" for c, n in found)
        raise ValueError(f"key {short(key)} is ambiguous: found {options}; use the full path")
    return found[0] if found else None
