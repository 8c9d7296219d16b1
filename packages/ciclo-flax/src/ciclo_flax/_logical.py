"""Flax's logical axis names of each parameter, for `ciclo.strategies.MeshParallel(logical_rules=...)`."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
from flax import nnx


def _boxed(node: Any) -> bool:
    return isinstance(node, (nn.LogicallyPartitioned, nnx.Variable))


def logical_axes(params: Any) -> dict[str, tuple[str | None, ...]]:
    """Each parameter's logical axis names by `"/"`-joined path; the entry point `ciclo.logical_axes`.

    Read from linen's `nn.with_logical_partitioning` boxes and nnx variables' `sharding=`
    (`out_sharding`) metadata.

    Example:
        >>> import flax.linen as nn, jax, jax.numpy as jnp
        >>> init = nn.with_logical_partitioning(nn.initializers.ones, ("embed", "mlp"))
        >>> params = nn.Dense(4, kernel_init=init).init(jax.random.key(0), jnp.ones((1, 2)))["params"]
        >>> logical_axes(params)
        {'kernel': ('embed', 'mlp')}
    """
    found = {}
    for path, node in jax.tree_util.tree_leaves_with_path(params, is_leaf=_boxed):
        names: Any
        if isinstance(node, nn.LogicallyPartitioned):
            names = node.names
        elif isinstance(node, nnx.Variable):
            names = node.get_metadata().get("out_sharding")
        else:
            continue
        if names is not None:
            found[jax.tree_util.keystr(path, simple=True, separator="/")] = tuple(names)
    return found
