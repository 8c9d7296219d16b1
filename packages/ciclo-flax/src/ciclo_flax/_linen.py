"""The `ModelAdapter` of flax linen modules: `params` trained, other collections kept as model state."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, final

import flax.linen as nn
import jax

# In lookup order; `deterministic` is passed as `not training`.
TRAINING_FLAGS = ("training", "train", "is_training", "deterministic")


def training_flag(module: nn.Module) -> str | None:
    """The name of the argument of `module.__call__` that says whether it is training, if any."""
    parameters = inspect.signature(type(module).__call__).parameters
    return next((name for name in TRAINING_FLAGS if name in parameters), None)


@final
@dataclasses.dataclass(frozen=True, eq=False)
class LinenAdapter:
    """Initialises and applies a linen module for `ciclo.types.ModelState`; see docs/frameworks/flax_linen.md.

    `params` is the `"params"` collection; every other collection is the model
    state. The step key reaches the module as each rng named in `rngs`.

    Attributes:
        module: the linen module.
        rngs: the rng names the step key is passed as.

    Example:
        >>> import flax.linen as nn, jax, jax.numpy as jnp
        >>> adapter = LinenAdapter(nn.Dense(3))
        >>> params, model_state = adapter.init(jax.random.key(0), jnp.ones((1, 2)))
        >>> inputs, key = jnp.ones((4, 2)), jax.random.key(1)
        >>> outputs, _ = adapter.apply(params, model_state, inputs, key=key, training=True)
        >>> outputs.shape, model_state
        ((4, 3), None)
    """

    module: nn.Module
    rngs: tuple[str, ...] = ("dropout",)

    def _flag(self, training: bool) -> dict[str, Any]:
        flag = training_flag(self.module)
        if flag is None:
            return {}
        return {flag: (not training) if flag == "deterministic" else training}

    def _rngs(self, key: jax.Array) -> dict[str, jax.Array]:
        return {name: jax.random.fold_in(key, index) for index, name in enumerate(self.rngs)}

    def init(self, key: jax.Array, inputs: Any, /) -> tuple[Any, Any]:
        """Runs `module.init` in evaluation mode: `(params, other collections or None)`."""
        params_key, rngs_key = jax.random.split(key)
        variables = dict(
            self.module.init({"params": params_key, **self._rngs(rngs_key)}, inputs, **self._flag(False))
        )
        params = variables.pop("params", {})
        return params, (variables or None)

    def apply(
        self, params: Any, model_state: Any, inputs: Any, /, *, key: jax.Array, training: bool
    ) -> tuple[Any, Any]:
        """Runs `module.apply`; in training the model-state collections are mutable and returned."""
        variables = {"params": params, **(model_state or {})}
        flag = self._flag(training)
        if training and model_state:
            outputs, updates = self.module.apply(
                variables, inputs, rngs=self._rngs(key), mutable=list(model_state), **flag
            )
            return outputs, {**model_state, **updates}
        return self.module.apply(variables, inputs, rngs=self._rngs(key), **flag), model_state

    def to_model(self, params: Any, model_state: Any, /) -> dict[str, Any]:
        """The module's variables, as `module.init` gives them: `{"params": ..., "batch_stats": ...}`."""
        return {"params": params, **(model_state or {})}
