"""`create_haiku_state`: a `ciclo.types.ModelState` for a haiku function."""

from __future__ import annotations

import functools
import inspect
import reprlib
from collections.abc import Callable
from typing import Any

import haiku as hk
from typing_extensions import Unpack

from ciclo import create_model_state
from ciclo.types import ModelState, ModelStateSettings
from ciclo_haiku._adapter import AUTO, HaikuAdapter

_ACCEPTED = (
    "create_haiku_state takes a haiku function transformed by hk.transform or hk.transform_with_state, "
    "or the function itself (a def, a lambda or a functools.partial)"
)


def _transformed(model: object) -> hk.Transformed | hk.TransformedWithState:
    if isinstance(model, (hk.Transformed, hk.TransformedWithState)):
        return model
    if isinstance(model, (hk.MultiTransformed, hk.MultiTransformedWithState)):
        raise TypeError(
            f"{_ACCEPTED}; an hk.multi_transform has several apply functions: transform the one to "
            "train with hk.transform_with_state"
        )
    # An hk.Module can only be built inside a transform, so a callable object here is most likely another
    # framework's model (flax, equinox), which haiku would run without creating any parameters.
    if inspect.isroutine(model) or isinstance(model, functools.partial):
        return hk.transform_with_state(model)
    hint = (
        ": pass a function that builds and calls it, e.g. lambda x: hk.nets.MLP([64, 10])(x)"
        if isinstance(model, type) and issubclass(model, hk.Module)
        else "; wrap another callable with hk.transform_with_state yourself, and for a model of another "
        "framework implement ciclo.types.ModelAdapter and call ciclo.create_model_state"
    )
    raise TypeError(f"{_ACCEPTED}, got {reprlib.repr(model)} of type {type(model).__name__}{hint}")


def create_haiku_state(
    model: hk.Transformed | hk.TransformedWithState | Callable[..., Any],
    *,
    inputs: Any,
    training_flag: str | None = AUTO,
    **settings: Unpack[ModelStateSettings],
) -> ModelState:
    """A training state for a haiku function: `train_step`, `test_step`, `predict_step`, `reset_step`.

    The function takes the batch's inputs as its one positional argument and
    is initialised on `inputs`; see `ciclo_haiku.HaikuAdapter` and
    docs/frameworks/haiku.md.

    Args:
        model: an `hk.Transformed`, an `hk.TransformedWithState`, or a function
            (def, lambda or `functools.partial`) that calls haiku modules.
        inputs: sample inputs to initialise the function with, e.g. `jnp.zeros((1, 64))`.
        training_flag: `"auto"`, the name of the function's argument that says
            whether it is training, or None.
        **settings: `ciclo.create_model_state`'s (`ciclo.types.ModelStateSettings`).

    Raises:
        TypeError: for a model of another kind, `inputs=None`, or a `training_flag`
            the function does not take.

    Example:
        >>> import ciclo, haiku as hk, jax.numpy as jnp, optax
        >>> state = ciclo.create_haiku_state(
        ...     lambda x: hk.Linear(3)(x),
        ...     inputs=jnp.zeros((1, 2)),
        ...     tx=optax.adam(1e-3),
        ...     losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        ... )
        >>> logs, state = state.train_step((jnp.ones((4, 2)), jnp.array([0, 1, 2, 0])))
        >>> sorted(logs.losses)
        ['loss']
    """
    adapter = HaikuAdapter(_transformed(model), training_flag=training_flag)
    return create_model_state(adapter, inputs=inputs, **settings)
