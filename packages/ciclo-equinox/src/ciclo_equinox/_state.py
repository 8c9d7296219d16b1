"""`create_equinox_state`: a `ciclo.types.ModelState` for an equinox module."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import equinox as eqx
from typing_extensions import Unpack

from ciclo import create_model_state
from ciclo.types import ModelState, ModelStateSettings
from ciclo_equinox._adapter import EquinoxAdapter


def _unpack(model: Any, state: Any) -> tuple[eqx.Module, eqx.nn.State | None]:
    """Accepts `model, state` separately or as the `(model, state)` pair `eqx.nn.make_with_state` returns."""
    if isinstance(model, tuple) and len(model) == 2 and isinstance(model[1], eqx.nn.State):
        if state is not None:
            raise TypeError(
                "create_equinox_state got the state twice: inside the (model, state) pair and as state=; "
                "pass one of them"
            )
        model, state = model
    if not isinstance(model, eqx.Module):
        raise TypeError(
            f"create_equinox_state takes an equinox.Module (or the (model, state) pair of "
            f"eqx.nn.make_with_state), got {type(model).__name__}; for other models implement "
            "ciclo.types.ModelAdapter and call ciclo.create_model_state"
        )
    return model, state


def create_equinox_state(
    model: eqx.Module | tuple[eqx.Module, eqx.nn.State],
    *,
    state: eqx.nn.State | None = None,
    vmap: bool = True,
    batch_axis_name: Hashable = "batch",
    **settings: Unpack[ModelStateSettings],
) -> ModelState:
    """A training state for an equinox module: `train_step`, `test_step`, `predict_step`, `reset_step`.

    The module's floating-point arrays are trained, everything else is held
    fixed; its `eqx.nn.State` is the model state. See
    `ciclo_equinox.EquinoxAdapter` and docs/frameworks/equinox.md.

    Args:
        model: an `equinox.Module`, or the `(model, state)` pair of `eqx.nn.make_with_state`.
        state: the module's `eqx.nn.State`, if it has stateful layers.
        vmap: map the module over the leading batch axis (True), or call it on
            the whole batch (False).
        batch_axis_name: the name of the mapped batch axis (with `vmap=True`).
        **settings: `ciclo.create_model_state`'s (`ciclo.types.ModelStateSettings`);
            `key` gives the steps' keys, the weights come from the module.

    Raises:
        TypeError: for a model that is not an equinox module, a state given
            twice, or a module with stateful layers and no state.

    Example:
        >>> import ciclo, equinox as eqx, jax, jax.numpy as jnp, optax
        >>> state = ciclo.create_equinox_state(
        ...     eqx.nn.Linear(2, 3, key=jax.random.key(0)),
        ...     tx=optax.adam(1e-3),
        ...     losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        ... )
        >>> logs, state = state.train_step((jnp.ones((4, 2)), jnp.array([0, 1, 2, 0])))
        >>> sorted(logs.losses)
        ['loss']
    """
    module, module_state = _unpack(model, state)
    adapter, variables = EquinoxAdapter.split(
        module, module_state, vmap=vmap, batch_axis_name=batch_axis_name
    )
    return create_model_state(adapter, variables=variables, **settings)
