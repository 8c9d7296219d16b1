"""Evaluation with the EMA of the weights: `SwapEMAWeights`, Keras' callback of that name."""

from __future__ import annotations

from typing import Any, final

import optax

from ciclo._src.base.reprs import short
from ciclo._src.base.roles import params_field
from ciclo._src.engine.callback import Callback
from ciclo._src.state.managed import AbstractManagedState
from ciclo._src.state.population import Population


def managed_part(state: Any) -> AbstractManagedState | None:
    """The managed state in `state`: itself, a population's stacked members (each member's own), else None."""
    inner = state.members if isinstance(state, Population) else state
    return inner if isinstance(inner, AbstractManagedState) else None


def _swapped(state: Any) -> Any:
    """The state with its parameters and `ema_params` exchanged (the same arrays: nothing is copied)."""
    if isinstance(state, Population):
        return state.replace(members=_swapped(state.members))
    name = params_field(type(state))
    opt_state = optax.tree_utils.tree_set(state.opt_state, ema_params=getattr(state, name))
    return state.replace(**{name: state.ema_params, "opt_state": opt_state})


def _check(state: Any) -> Any:
    managed = managed_part(state)
    if managed is None or managed.ema_params is None:
        raise ValueError(
            "SwapEMAWeights (train_loop's test_with_ema=True) evaluates with the EMA of the weights, which "
            f"this state ({short(type(state))}) does not keep: create it with ema_decay=, e.g. "
            "ciclo.create_model_state(..., ema_decay=0.999)"
        )
    return state


@final
class SwapEMAWeights(Callback):
    """Tests with the EMA of the weights (`ema_decay=`), then trains on with the trained weights.

    `train_loop(test_with_ema=True)` adds it. Before each test loop `params` and
    `ema_params` are exchanged, and after it exchanged back, as in Keras; a population's
    members each with their own.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> state = managed.ManagedState.create(params=jnp.ones(()), tx=optax.sgd(1.0), ema_decay=0.5)
        >>> state = state.apply_gradients(grads=jnp.ones(()))  # params 0, EMA 0.5
        >>> tested = ciclo.swap_ema_weights().on_test_begin(state)
        >>> float(tested.params), float(tested.ema_params)
        (0.5, 0.0)
    """

    def __init__(self) -> None:
        self._swapped = False  # a test loop with no batch runs its end, and not its beginning

    def on_train_begin(self, state: Any) -> None:
        """Refuses a state without an EMA, before the first training step."""
        _check(state)

    def on_test_begin(self, state: Any) -> Any:
        """The state to test: the EMA weights as its `params`."""
        self._swapped = True
        return _swapped(_check(state))

    def on_test_end(self, state: Any) -> Any:
        """The trained weights back."""
        if not self._swapped:
            return state
        self._swapped = False
        return _swapped(state)

    # Declared: Keras' hooks of that name, each with its method.
    hook = {"on_train_begin": on_train_begin, "on_test_begin": on_test_begin, "on_test_end": on_test_end}


def swap_ema_weights() -> SwapEMAWeights:
    """A `SwapEMAWeights` callback: `train_loop(callbacks=[...])` tests with the EMA of the weights."""
    return SwapEMAWeights()
