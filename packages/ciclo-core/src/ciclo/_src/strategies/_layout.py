"""How a mesh strategy lays out a state: rules by path, flax logical axis names, a fallback; checked."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ciclo._src.base.reprs import path_name, short
from ciclo._src.base.roles import Role, fields_with_role

LOGICAL_AXES_GROUP = "ciclo.logical_axes"
"""The entry point group of logical axis names' readers: `reader(params) -> {path: names}` (ciclo-flax)."""

_TYPED = (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)

_KERNELS = {"kernel": -1, "w": -1, "weight": 0}
"""A bias's sibling weights by name, and which of their dimensions is the output (flax, haiku, equinox)."""


def _axes(entry: Any) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def check_rules(
    rules: tuple[tuple[str, PartitionSpec], ...],
    logical: tuple[tuple[Any, Any], ...],
    mesh: tuple[str, ...],
    fallback: str,
) -> None:
    """Refuses, at construction, what no state can make right: unknown axes, bad regexes, doubled names."""
    if fallback not in ("fsdp", "replicate"):
        raise ValueError(f"fallback must be 'fsdp' or 'replicate', got {short(fallback)}")
    named = [(f"rule {short(p)}", a) for p, spec in rules for e in spec for a in _axes(e)]
    named += [(f"logical rule {short(n)}", a) for n, e in logical for a in _axes(e)]
    for rule, axis in named:
        if axis not in mesh:
            raise ValueError(
                f"{rule} names the mesh axis {short(axis)}, which the mesh has not: use one of {mesh}"
            )
    for pattern, _ in rules:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f"rule {short(pattern)} is not a regular expression: {error}") from None
    names = [name for name, _ in logical]
    doubled = sorted({name for name in names if names.count(name) > 1})
    if doubled:
        raise ValueError(
            f"logical_rules give {short(doubled[0])} {names.count(doubled[0])} rules: keep one per "
            "logical name (a tuple of mesh axes, e.g. ('fsdp', 'tensor'), splits one dimension over several)"
        )


def _logical_names(params: Any) -> dict[str, tuple[Any, ...]]:
    found: dict[str, tuple[Any, ...]] = {}
    for point in entry_points(group=LOGICAL_AXES_GROUP):
        found.update(point.load()(params))
    return found


def layout(
    tree: Any,
    mesh: Mesh,
    rules: tuple[tuple[str, PartitionSpec], ...],
    logical: tuple[tuple[str, Any], ...],
    fallback: Callable[[tuple[int, ...]], PartitionSpec],
    limit: int | None,
) -> Any:
    """The `NamedSharding` of each leaf of `tree` (a state: its params' leaves by the rules), checked."""
    names = fields_with_role(type(tree), Role.PARAMS)
    prefix = (jax.tree_util.GetAttrKey(names[0]),) if len(names) == 1 else ()
    params = getattr(tree, names[0]) if prefix else tree
    table = _logical_names(params) if logical else {}
    logical_rules, taken = dict(logical), [False] * len(rules)
    specs: dict[tuple[str, ...], tuple[tuple[int, ...], PartitionSpec]] = {}
    by_name: dict[str, tuple[tuple[int, ...], PartitionSpec]] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        name, shape = path_name(path), tuple(np.shape(leaf))
        found = next((i for i, (pattern, _) in enumerate(rules) if re.search(pattern, name)), None)
        if found is not None:
            taken[found] = True
            spec, origin = rules[found][1], f"rule {short(rules[found][0])}"
        elif name in table:
            missing = [n for n in table[name] if n is not None and n not in logical_rules]
            if missing:
                raise ValueError(
                    f"parameter {name} has the logical axis name {short(missing[0])}, which "
                    f"logical_rules do not map: add {{{missing[0]!r}: 'tensor'}} (a mesh axis), or "
                    f"{{{missing[0]!r}: None}} to keep that dimension whole"
                )
            spec = PartitionSpec(*(None if n is None else logical_rules[n] for n in table[name]))
            origin = f"logical names {table[name]}"
        else:
            spec, origin = fallback(shape), "the fallback"
        _check_leaf(name, shape, spec, origin, mesh)
        split = math.prod(mesh.shape[a] for e in spec for a in _axes(e))
        nbytes = math.prod(shape) * (leaf.dtype.itemsize if isinstance(leaf, _TYPED) else 8)
        if limit is not None and split == 1 and nbytes > limit:
            raise ValueError(
                f"parameter {name} {shape} ({nbytes:,} bytes) would be replicated on every device by "
                f"{origin}, above replicated_limit={limit:,}: add a rule for it, e.g. "
                f"({name!r}, P('fsdp')), or raise the limit"
            )
        specs[tuple(map(str, path))] = by_name[name] = (shape, spec)
    unused = [pattern for (pattern, _), hit in zip(rules, taken, strict=True) if not hit]
    if unused:
        listed = ", ".join(list(by_name)[:8]) + (", ..." if len(by_name) > 8 else "")
        raise ValueError(
            f"rule {short(unused[0])} matches no parameter (or only ones an earlier rule took): fix or drop "
            f"it; a renamed layer would otherwise load replicated. Parameters: {listed}"
        )
    unused_names = sorted(set(logical_rules) - {n for names in table.values() for n in names})
    if unused_names:
        raise ValueError(
            f"logical rule {short(unused_names[0])} matches no parameter's logical axis names "
            f"(found: {short(sorted({n for v in table.values() for n in v if n is not None}))}): fix or "
            "drop it. ciclo-flax reads flax's names (nn.with_logical_partitioning, nnx sharding= metadata): "
            "pip install ciclo-flax"
        )
    _check_biases(by_name)

    def sharding_of(path: tuple[Any, ...], leaf: Any) -> NamedSharding:
        keys, shape = tuple(map(str, path)), tuple(np.shape(leaf))
        if keys[: len(prefix)] == tuple(map(str, prefix)) and keys[len(prefix) :] in specs:
            return NamedSharding(mesh, specs[keys[len(prefix) :]][1])
        # Optimizer state, EMA, accumulated gradients: a leaf whose path ends with a parameter's, alike.
        for start in range(len(keys) + 1):
            mirrored = specs.get(keys[start:])
            if mirrored is not None and mirrored[0] == shape:
                return NamedSharding(mesh, mirrored[1])
        return NamedSharding(mesh, fallback(shape))

    return jax.tree_util.tree_map_with_path(sharding_of, tree)


def _check_leaf(name: str, shape: tuple[int, ...], spec: PartitionSpec, origin: str, mesh: Mesh) -> None:
    if len(spec) > len(shape):
        raise ValueError(
            f"parameter {name} {shape} has {len(shape)} dimensions, but {origin} lays out {len(spec)}: {spec}"
        )
    axes = [a for e in spec for a in _axes(e)]
    if len(set(axes)) < len(axes):
        raise ValueError(
            f"parameter {name}: {origin} gives {spec}, which uses a mesh axis twice; use each once"
        )
    for dim, entry in enumerate(spec):
        parts = math.prod(mesh.shape[a] for a in _axes(entry))
        if shape[dim] % parts:
            raise ValueError(
                f"parameter {name} {shape}: dimension {dim} ({shape[dim]}) does not split over mesh axes "
                f"{_axes(entry)} ({parts} devices) as {origin} lays it out ({spec}). Lay it out over axes "
                "whose sizes divide it, or None to keep it whole"
            )


def _check_biases(by_name: Mapping[str, tuple[tuple[int, ...], PartitionSpec]]) -> None:
    # XLA:CPU (jax 0.10.2) computes `x @ w + b` wrongly, with no error, when b is split over another mesh
    # axis than w's output dimension (seen on a (2, 2, 2) mesh: an all-reduce the partitioner leaves out).
    # A bias split where its kernel's output is whole is fsdp's own layout, and computes right.
    for name, (shape, spec) in by_name.items():
        parent, _, leaf = name.rpartition("/")
        if leaf not in ("bias", "b") or len(shape) != 1 or not spec or spec[0] is None:
            continue
        for kernel, out in _KERNELS.items():
            kernel_name = f"{parent}/{kernel}" if parent else kernel
            found = by_name.get(kernel_name)
            if found is None or len(found[0]) < 2 or found[0][out] != shape[0]:
                continue
            entry = (*found[1], *(None,) * len(found[0]))[out % len(found[0])]
            if _axes(entry) and _axes(entry) != _axes(spec[0]):
                raise ValueError(
                    f"bias {name} is split over {_axes(spec[0])}, but its kernel {kernel_name} {found[0]} "
                    f"lays out its output dimension over {_axes(entry)} ({found[1]}): XLA computes "
                    f"x @ kernel + bias wrongly for such a pair. Put the rule ({f'^{name}$'!r}, "
                    f"P({entry!r})) first, so that the bias follows its kernel"
                )
