"""Roles of a managed state's fields, in dataclass field metadata: ciclo finds fields by role, not name."""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable
from typing import Any

from ciclo._src.base.reprs import short

ROLE_KEY = "ciclo.role"


class Role(enum.Enum):
    """What a field of a managed state holds, declared with `managed.field(role=...)`; most fields have none.

    Example:
        >>> from ciclo import managed
        >>> managed.Role.KEY
        <Role.KEY: 'key'>
    """

    PARAMS = "params"
    """The trained parameters: `train_step` differentiates the losses with respect to them."""
    MODEL_STATE = "model_state"
    """State the model updates itself (batch statistics): synchronised across devices after each update."""
    KEY = "key"
    """An rng key (typed or raw `uint32` data): `pmap` gives each device its own split of it."""
    METRICS = "metrics"
    """Running metrics (`ciclo.metrics.Metric`s, or a pytree of them)."""


def field(
    *,
    role: Role | None = None,
    static: bool = False,
    default: Any = dataclasses.MISSING,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
) -> Any:
    """A field of a `managed.ManagedState` subclass, with its role or as static configuration.

    Args:
        role: what the field holds for ciclo (see `managed.Role`); None for a plain field.
        static: True for configuration rather than arrays: part of the pytree's structure, not a leaf.
        default: the field's default value.
        default_factory: a zero-argument function making the default value.

    Example:
        >>> import jax, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> class State(managed.ManagedState):
        ...     rng: jax.Array = managed.field(role=managed.Role.KEY)
        ...     note: str = managed.field(static=True, default="")
        >>> state = State.create(params=jnp.zeros(2), tx=optax.sgd(0.1), rng=jax.random.key(0))
        >>> managed.fields_with_role(State, managed.Role.KEY)
        ('rng',)
    """
    if static and role is not None:
        raise TypeError(f"a static field cannot have a role ({role}): roles are for fields that hold arrays")
    metadata: dict[str, Any] = {}
    if static:
        metadata["static"] = True
    if role is not None:
        if not isinstance(role, Role):
            raise TypeError(f"role must be a managed.Role, got {short(role)}")
        metadata[ROLE_KEY] = role
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def fields_with_role(cls: type, role: Role) -> tuple[str, ...]:
    """The names of the fields of `cls` declared with `role`, in field order.

    Example:
        >>> import ciclo
        >>> from ciclo import managed
        >>> managed.fields_with_role(ciclo.types.ModelState, managed.Role.MODEL_STATE)
        ('model_state',)
    """
    return _fields_with_role(cls, role)


@functools.lru_cache(maxsize=1024)  # read once per class and role
def _fields_with_role(cls: type, role: Role) -> tuple[str, ...]:
    if not dataclasses.is_dataclass(cls):
        return ()
    return tuple(spec.name for spec in dataclasses.fields(cls) if spec.metadata.get(ROLE_KEY) is role)


def params_field(cls: type) -> str:
    """The one field of `cls` with the `PARAMS` role; a TypeError when it declares none, or several."""
    names = fields_with_role(cls, Role.PARAMS)
    if len(names) != 1:
        found = f"declares {len(names)}: {', '.join(names)}" if names else "declares none"
        raise TypeError(
            f"a trainable state has one field with the role managed.Role.PARAMS (as "
            f"managed.ManagedState.params); {cls.__name__} {found}"
        )
    return names[0]
