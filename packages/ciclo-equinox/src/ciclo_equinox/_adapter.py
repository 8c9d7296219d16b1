"""The `ModelAdapter` of equinox modules: split into a static part, float params and an `eqx.nn.State`."""

from __future__ import annotations

import dataclasses
import inspect
import reprlib
from collections.abc import Hashable
from typing import Any, final

import equinox as eqx
import jax
import jax.numpy as jnp


def _is_state_index(node: Any) -> bool:
    return isinstance(node, eqx.nn.StateIndex)


def accepts_key(model: Any) -> bool:
    """Whether calling `model` accepts a `key` keyword argument (unknown signatures count as yes)."""
    try:
        parameters = inspect.signature(model).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(
        parameter.kind is inspect.Parameter.VAR_KEYWORD
        or (parameter.name == "key" and parameter.kind is not inspect.Parameter.POSITIONAL_ONLY)
        for parameter in parameters
    )


def _batch_size(inputs: Any) -> int:
    leaves = jax.tree.leaves(inputs)
    if not leaves or not jnp.ndim(leaves[0]):
        raise ValueError(
            "EquinoxAdapter(vmap=True) maps the model over the leading (batch) axis of the inputs, but "
            f"the inputs have no batch axis: {jax.tree.map(jnp.shape, inputs)}; for a model that "
            "takes the whole batch itself use vmap=False"
        )
    return int(jnp.shape(leaves[0])[0])


@final
@dataclasses.dataclass(frozen=True, eq=False)
class EquinoxAdapter:
    """Applies an equinox module functionally for `ciclo.types.ModelState`; see docs/frameworks/equinox.md.

    Its floating-point arrays are the params, everything else stays in the
    adapter as `static`, and an `eqx.nn.State` is the model state. Each step
    combines the module back, sets `eqx.nn.inference_mode(module, value=not
    training)`, and calls it on each example (`vmap=True`) or on the batch.

    Attributes:
        static: the module with its params replaced by None (`eqx.partition`'s second part).
        stateful: whether the module takes and returns an `eqx.nn.State`.
        vmap: whether to map the module over the batch.
        batch_axis_name: the name of the mapped batch axis, for `eqx.nn.BatchNorm`'s `axis_name`.
        takes_key: whether the module's `__call__` accepts `key`.

    Example:
        >>> import equinox as eqx, jax, jax.numpy as jnp
        >>> adapter, (params, model_state) = EquinoxAdapter.split(eqx.nn.Linear(2, 3, key=jax.random.key(0)))
        >>> inputs = jnp.ones((4, 2))
        >>> outputs, _ = adapter.apply(params, model_state, inputs, key=jax.random.key(1), training=False)
        >>> outputs.shape
        (4, 3)
    """

    static: Any
    stateful: bool
    vmap: bool = True
    batch_axis_name: Hashable = "batch"
    takes_key: bool = True

    @classmethod
    def split(
        cls,
        module: Any,
        state: eqx.nn.State | None = None,
        *,
        vmap: bool = True,
        batch_axis_name: Hashable = "batch",
    ) -> tuple[EquinoxAdapter, tuple[Any, eqx.nn.State | None]]:
        """Splits an equinox module (and its `eqx.nn.State`) into its adapter and `(params, model_state)`.

        Example:
            >>> import equinox as eqx, jax
            >>> model, state = eqx.nn.make_with_state(eqx.nn.BatchNorm)(3, "batch", mode="batch")
            >>> adapter, (params, model_state) = EquinoxAdapter.split(model, state)
            >>> adapter.stateful, type(model_state).__name__
            (True, 'State')
        """
        if state is not None and not isinstance(state, eqx.nn.State):
            raise TypeError(
                "state must be the eqx.nn.State of the model (from eqx.nn.make_with_state), "
                f"got {reprlib.repr(state)}"
            )
        if state is None and any(map(_is_state_index, jax.tree.leaves(module, is_leaf=_is_state_index))):
            raise TypeError(
                f"{type(module).__name__} has stateful layers (such as eqx.nn.BatchNorm) but no state was "
                "given: build it with `model, state = eqx.nn.make_with_state(Model)(...)` and pass the state"
            )
        if not isinstance(vmap, bool):
            raise TypeError(f"vmap must be a bool, got {reprlib.repr(vmap)}")
        # StateIndex nodes are kept whole in the static part: they may still hold their initial
        # values, which are the state's business, not the optimizer's.
        params, static = eqx.partition(module, eqx.is_inexact_array, is_leaf=_is_state_index)
        if state is not None:
            # eqx.nn.BatchNorm's counter starts as a weakly typed `jnp.array(0)`; a restored
            # checkpoint's is strongly typed, and the difference would cost a recompilation.
            state = jax.tree.map(lambda leaf: jnp.asarray(leaf, dtype=jnp.dtype(leaf.dtype)), state)
        adapter = cls(
            static,
            stateful=state is not None,
            vmap=vmap,
            batch_axis_name=batch_axis_name,
            takes_key=accepts_key(module),
        )
        return adapter, (params, state)

    def init(self, key: jax.Array, inputs: Any, /) -> tuple[Any, Any]:
        """Not available: an equinox module is initialised when it is built; see `split`."""
        raise TypeError(
            "an equinox module is initialised when it is built: use ciclo.create_equinox_state(model, ...), "
            "or create_model_state(adapter, variables=variables, ...) with EquinoxAdapter.split's variables"
        )

    def apply(
        self, params: Any, model_state: Any, inputs: Any, /, *, key: jax.Array, training: bool
    ) -> tuple[Any, Any]:
        """Combines the module and runs it on `inputs` in training or inference mode: `(outputs, state)`."""
        module = eqx.nn.inference_mode(eqx.combine(params, self.static), value=not training)
        if not self.vmap:
            return self._call(module, inputs, model_state, key)
        # One key per example, so that dropout masks differ across the batch.
        keys = jax.random.split(key, _batch_size(inputs)) if self.takes_key else None
        # The state is shared by the batch: batch norm averages over the named axis, so its new
        # state is the same for every example and comes back once (out_axes=None).
        return jax.vmap(
            lambda x, s, k: self._call(module, x, s, k),
            in_axes=(0, None, 0 if self.takes_key else None),
            out_axes=(0, None),
            axis_name=self.batch_axis_name,
        )(inputs, model_state, keys)

    def to_model(self, params: Any, model_state: Any, /) -> Any:
        """The trained module, or `(module, state)` for a stateful one, as `eqx.nn.make_with_state` gives."""
        module = eqx.combine(params, self.static)
        return (module, model_state) if self.stateful else module

    def _call(self, module: Any, inputs: Any, model_state: Any, key: Any) -> tuple[Any, Any]:
        kwargs = {"key": key} if self.takes_key else {}
        if self.stateful:
            outputs, new_model_state = module(inputs, model_state, **kwargs)
            return outputs, new_model_state
        return module(inputs, **kwargs), model_state
