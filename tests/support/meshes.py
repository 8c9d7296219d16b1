"""What the mesh tests share: a `MeshParallel` of a `(data, fsdp, tensor)` shape, its layout read back."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ciclo.strategies import MeshParallel


def mesh(shape: tuple[int, int, int], **options: Any) -> MeshParallel:
    return MeshParallel(axes=dict(zip(("data", "fsdp", "tensor"), shape, strict=True)), **options)


def specs(params: Any) -> dict[str, P]:
    """Each leaf's spec by path, with the mesh's axes of one device dropped (as jax drops them)."""
    leaves = jax.tree_util.tree_leaves_with_path(params)
    return {
        jax.tree_util.keystr(path, simple=True, separator="/"): leaf.sharding.spec for path, leaf in leaves
    }


def laid_out(params: Any, strategy: MeshParallel, expected: dict[str, P]) -> bool:
    """Whether each named leaf of `params` is laid out over `strategy`'s mesh as `expected` says."""
    leaves = {
        jax.tree_util.keystr(path, simple=True, separator="/"): leaf
        for path, leaf in jax.tree_util.tree_leaves_with_path(params)
    }
    return all(
        leaves[path].sharding.is_equivalent_to(NamedSharding(strategy.mesh, spec), leaves[path].ndim)
        for path, spec in expected.items()
    )
