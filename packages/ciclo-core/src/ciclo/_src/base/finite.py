"""Whether every floating-point value of a tree is finite: asked before a save, and by loss scaling."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def _is_float(leaf: Any) -> bool:
    dtype = getattr(leaf, "dtype", None)
    if dtype is None:
        dtype = np.asarray(leaf).dtype
    return bool(jnp.issubdtype(dtype, jnp.inexact))


@jax.jit
def _all_finite(leaves: list[Any]) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in leaves]))


def finite_flag(tree: Any) -> jax.Array:
    """A boolean array: every floating-point leaf of `tree` finite; traceable.

    Example:
        >>> import jax.numpy as jnp
        >>> finite_flag({"w": jnp.array([1.0, jnp.inf])})
        Array(False, dtype=bool)
    """
    leaves = [leaf for leaf in jax.tree.leaves(tree) if _is_float(leaf)]
    return _all_finite(leaves) if leaves else jnp.asarray(True)


def all_finite(tree: Any) -> bool:
    """True when every floating-point leaf of `tree` is finite (integer leaves and keys are skipped).

    Example:
        >>> import jax.numpy as jnp
        >>> all_finite({"w": jnp.ones(3), "step": 4}), all_finite({"w": jnp.array([1.0, jnp.nan])})
        (True, False)
    """
    return bool(finite_flag(tree))
