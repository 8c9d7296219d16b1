"""`ciclo.summary`: how many parameters a state holds, how much memory its arrays take, and where."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import IO, Any, NamedTuple

import jax
from jax.sharding import NamedSharding

from ciclo._src.base.reprs import path_name
from ciclo._src.base.roles import Role, fields_with_role
from ciclo._src.state.managed import AbstractManagedState

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human(size: int) -> str:
    """A byte count in binary units: `human(1536) == "1.5 KiB"`."""
    if size < 1024:
        return f"{size} B"
    power = min((size.bit_length() - 1) // 10, len(_UNITS) - 1)
    return f"{size / 1024**power:.1f} {_UNITS[power]}"


class Leaf(NamedTuple):
    """One array of a state, as `layout` finds it."""

    path: tuple[Any, ...]
    shape: tuple[int, ...]
    elements: int
    nbytes: int
    per_device: int  # the bytes of the largest part one device holds
    spec: str  # "single device", "replicated", or the `PartitionSpec` of a split array

    def key(self, start: int, stop: int | None = None) -> str:
        """The "/"-joined keys of `path[start:stop]` (`path_name`)."""
        return path_name(self.path[start:stop])


def _leaf(path: tuple[Any, ...], shape: Any, leaf: Any) -> Leaf:
    # `shape`: a `jax.ShapeDtypeStruct` of the global shape (a typed key's dtype has an itemsize).
    elements = math.prod(shape.shape)
    nbytes = elements * shape.dtype.itemsize
    sharding = leaf.sharding if isinstance(leaf, jax.Array) else None
    if sharding is None or len(sharding.device_set) == 1:
        return Leaf(path, shape.shape, elements, nbytes, nbytes, "single device")
    per_device = math.prod(sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
    if per_device == nbytes:  # every device holds it whole (pmap's copies too)
        spec = "replicated"
    else:
        spec = str(sharding.spec) if isinstance(sharding, NamedSharding) else str(sharding)
    return Leaf(path, shape.shape, elements, nbytes, per_device, spec)


def layout(state: Any) -> list[Leaf]:
    """Each array of `state`: its path, global shape, size, bytes per device and partition spec."""
    # The shapes without computing any array; `unplace` removes `pmap`'s device axis.
    shapes = jax.eval_shape(
        state.strategy.unplace if isinstance(state, AbstractManagedState) else lambda tree: tree, state
    )
    paths = jax.tree_util.tree_leaves_with_path(shapes)
    return [
        _leaf(path, shape, leaf) for (path, shape), leaf in zip(paths, jax.tree.leaves(state), strict=True)
    ]


def _sum(leaves: list[Leaf], *, elements: bool = True) -> tuple[int | None, int, int]:
    counted = sum(leaf.elements for leaf in leaves) if elements else None
    return counted, sum(leaf.nbytes for leaf in leaves), sum(leaf.per_device for leaf in leaves)


def _table(header: Sequence[str], lines: Sequence[Sequence[str]], *, total: bool) -> str:
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        first, *others = row
        return "  ".join(
            [first.ljust(widths[0]), *(n.rjust(w) for n, w in zip(others, widths[1:], strict=True))]
        )

    rule = "-" * len(line(header))
    rows = [line(header), rule, *map(line, lines)]
    if total:  # the last row is a total, under a rule
        rows.insert(-1, rule)
    return "\n".join(rows)


def summary(state: Any, *, file: IO[str] | None = None) -> str:
    """Prints and returns a table of a state's parameters and memory, by top-level module.

    Sizes are those of the global shapes, read without copying anything; a pytree without a
    `managed.Role.PARAMS` field is summarised as parameters. A state spread over several devices also
    gets each row's bytes per device, and a table of each parameter's partition spec and bytes per
    device. `file`: where to print (`sys.stdout`).

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> params = {"dense": {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}, "scale": jnp.ones(())}
        >>> text = ciclo.summary(managed.ManagedState.create(params=params, tx=optax.adam(0.1)))
                         parameters  bytes   size
        -----------------------------------------
        dense                     8     32   32 B
        scale                     1      4    4 B
        params                    9     36   36 B
        optimizer state           -     76   76 B
        other                     -      4    4 B
        -----------------------------------------
        total                     9    116  116 B
    """
    leaves = layout(state)
    kind = type(state)
    params_names = fields_with_role(kind, Role.PARAMS)
    depth = int(len(params_names) == 1)  # a module is named by the key after the params field, or the first
    by_field: dict[str, list[Leaf]] = {}
    for leaf in leaves:
        by_field.setdefault(leaf.key(0, 1), []).append(leaf)

    def take(*fields: str) -> list[Leaf]:  # what is left in the end is "other"
        return [leaf for name in fields for leaf in by_field.pop(name, [])]

    params = take(*params_names) if depth else leaves
    modules: dict[str, list[Leaf]] = {}
    for leaf in params:
        modules.setdefault(leaf.key(depth, depth + 1) or "(params)", []).append(leaf)
    rows: list[tuple[str, int | None, int | None, int | None]] = [
        (n, *_sum(group)) for n, group in modules.items()
    ]
    if depth:
        rows.append(("params", *_sum(params)))
        model_state = take(*fields_with_role(kind, Role.MODEL_STATE))
        if model_state:
            rows.append(("model state", *_sum(model_state, elements=False)))
        if isinstance(state, AbstractManagedState) and state.tx is None:
            rows.append(("no optimizer (no tx)", None, None, None))  # a state for inference
        elif isinstance(state, AbstractManagedState):
            rows.append(("optimizer state", *_sum(take("opt_state"), elements=False)))
        rows.append(("other", *_sum(take(*by_field), elements=False)))
    rows.append(("total", _sum(params)[0], *_sum(leaves)[1:]))
    spread = any(leaf.spec != "single device" for leaf in leaves)
    header = ("", "parameters", "bytes", "size", *(["bytes per device"] if spread else []))
    lines = [
        (
            name,
            "-" if elements is None else f"{elements:,}",
            "-" if nbytes is None else f"{nbytes:,}",
            "-" if nbytes is None else human(nbytes),
            *(["-" if per_device is None else f"{per_device:,}"] if spread else []),
        )
        for name, elements, nbytes, per_device in rows
    ]
    text = _table(header, lines, total=True)
    if spread:
        each = [
            (leaf.key(depth) or "(params)", str(leaf.shape), leaf.spec, f"{leaf.per_device:,}")
            for leaf in params
        ]
        text += "\n\n" + _table(
            ("parameter", "shape", "partition spec", "bytes per device"), each, total=False
        )
    (sys.stdout if file is None else file).write(text + "\n")
    return text
