"""The `ModelAdapter` of flax nnx modules: split into a graph definition, params and the rest."""

from __future__ import annotations

import dataclasses
from typing import Any, final

import jax
from flax import nnx


@final
@dataclasses.dataclass(frozen=True, eq=False)
class NnxAdapter:
    """Applies an nnx module functionally for `ciclo.types.ModelState`; see docs/frameworks/flax_nnx.md.

    The graph definition stays in the adapter, the `nnx.Param`s are the params,
    every other variable is the model state. Each step merges them back, sets
    training with `nnx.view`, and reseeds the rng streams from the step key.

    Attributes:
        graphdef: the module's graph definition.
        streams: the rng stream names reseeded at each step.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from flax import nnx
        >>> adapter, (params, model_state) = NnxAdapter.split(nnx.Linear(2, 3, rngs=nnx.Rngs(0)))
        >>> inputs, key = jnp.ones((4, 2)), jax.random.key(1)
        >>> outputs, _ = adapter.apply(params, model_state, inputs, key=key, training=False)
        >>> outputs.shape
        (4, 3)
    """

    graphdef: Any
    streams: tuple[str, ...] = ()

    @classmethod
    def split(cls, module: nnx.Module) -> tuple[NnxAdapter, tuple[Any, Any]]:
        """Splits an nnx module into its adapter and its variables, `(params, model_state)`."""
        graphdef, params, *rest = nnx.split(module, nnx.Param, ...)
        streams = {node.tag for _, node in nnx.iter_graph(module) if isinstance(node, nnx.RngStream)}
        return cls(graphdef, tuple(sorted(streams))), (params, rest[0])

    def init(self, key: jax.Array, inputs: Any, /) -> tuple[Any, Any]:
        """Not available: an nnx module is initialised when it is built; see `split`."""
        raise TypeError(
            "an nnx module is initialised when it is built: use ciclo.create_flax_state(module, ...), or "
            "create_model_state(adapter, variables=variables, ...) with NnxAdapter.split(module)'s variables"
        )

    def apply(
        self, params: Any, model_state: Any, inputs: Any, /, *, key: jax.Array, training: bool
    ) -> tuple[Any, Any]:
        """Merges the module, runs it on `inputs`, and splits its new model state off."""
        # A copy: the state's Variables belong to the caller's trace, and the step mutates rng keys.
        module = nnx.merge(self.graphdef, params, model_state, copy=True)
        module = nnx.view(
            module, deterministic=not training, use_running_average=not training, raise_if_not_found=False
        )
        keys: dict[str, Any] = {name: jax.random.fold_in(key, i) for i, name in enumerate(self.streams)}
        nnx.reseed(module, **keys)
        outputs = module(inputs)
        _, _, *rest = nnx.split(module, nnx.Param, ...)
        return outputs, rest[0]

    def to_model(self, params: Any, model_state: Any, /) -> Any:
        """A new nnx module holding the trained variables, in the mode it was built in (`module.eval()`)."""
        return nnx.merge(self.graphdef, params, model_state, copy=True)
