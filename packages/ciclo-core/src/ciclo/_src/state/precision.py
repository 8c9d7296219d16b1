"""Mixed precision: the dtype a managed state's steps compute in, and the dynamic loss scale of float16."""

from __future__ import annotations

import dataclasses
from typing import Any, Final

import jax
import jax.numpy as jnp
import numpy as np

from ciclo._src.base.checks import check_int
from ciclo._src.base.reprs import short
from ciclo._src.state._pytree import register_frozen


@dataclasses.dataclass(frozen=True)
class Precision:
    """A mixed-precision policy: the dtype steps compute in, and whether the loss is scaled.

    `precision=` takes one, or a built-in one's name: `"32"`, `"bf16-mixed"`,
    `"16-mixed"` (docs/recipes.md, "Mixed precision").

    Attributes:
        compute_dtype: the dtype of the step's computation (None: no casting).
        loss_scaling: scale the loss dynamically (needed for float16's range).
        initial_scale: the loss scale of the first step.
        growth_interval: finite steps in a row after which the scale doubles.

    Example:
        >>> import ciclo, jax.numpy as jnp
        >>> ciclo.types.Precision.of("bf16-mixed").compute_dtype
        dtype(bfloat16)
        >>> policy = ciclo.types.Precision(jnp.float16, loss_scaling=True, growth_interval=100)
        >>> policy.cast({"w": jnp.ones(2), "step": jnp.zeros((), jnp.int32)})["w"].dtype
        dtype('float16')
    """

    compute_dtype: Any = None
    loss_scaling: bool = False
    initial_scale: float = 2.0**16
    growth_interval: int = 2000

    def __post_init__(self) -> None:
        if self.compute_dtype is not None:
            dtype = np.dtype(self.compute_dtype)
            if not jnp.issubdtype(dtype, jnp.floating):
                raise TypeError(f"compute_dtype must be a floating dtype, got {short(self.compute_dtype)}")
            object.__setattr__(self, "compute_dtype", dtype)
        check_int(self.growth_interval, "growth_interval", 1)
        if not (isinstance(self.initial_scale, (int, float)) and 1 <= self.initial_scale < np.inf):
            raise ValueError(f"initial_scale must be a finite number >= 1, got {short(self.initial_scale)}")

    @classmethod
    def of(cls, precision: str | Precision) -> Precision:
        """The policy `precision` names (a ValueError lists the known ones), or `precision` itself."""
        if isinstance(precision, Precision):
            return precision
        policy = PRECISIONS.get(precision) if isinstance(precision, str) else None
        if policy is None:
            raise ValueError(
                f"precision must be one of {', '.join(map(repr, PRECISIONS))} or a ciclo.types.Precision, "
                f"got {short(precision)}"
            )
        return policy

    def to_data(self) -> str | dict[str, Any]:
        """The policy as plain data (JSON), as a backup records it: its name when it is a built-in one.

        Example:
            >>> import ciclo, jax.numpy as jnp
            >>> ciclo.types.Precision.of("bf16-mixed").to_data()
            'bf16-mixed'
            >>> ciclo.types.Precision(jnp.float16, growth_interval=100).to_data()["compute_dtype"]
            'float16'
        """
        for name, policy in PRECISIONS.items():
            if policy == self:
                return name
        return {
            "compute_dtype": None if self.compute_dtype is None else np.dtype(self.compute_dtype).name,
            "loss_scaling": self.loss_scaling,
            "initial_scale": float(self.initial_scale),
            "growth_interval": self.growth_interval,
        }

    def cast(self, tree: Any) -> Any:
        """`tree` with its floating-point leaves in `compute_dtype` (other leaves unchanged)."""
        if self.compute_dtype is None:
            return tree
        return jax.tree.map(lambda leaf: _cast_floating(leaf, self.compute_dtype), tree)


PRECISIONS: Final[dict[str, Precision]] = {
    "32": Precision(),
    "bf16-mixed": Precision(jnp.bfloat16),
    "16-mixed": Precision(jnp.float16, loss_scaling=True),
}
"""The built-in policies by name (PyTorch Lightning's `precision=` names)."""

MIN_SCALE: Final = 1.0
"""The loss scale's floor: a step skipped at this scale overflows float16 without any scaling."""


def _cast_floating(leaf: Any, dtype: Any) -> Any:
    if isinstance(leaf, (jax.Array, np.ndarray)) and jnp.issubdtype(leaf.dtype, jnp.floating):
        return jnp.asarray(leaf).astype(dtype)  # a numpy cast would warn of values beyond float16's range
    return leaf


def cast_like(tree: Any, like: Any) -> Any:
    """`tree` with each floating-point leaf cast back to the dtype of its leaf in `like`."""
    return jax.tree.map(
        lambda leaf, old: _cast_floating(leaf, old.dtype) if hasattr(old, "dtype") else leaf, tree, like
    )


def to_float32(tree: Any) -> Any:
    """`tree` with its floating-point leaves narrower than float32 widened to float32."""
    return jax.tree.map(
        lambda leaf: (
            _cast_floating(leaf, jnp.float32)
            if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating) and leaf.dtype.itemsize < 4
            else leaf
        ),
        tree,
    )


@register_frozen
@dataclasses.dataclass(frozen=True)
class LossScale:
    """The dynamic loss scale of a state trained with `Precision(loss_scaling=True)`; a pytree.

    Attributes:
        scale: the factor the loss is multiplied by before differentiation (float32).
        good_steps: finite steps since the scale last changed (int32).
        skipped_steps: steps skipped so far for gradients that were not finite (int32).
        skipped_in_a_row: the steps skipped since the last step that was not (int32).

    Example:
        >>> import ciclo, jax.numpy as jnp
        >>> scale = ciclo.types.LossScale(jnp.float32(2.0**16), *[jnp.int32(0)] * 3)
        >>> after = scale.update(finite=False, growth_interval=2000)
        >>> float(after.scale), int(after.skipped_steps), int(after.skipped_in_a_row)
        (32768.0, 1, 1)
    """

    scale: jax.Array
    good_steps: jax.Array
    skipped_steps: jax.Array
    skipped_in_a_row: jax.Array

    def update(self, *, finite: jax.Array | bool, growth_interval: int) -> LossScale:
        """The scale after a step: halved if not `finite`, doubled after `growth_interval` finite steps."""
        good = jnp.where(finite, self.good_steps + 1, 0)
        grow = good >= growth_interval
        scale = jnp.where(
            finite, jnp.where(grow, self.scale * 2, self.scale), jnp.maximum(self.scale / 2, MIN_SCALE)
        )
        return LossScale(
            scale=scale.astype(jnp.float32),
            good_steps=jnp.where(grow, 0, good).astype(jnp.int32),
            skipped_steps=(self.skipped_steps + jnp.where(finite, 0, 1)).astype(jnp.int32),
            skipped_in_a_row=jnp.where(finite, 0, self.skipped_in_a_row + 1).astype(jnp.int32),
        )
