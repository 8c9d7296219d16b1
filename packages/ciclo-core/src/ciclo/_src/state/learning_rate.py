"""The learning rates an optax optimizer state holds (`optax.inject_hyperparams`), read at trace time."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from optax.contrib import ReduceLROnPlateauState

from ciclo._src.base.reprs import short

LEARNING_RATE = "learning_rate"
"""The entry the learning rate is logged as (in the `metrics` collection)."""

LEARNING_RATE_SCALE = "learning_rate_scale"
"""The entry logged for `reduce_on_plateau`'s scale when no learning rate is injected."""


def _is_injected(node: Any, name: str = LEARNING_RATE) -> bool:
    hyperparams = getattr(node, "hyperparams", None)
    return isinstance(hyperparams, Mapping) and name in hyperparams


def learning_rate_logs(opt_state: Any) -> dict[str, jax.Array]:
    """The learning-rate entries to log for an optimizer state (docs/guide.md, "Learning rates").

    `learning_rate`: the injected rate times the `reduce_on_plateau` scales (several rates:
    `learning_rate_0`, ...); else `learning_rate_scale`, the product of the scales; else nothing.
    """
    nodes = jax.tree_util.tree_leaves(
        opt_state, is_leaf=lambda node: isinstance(node, ReduceLROnPlateauState) or _is_injected(node)
    )
    rates = [jnp.asarray(node.hyperparams[LEARNING_RATE]) for node in nodes if _is_injected(node)]
    scales = [jnp.asarray(node.scale) for node in nodes if isinstance(node, ReduceLROnPlateauState)]
    scale = functools.reduce(lambda a, b: a * b.astype(a.dtype), scales) if scales else None
    if not rates:
        return {} if scale is None else {LEARNING_RATE_SCALE: scale}
    if scale is not None:
        rates = [rate * scale.astype(rate.dtype) for rate in rates]
    if len(rates) == 1:
        return {LEARNING_RATE: rates[0]}
    return {f"{LEARNING_RATE}_{i}": rate for i, rate in enumerate(rates)}


def changed_hyperparameters(resumed: Any, given: Any) -> list[str]:
    """What the `optax.inject_hyperparams` states of two states of one structure hold differently.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> tx = optax.inject_hyperparams(optax.sgd)
        >>> changed_hyperparameters(tx(0.1).init(jnp.zeros(2)), tx(0.01).init(jnp.zeros(2)))
        ['learning_rate: 0.1 -> 0.01']
    """
    nodes = [jax.tree_util.tree_leaves(tree, is_leaf=_is_injected) for tree in (resumed, given)]
    injected = [(a, b) for a, b in zip(*nodes, strict=True) if _is_injected(a) and _is_injected(b)]
    changes = []
    for index, (old, new) in enumerate(injected):
        for name in old.hyperparams:
            before, after = old.hyperparams[name], new.hyperparams.get(name)
            if before is None or after is None or np.array_equal(on_host(before), on_host(after)):
                continue
            where = f"{name} (optimizer {index})" if len(injected) > 1 else name
            changes.append(f"{where}: {_shown(on_host(before))} -> {_shown(on_host(after))}")
    return changes


def on_host(value: Any) -> np.ndarray[Any, Any]:
    # This process's first copy: a replicated or pmapped array has several.
    if isinstance(value, jax.Array):
        value = value.addressable_shards[0].data
    return np.asarray(value)


def _shown(value: np.ndarray[Any, Any]) -> str:
    return f"{value.reshape(-1)[0].item():.6g}" if value.size == 1 else short(value)


def injected_learning_rates(opt_state: Any, name: str = LEARNING_RATE) -> list[Any]:
    """The injected (`optax.inject_hyperparams`) learning rates, or hyperparameter `name`, in order."""
    injected = functools.partial(_is_injected, name=name)
    nodes = jax.tree_util.tree_leaves(opt_state, is_leaf=injected)
    return [node.hyperparams[name] for node in nodes if injected(node)]


def with_learning_rate(opt_state: Any, rate: float) -> Any:
    """`opt_state` with each `optax.inject_hyperparams` learning rate set to `rate`, shaped as before."""

    def set_rate(node: Any) -> Any:
        if not _is_injected(node):
            return node
        new = jax.lax.full_like(node.hyperparams[LEARNING_RATE], rate)
        return node._replace(hyperparams={**node.hyperparams, LEARNING_RATE: new})

    return jax.tree.map(set_rate, opt_state, is_leaf=_is_injected)
