"""flax nnx's own training objects in and out of a state: `nnx.Optimizer`, `nnx.Metric`s, `to_nnx`."""

from __future__ import annotations

import dataclasses
from typing import Any, final

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from ciclo.types import ModelState
from ciclo_flax._nnx import NnxAdapter

_WRAPPED = (
    "the training options accumulate_steps, ema_decay, log_norms, skip_spikes and precision='16-mixed' "
    "wrap the optimizer in parts of ciclo's own"
)


@final
@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False)
class NnxMetric:
    """An `nnx.Metric` (`Average`, `Accuracy`, `MultiMetric`) as an immutable `ciclo.metrics.Metric`.

    `create_flax_state` wraps each nnx metric of `metrics=` as `NnxMetric(*nnx.split(metric))`. Each
    method merges a copy of the metric, runs the nnx method on it and splits it again. `merge` and
    `reduce` add the metric's variables, which suits the metrics that keep sums (`Average`, `Accuracy`).

    Attributes:
        graphdef: the metric's graph definition (static).
        variables: its `nnx.State`.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> metric = NnxMetric(*nnx.split(nnx.MultiMetric(loss=nnx.metrics.Average("loss"))))
        >>> metric = metric.update(loss=jnp.array(1.0)).update(loss=jnp.array(2.0), preds=None)
        >>> metric.compute()
        {'loss': Array(1.5, dtype=float32)}
    """

    graphdef: Any = dataclasses.field(metadata={"static": True})
    variables: Any

    def to_nnx(self) -> nnx.Metric:
        """A new nnx metric holding what this one has accumulated."""
        metric: nnx.Metric = nnx.merge(self.graphdef, self.variables, copy=True)
        return metric

    def _run(self, method: str, **kwargs: Any) -> Any:
        metric = self.to_nnx()
        # nnx metrics divide float totals by int counts, which strict promotion refuses.
        with jax.numpy_dtype_promotion("standard"):
            value = getattr(metric, method)(**kwargs)
        return value if method == "compute" else dataclasses.replace(self, variables=nnx.state(metric))

    def reset(self) -> NnxMetric:
        """The metric after the nnx `reset()`."""
        return self._run("reset")  # type: ignore[no-any-return]

    def update(self, **kwargs: Any) -> NnxMetric:
        """The metric after the nnx `update(**kwargs)`: a step's values (`logits`, `labels`, `loss`)."""
        return self._run("update", **kwargs)  # type: ignore[no-any-return]

    def merge(self, other: NnxMetric, /) -> NnxMetric:
        """Adds the variables of both."""
        return dataclasses.replace(self, variables=jax.tree.map(jnp.add, self.variables, other.variables))

    def reduce(self) -> NnxMetric:
        """Sums the variables along their leading (stacked) axis."""
        return dataclasses.replace(self, variables=jax.tree.map(lambda x: x.sum(0), self.variables))

    def compute(self) -> Any:
        """The nnx `compute()`."""
        return self._run("compute")


def _layout(tree: Any) -> tuple[Any, list[tuple[int, ...]]]:
    pure = nnx.as_pure(tree)
    return jax.tree.structure(pure), [jnp.shape(leaf) for leaf in jax.tree.leaves(pure)]


def with_optimizer(state: ModelState, optimizer: nnx.Optimizer) -> ModelState:  # type: ignore[type-arg]
    """`state` holding `optimizer`'s state and step (created with `tx=optimizer.tx`)."""
    if state.tx is not optimizer.tx:  # wrapped by the options: a state of another structure
        raise ValueError(
            f"{_WRAPPED}, whose state an nnx.Optimizer does not hold: leave these options out, or pass "
            "tx=optimizer.tx to start a new optimizer state"
        )
    unplaced = state.strategy.unplace(state)
    if _layout(optimizer.opt_state) != _layout(unplaced.opt_state):
        raise ValueError(
            "the nnx.Optimizer's state does not fit the model's nnx.Params: make it for this model, "
            "with nnx.Optimizer(model, tx, wrt=nnx.Param)"
        )
    opt_state = jax.tree.unflatten(
        jax.tree.structure(unplaced.opt_state), jax.tree.leaves(optimizer.opt_state)
    )
    step = jnp.asarray(optimizer.step[...], jnp.int32)
    return state.strategy.place(unplaced.replace(opt_state=opt_state, step=step))


def to_nnx(state: ModelState) -> tuple[nnx.Module, nnx.Optimizer]:  # type: ignore[type-arg]
    """The trained nnx module and an `nnx.Optimizer` of it, holding the state's optimizer state and step.

    Raises:
        TypeError: for a state of another model, or one without `tx`.
        ValueError: when training options wrap the optimizer (`accumulate_steps`, `ema_decay`, ...).

    Example:
        >>> import ciclo, optax
        >>> from flax import nnx
        >>> state = ciclo.create_flax_state(nnx.Linear(2, 3, rngs=nnx.Rngs(0)), tx=optax.adam(1e-3))
        >>> model, optimizer = to_nnx(state)
        >>> type(model).__name__, int(optimizer.step[...])
        ('Linear', 0)
    """
    if not isinstance(state.adapter, NnxAdapter) or state.tx is None:
        raise TypeError("to_nnx takes the state of an nnx module with an optimizer (created with tx=)")
    probe = optax.identity()
    if state.options.wrap(probe) is not probe:
        raise ValueError(
            f"{_WRAPPED}, which an nnx.Optimizer cannot hold: use state.model and state.opt_state"
        )
    unplaced = state.strategy.unplace(state)
    model = state.model
    optimizer = nnx.Optimizer(model, state.tx, wrt=nnx.Param)
    optimizer.opt_state = nnx.data(
        jax.tree.unflatten(jax.tree.structure(optimizer.opt_state), jax.tree.leaves(unplaced.opt_state))
    )
    optimizer.step[...] = jnp.asarray(unplaced.step, jnp.uint32)
    return model, optimizer
