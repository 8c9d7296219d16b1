"""Reading `ciclo.summary`'s table back, and the numbers it should show, counted independently."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import numpy as np


def parse(text: str, *, per_device: bool = False) -> dict[str, tuple[int | None, ...]]:
    """Each row's name -> (parameters; bytes), each None where the table shows "-".

    `per_device`: (parameters; bytes; bytes per device), the column a state spread over devices gets.
    """
    rows: dict[str, tuple[int | None, ...]] = {}
    table = text.split("\n\n")[0]  # a state spread over devices has a second table: `layout` reads it
    for line in table.splitlines()[1:]:  # the first line is the header
        if set(line) == {"-"}:
            continue  # a rule
        name, parameters, nbytes, _size, *device = re.split(r"\s{2,}", line.strip())
        numbers = [parameters, nbytes, *(device if per_device else [])]
        rows[name] = tuple(None if n == "-" else int(n.replace(",", "")) for n in numbers)
    return rows


def layout(text: str) -> dict[str, tuple[str, str, int]]:
    """The second table of a state spread over devices: each parameter's (shape, spec, bytes per device)."""
    _, table = text.split("\n\n")
    rows = {}
    for line in table.splitlines()[2:]:  # the header and its rule
        name, shape, spec, per_device = re.split(r"\s{2,}", line.strip())
        rows[name] = (shape, spec, int(per_device.replace(",", "")))
    return rows


def count(tree: Any) -> tuple[int, int]:
    """Elements and bytes of every array leaf, from the arrays themselves (`size`, `nbytes`)."""
    leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]
    return sum(leaf.size for leaf in leaves), sum(leaf.nbytes for leaf in leaves)


def expected_rows(state: Any, modules: dict[str, Any]) -> dict[str, tuple[int | None, int]]:
    """The table a ModelState should get, given its params split by top-level module by the caller."""
    params = count(state.params)
    opt_state = count(state.opt_state)[1]
    model_state = count(state.model_state)[1]
    total = count(state)[1]
    other = count(
        [
            getattr(state, spec.name)
            for spec in dataclasses.fields(state)
            if spec.name not in ("params", "opt_state", "model_state") and not spec.metadata.get("static")
        ]
    )[1]
    rows: dict[str, tuple[int | None, int]] = {name: count(tree) for name, tree in modules.items()}
    rows["params"] = params
    if model_state:
        rows["model state"] = (None, model_state)
    rows["optimizer state"] = (None, opt_state)
    rows["other"] = (None, other)
    assert params[1] + model_state + opt_state + other == total  # every array counted once
    rows["total"] = (params[0], total)
    return rows
