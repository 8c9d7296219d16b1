"""What a managed training step learns from and tells about its optax optimizer.

A step logs the learning rate that an `optax.inject_hyperparams` optimizer
holds in its state, read from the state's structure, which is fixed when the
step is traced: nothing here runs per step in Python. (The loss reaches the
optimizers that take it, `optax.contrib.reduce_on_plateau`, through
`optax.with_extra_args_support`, in `ManagedState.apply_gradients`.)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, cast

import jax
import jax.numpy as jnp

LEARNING_RATE = "learning_rate"
"""The entry the learning rate is logged as (in the `metrics` collection)."""

LEARNING_RATE_SCALE = "learning_rate_scale"
"""The entry logged for `reduce_on_plateau`'s scale when no learning rate is injected."""


@functools.cache
def _plateau_state() -> type[Any]:
    from optax.contrib import ReduceLROnPlateauState

    return cast(type[Any], ReduceLROnPlateauState)


def _is_injected(node: Any) -> bool:
    hyperparams = getattr(node, "hyperparams", None)
    return isinstance(hyperparams, Mapping) and LEARNING_RATE in hyperparams


def learning_rate_logs(opt_state: Any) -> dict[str, jax.Array]:
    """The learning-rate entries to log for an optimizer state; empty when it holds none.

    - `learning_rate`: the learning rate an `optax.inject_hyperparams` state
      holds (the one its last update used), found anywhere in the state
      (inside `optax.chain`, `optax.MultiSteps`, `optax.masked`, ...), times
      the `scale` of each `optax.contrib.reduce_on_plateau` state beside it:
      `reduce_on_plateau` multiplies the updates by its scale, so this is the
      rate the update was made with. Several injected rates (one per
      `optax.multi_transform` group, say) are logged as `learning_rate_0`,
      `learning_rate_1`, ... in the state's order.
    - `learning_rate_scale`: the product of the `reduce_on_plateau` scales when
      no learning rate is injected.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> tx = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)
        >>> learning_rate_logs(tx.init(jnp.zeros(2)))
        {'learning_rate': Array(0.1, dtype=float32)}
        >>> learning_rate_logs(optax.adam(0.1).init(jnp.zeros(2)))
        {}
    """
    plateau = _plateau_state()
    nodes = jax.tree_util.tree_leaves(
        opt_state, is_leaf=lambda node: isinstance(node, plateau) or _is_injected(node)
    )
    rates = [jnp.asarray(node.hyperparams[LEARNING_RATE]) for node in nodes if _is_injected(node)]
    scales: list[jax.Array] = [jnp.asarray(node.scale) for node in nodes if isinstance(node, plateau)]
    scale = functools.reduce(lambda a, b: a * b.astype(a.dtype), scales) if scales else None
    if not rates:
        return {} if scale is None else {LEARNING_RATE_SCALE: scale}
    if scale is not None:
        rates = [rate * scale.astype(rate.dtype) for rate in rates]
    if len(rates) == 1:
        return {LEARNING_RATE: rates[0]}
    return {f"{LEARNING_RATE}_{i}": rate for i, rate in enumerate(rates)}
