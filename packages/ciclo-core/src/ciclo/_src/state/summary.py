"""`ciclo.summary`: how many parameters a state holds, and how much memory its arrays take."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from typing import IO, Any

import jax

from ciclo._src.base.roles import Role, fields_with_role
from ciclo._src.state.managed import AbstractManagedState
from ciclo._src.state.training_options import by_module

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def _human(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    power = min((size.bit_length() - 1) // 10, len(_UNITS) - 1)
    return f"{size / 1024**power:.1f} {_UNITS[power]}"


def _sizes(tree: Any) -> tuple[int, int]:
    # Leaves of `summary`'s `jax.eval_shape`: `jax.ShapeDtypeStruct`s (a typed key's dtype has an itemsize).
    elements = nbytes = 0
    for leaf in jax.tree.leaves(tree):
        count = math.prod(leaf.shape)
        elements += count
        nbytes += count * leaf.dtype.itemsize
    return elements, nbytes


def _by_top_level_key(params: Any) -> list[tuple[str, int, int]]:
    return [(name or "(params)", *_sizes(leaves)) for name, leaves in by_module(params).items()]


def _table(rows: Iterable[tuple[str, int | None, int | None]]) -> str:
    # None shows "-" (bytes: in both byte columns).
    header = ("", "parameters", "bytes", "size")
    lines = [
        (
            name,
            "-" if elements is None else f"{elements:,}",
            "-" if nbytes is None else f"{nbytes:,}",
            "-" if nbytes is None else _human(nbytes),
        )
        for name, elements, nbytes in rows
    ]
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]

    def line(row: tuple[str, ...]) -> str:
        first, *numbers = row
        return "  ".join(
            [first.ljust(widths[0]), *(n.rjust(w) for n, w in zip(numbers, widths[1:], strict=True))]
        )

    rule = "-" * len(line(header))
    return "\n".join([line(header), rule, *map(line, lines[:-1]), rule, line(lines[-1])])


def summary(state: Any, *, file: IO[str] | None = None) -> str:
    """Prints and returns a table of a state's parameters and memory, by top-level module.

    Sizes are those of the global shapes, read without copying anything; a pytree without a
    `managed.Role.PARAMS` field is summarised as parameters. `file`: where to print (`sys.stdout`).

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
    # The shapes without computing any array; `unplace` removes `pmap`'s device axis.
    shapes = jax.eval_shape(
        state.strategy.unplace if isinstance(state, AbstractManagedState) else lambda tree: tree, state
    )
    kind = type(state)
    params_names = fields_with_role(kind, Role.PARAMS)
    rows: list[tuple[str, int | None, int | None]] = []
    if len(params_names) != 1:
        rows.extend(_by_top_level_key(shapes))
        elements, nbytes = _sizes(shapes)
        rows.append(("total", elements, nbytes))
    else:
        params = getattr(shapes, params_names[0])
        rows.extend(_by_top_level_key(params))
        elements, params_bytes = _sizes(params)
        rows.append(("params", elements, params_bytes))
        accounted = params_bytes
        model_state_names = fields_with_role(kind, Role.MODEL_STATE)
        model_state = [getattr(shapes, name) for name in model_state_names]
        if any(jax.tree.leaves(tree) for tree in model_state):
            _, nbytes = _sizes(model_state)
            rows.append(("model state", None, nbytes))
            accounted += nbytes
        if isinstance(state, AbstractManagedState) and state.tx is None:
            rows.append(("no optimizer (no tx)", None, None))  # a state for inference
        elif isinstance(state, AbstractManagedState):
            _, nbytes = _sizes(shapes.opt_state)
            rows.append(("optimizer state", None, nbytes))
            accounted += nbytes
        _, total = _sizes(shapes)
        rows.append(("other", None, total - accounted))
        rows.append(("total", elements, total))
    text = _table(rows)
    (sys.stdout if file is None else file).write(text + "\n")
    return text
