"""Moving pytrees between one device and a set of devices, with errors that name the leaf."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from ciclo._src.base.reprs import short

T = TypeVar("T")

_SCALARS = (bool, int, float, complex, np.generic)


def is_key(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def unplaceable(tree: Any) -> tuple[str, str, Any] | None:
    """`(path, kind, leaf)` of the first leaf of `tree` that is not a number or array of numbers, else None.

    Example:
        >>> import numpy as np
        >>> unplaceable({"x": np.ones(2), "id": np.array(["a"])})
        ("['id']", 'ndarray of dtype <U1', array(['a'], dtype='<U1'))
    """
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        if isinstance(leaf, jax.Array) or (isinstance(leaf, _SCALARS) and not isinstance(leaf, np.generic)):
            continue
        if isinstance(leaf, (np.ndarray, np.generic)):
            if jnp.issubdtype(leaf.dtype, np.number) or jnp.issubdtype(leaf.dtype, np.bool_):
                continue
            return _name(path), f"{type(leaf).__name__} of dtype {leaf.dtype}", leaf
        return _name(path), type(leaf).__name__, leaf
    return None


def check_placeable(tree: Any, what: str, strategy: str) -> None:
    """Raises a TypeError naming the first leaf of `tree` that is not a number or an array of numbers."""
    found = unplaceable(tree)
    if found is not None:
        path, kind, _ = found
        raise TypeError(
            f"strategy {short(strategy)} cannot place {what} leaf {path} on devices: it is a "
            f"{kind}, not a number or an array of numbers. Make it an array, or, if it is "
            "configuration, a static field: managed.field(static=True)."
        )


def _is_number_list(node: Any) -> bool:
    # Judged by its first element.
    if not isinstance(node, list) or not node:
        return False
    first = node[0]
    return (
        isinstance(first, _SCALARS)
        or (isinstance(first, (jax.Array, np.ndarray)) and np.ndim(first) == 0)
        or _is_number_list(first)
    )


def number_list(batch: Any) -> tuple[str, Any] | None:
    """`(path, list)` of the first Python list of numbers in `batch` (jax takes it as many inputs), else None.

    Example:
        >>> import numpy as np
        >>> number_list((np.ones(2), [[1.0, 2.0], [3.0, 4.0]]))
        ('[1]', [[1.0, 2.0], [3.0, 4.0]])
        >>> number_list([np.ones(2), np.ones(2)]) is None  # a list of arrays is a batch's structure
        True
    """
    for path, leaf in jax.tree_util.tree_leaves_with_path(batch, is_leaf=_is_number_list):
        if isinstance(leaf, list):
            return _name(path), leaf
    return None


def batch_refusal(batch: Any) -> TypeError | None:
    """A TypeError naming the first leaf of `batch` that a step cannot take as an array, else None.

    Example:
        >>> import numpy as np
        >>> print(batch_refusal({"x": [1.0, 2.0], "y": np.ones(2)}))
        batch leaf ['x'] is a Python list ([1.0, 2.0]), which jax takes as 2 separate numbers, not one
        array: convert each list of the batch to an array with np.asarray before the loop
        >>> batch_refusal({"x": np.ones(2)}) is None
        True
    """
    found_list = number_list(batch)
    if found_list is not None:
        path, leaf = found_list
        count = len(jax.tree.leaves(leaf))
        return TypeError(
            f"batch leaf {path} is a Python list ({short(leaf)}), which jax takes as {count} separate "
            "numbers, not one array: convert each list of the batch to an array with np.asarray before "
            "the loop"
        )
    found = unplaceable(batch)
    if found is None:
        return None
    path, kind, leaf = found
    return TypeError(
        f"batch leaf {path} is a {kind} ({short(leaf)}), not a number or an array of numbers, which a "
        "step cannot take: drop it from the batch, or turn it into numbers with np.asarray before the loop"
    )


def place(tree: T, sharding_of: Callable[[tuple[int, ...]], jax.sharding.Sharding]) -> T:
    """Puts every leaf of `tree` on devices with the sharding `sharding_of(leaf.shape)`.

    A leaf laid out over devices is resharded in place; otherwise every process passes the same values.
    """
    return place_as(tree, jax.tree.map(lambda leaf: sharding_of(np.shape(leaf)), tree))


def place_as(tree: T, shardings: Any) -> T:
    """Puts every leaf of `tree` on devices with its sharding in `shardings`, a tree of the same structure."""
    if jax.process_count() == 1:
        return cast(T, jax.device_put(tree, shardings))
    return cast(T, jax.tree.map(_place_global, tree, shardings))


def placed(tree: Any, sharding_of: Callable[[tuple[int, ...]], jax.sharding.Sharding]) -> bool:
    """Whether every leaf of `tree` is a (not traced) array laid out as `sharding_of(leaf.shape)` already."""
    return all(
        isinstance(leaf, jax.Array)
        and not isinstance(leaf, jax.core.Tracer)
        and leaf.sharding == sharding_of(leaf.shape)
        for leaf in jax.tree.leaves(tree)
    )


def _place_global(leaf: Any, sharding: jax.sharding.Sharding) -> jax.Array:
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        # A global array (another mesh strategy's layout): the processes reshard it together.
        return cast(jax.Array, jax.jit(lambda x: x, out_shardings=sharding)(leaf))
    if is_key(leaf):
        data = _place_global(jax.random.key_data(leaf), sharding)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
    host = np.asarray(leaf)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def gather(tree: T) -> T:
    """Brings every array leaf of `tree` to this process's first device, whole."""
    device = jax.local_devices()[0]
    return jax.tree.map(lambda leaf: _gather_leaf(leaf, device), tree)


def _gather_leaf(leaf: Any, device: jax.Device) -> Any:
    if not isinstance(leaf, jax.Array):
        return leaf
    if leaf.is_fully_addressable:
        return jax.device_put(leaf, device)
    if leaf.is_fully_replicated:
        return jax.device_put(leaf.addressable_data(0), device)
    if is_key(leaf):
        data = _gather_leaf(jax.random.key_data(leaf), device)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
    return jax.device_put(multihost_utils.process_allgather(leaf, tiled=True), device)


def _name(path: tuple[Any, ...]) -> str:
    return jax.tree_util.keystr(path) or "(the root)"


def check_divisible(
    batch: Any, devices: int, strategy: str, axis: int = 0, batch_axes: tuple[str, ...] = ()
) -> None:
    over = f"the {devices} devices of this process"
    if batch_axes:  # a mesh whose other axes (tensor) hold the same rows: not every device splits them
        over = f"{devices} parts in this process (the product of its batch axes {batch_axes}, per process)"
    for path, leaf in jax.tree_util.tree_leaves_with_path(batch):
        shape = np.shape(leaf)
        if len(shape) > axis and shape[axis] % devices:
            raise ValueError(
                f"strategy {short(strategy)} splits each batch over {over}, "
                f"but batch leaf {_name(path)} has {shape[axis]} rows (shape {shape}), not a multiple of "
                f"{devices}. Use a batch size that is a multiple of {devices} (drop or pad the last, "
                "smaller batch), or a strategy that runs on one device such as 'jit'."
            )


def copied(tree: T) -> T:
    """A copy of every array of `tree`, placed alike: it outlives a step that donates the original."""
    return jax.tree.map(lambda leaf: leaf.copy() if isinstance(leaf, jax.Array) else leaf, tree)


def unaliased(tree: T) -> T:
    """Copies every array leaf that appears more than once, so that each buffer can be donated once."""
    seen: set[int] = set()

    def fresh(leaf: Any) -> Any:
        if not isinstance(leaf, jax.Array):
            return leaf
        if id(leaf) in seen:
            return jnp.copy(leaf)
        seen.add(id(leaf))
        return leaf

    return jax.tree.map(fresh, tree)
