"""ciclo-stax: Keras-like training states for jax.example_libraries.stax models (see `create_stax_state`)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeAlias

import jax
from typing_extensions import Unpack

import ciclo
from ciclo.types import ModelState, ModelStateSettings

Stax: TypeAlias = tuple[Callable[..., Any], Callable[..., Any]]
"""A stax model: the `(init_fun, apply_fun)` pair that `stax.serial(...)` returns."""


@dataclasses.dataclass(
    frozen=True, eq=False
)  # hashable by identity: the adapter is a static field of the state
class StaxAdapter:
    """A `ciclo.types.ModelAdapter` for a stax model.

    stax's `Dropout` takes its mode when it is built, so `model` is a function
    of the mode, `"train"` or `"test"`, that builds the model; a model without
    dropout can be the `(init_fun, apply_fun)` pair itself. stax layers keep no
    state of their own: the model state is None.
    """

    model: Callable[[str], Stax] | Stax

    def _build(self, mode: str) -> Stax:
        return self.model if isinstance(self.model, tuple) else self.model(mode)

    def init(self, key: Any, inputs: Any, /) -> tuple[Any, None]:
        init_fun, _ = self._build("train")
        _, params = init_fun(key, inputs.shape)
        return params, None

    def apply(
        self, params: Any, model_state: None, inputs: Any, /, *, key: Any, training: bool
    ) -> tuple[Any, None]:
        # In evaluation the "test" model's dropout is the identity: the key goes unused.
        _, apply_fun = self._build("train" if training else "test")
        return apply_fun(params, inputs, rng=key), model_state

    def to_model(self, params: Any, model_state: None, /) -> Callable[[Any], Any]:
        """The trained model as a function of the inputs, in evaluation mode."""
        _, apply_fun = self._build("test")
        # stax's Dropout asks for a key in "test" mode too, and leaves it unused.
        return functools.partial(apply_fun, params, rng=jax.random.key(0))


def create_stax_state(
    model: Callable[[str], Stax] | Stax, *, inputs: Any, **settings: Unpack[ModelStateSettings]
) -> ModelState:
    """A training state for a stax model: `train_step`, `test_step`, `predict_step`, `reset_step`.

    Args:
        model: a function of the mode (`"train"` or `"test"`) that returns
            `stax.serial(...)`, or the `(init_fun, apply_fun)` pair of a model
            without dropout.
        inputs: sample inputs to initialise the model with, e.g. `jnp.zeros((1, 16))`.
        **settings: `ciclo.create_model_state`'s: `tx`, `losses`, `metrics`,
            `strategy`, `key` and the training options.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from jax.example_libraries import stax
        >>> state = ciclo.create_stax_state(
        ...     lambda mode: stax.serial(stax.Dense(8), stax.Relu, stax.Dropout(0.9, mode), stax.Dense(3)),
        ...     inputs=jnp.zeros((1, 4)),
        ...     tx=optax.adam(1e-3),
        ...     losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        ... )
        >>> logs, state = state.train_step((jnp.ones((2, 4)), jnp.array([0, 2])))
        >>> sorted(logs.losses), int(state.step)
        (['loss'], 1)
    """
    return ciclo.create_model_state(StaxAdapter(model), inputs=inputs, **settings)


__all__ = ["Stax", "StaxAdapter", "create_stax_state"]
