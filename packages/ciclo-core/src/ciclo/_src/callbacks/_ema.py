"""Evaluation with the EMA of the weights: `SwapEMAWeights`, Keras' callback of that name."""

from __future__ import annotations

from typing import Any, final

from ciclo._src.managed import AbstractManagedState
from ciclo._src.reprs import short
from ciclo._src.roles import params_field


def _swapped(state: AbstractManagedState) -> Any:
    """The state with its parameters and `ema_params` exchanged (the same arrays: nothing is copied)."""
    name = params_field(type(state))
    return state.replace(**{name: state.ema_params, "ema_params": getattr(state, name)})


def _check(state: Any) -> AbstractManagedState:
    if not isinstance(state, AbstractManagedState) or state.ema_params is None:
        raise ValueError(
            "SwapEMAWeights (train_loop's test_with_ema=True) evaluates with the EMA of the weights, which "
            f"this state ({short(type(state))}) does not keep: create it with ema_decay=, e.g. "
            "ciclo.create_model_state(..., ema_decay=0.999)"
        )
    return state


@final
class SwapEMAWeights:
    """Tests with the EMA of the weights (`ema_decay=`), then trains on with the trained weights.

    Give it to `train_loop(callbacks=[ciclo.swap_ema_weights()])`, or pass `test_with_ema=True`,
    which adds it. Before each test loop its `params` and `ema_params` are
    exchanged, and after it exchanged back, as Keras' `SwapEMAWeights` does; the
    state is checked to keep an EMA before the first training step.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> class Scale:
        ...     def init(self, key, inputs):
        ...         return jnp.ones(()), None
        ...     def apply(self, params, model_state, inputs, *, key, training):
        ...         return params * inputs, model_state
        >>> state = ciclo.create_model_state(
        ...     Scale(), inputs=jnp.ones(1), tx=optax.sgd(0.1), losses=lambda p: p.mean(), ema_decay=0.9
        ... )
        >>> state, history, _ = ciclo.train_loop(
        ...     state,
        ...     [jnp.ones(1)] * 4,
        ...     callbacks=[ciclo.swap_ema_weights()],
        ...     test_dataset=lambda: [jnp.ones(1)],
        ...     epoch_duration=4,
        ... )
        >>> round(float(history.collect("loss_test")[0]), 4) == round(float(state.ema_params), 4)
        True
    """

    __slots__ = ("_swapped",)

    def __repr__(self) -> str:
        return "SwapEMAWeights()"

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


def swap_ema_weights() -> SwapEMAWeights:
    """A `SwapEMAWeights` callback: `train_loop` tests with the EMA of the weights, and trains on.

    Example:
        >>> import ciclo
        >>> ciclo.swap_ema_weights()
        SwapEMAWeights()
    """
    return SwapEMAWeights()
