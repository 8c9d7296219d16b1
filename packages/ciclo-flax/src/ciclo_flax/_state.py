"""`create_flax_state`: a `ciclo.types.ModelState` for a linen or an nnx module."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import flax.linen as nn
from typing_extensions import Unpack

from ciclo import create_model_state
from ciclo.types import ModelState, ModelStateSettings
from ciclo_flax._linen import LinenAdapter

if TYPE_CHECKING:
    from flax import nnx


def create_flax_state(
    model: nn.Module | nnx.Module | nnx.ModelAndOptimizer,  # type: ignore[type-arg]
    *,
    inputs: Any = None,
    **settings: Unpack[ModelStateSettings],
) -> ModelState:
    """A training state for a flax model: `train_step`, `test_step`, `predict_step`, `reset_step`.

    A linen module is initialised on `inputs`; an nnx module is already
    initialised. See docs/frameworks/flax_linen.md and flax_nnx.md.

    Args:
        model: a `flax.linen.Module`, a `flax.nnx.Module`, or an `nnx.ModelAndOptimizer` (no `tx`).
        inputs: sample inputs for a linen module, e.g. `jnp.empty((1, 28, 28, 1))`.
        **settings: `ciclo.create_model_state`'s (`ciclo.types.ModelStateSettings`). For an nnx
            module `tx` may be an `nnx.Optimizer` of it (its tx, optimizer state and step are carried
            over), and `metrics` an `nnx.MultiMetric` or a dict holding `nnx.Metric`s.

    Raises:
        TypeError: for another model, a linen module without `inputs`, an nnx module with `inputs`.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from flax import nnx
        >>> state = ciclo.create_flax_state(
        ...     nnx.Linear(2, 3, rngs=nnx.Rngs(0)),
        ...     tx=optax.adam(1e-3),
        ...     losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        ... )
        >>> logs, state = state.train_step((jnp.ones((4, 2)), jnp.array([0, 1, 2, 0])))
        >>> sorted(logs.losses)
        ['loss']
    """
    if isinstance(model, nn.Module) and "flax.nnx" not in sys.modules:  # no nnx object can exist yet
        return create_model_state(LinenAdapter(model), inputs=inputs, **settings)
    from flax import nnx  # noqa: PLC0415 - on first use

    from ciclo_flax._nnx import NnxAdapter  # noqa: PLC0415
    from ciclo_flax._nnx_training import NnxMetric, with_optimizer  # noqa: PLC0415

    metrics: Any = settings.get("metrics")
    metrics = {"metrics": metrics} if isinstance(metrics, nnx.MultiMetric) else metrics
    if isinstance(metrics, Mapping):
        settings["metrics"] = {
            k: NnxMetric(*nnx.split(m)) if isinstance(m, nnx.Metric) else m for k, m in metrics.items()
        }
    if isinstance(model, nn.Module):
        return create_model_state(LinenAdapter(model), inputs=inputs, **settings)
    optimizer: Any = settings.get("tx")
    if isinstance(model, nnx.ModelAndOptimizer):
        if optimizer is not None:
            raise TypeError("an nnx.ModelAndOptimizer brings its optimizer: leave tx= out")
        model, optimizer = model.model, model
    if isinstance(model, nnx.Module):
        if inputs is not None:
            raise TypeError(
                "an nnx module is built initialised, so it takes no inputs= (which is for linen "
                "modules): leave inputs= out"
            )
        adapter, variables = NnxAdapter.split(model)
        if not isinstance(optimizer, nnx.Optimizer):
            return create_model_state(adapter, variables=variables, **settings)
        state = create_model_state(adapter, variables=variables, **{**settings, "tx": optimizer.tx})
        return with_optimizer(state, optimizer)
    raise TypeError(
        f"create_flax_state takes a flax.linen.Module or a flax.nnx.Module, got {type(model).__name__}; "
        "for other models implement ciclo.types.ModelAdapter and call ciclo.create_model_state"
    )
