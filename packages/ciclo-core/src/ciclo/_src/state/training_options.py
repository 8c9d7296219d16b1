"""Training options: mixed precision, gradient accumulation, skipping non-finite steps, the weight EMA, norms.

Built on optax's own pieces (`optax.MultiSteps`, `optax.apply_if_finite`'s skipping) and combined in
`apply_gradients`, the one place every managed state's update goes through (docs/recipes.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Final, Literal, final

import jax
import jax.numpy as jnp
import optax
from typing_extensions import TypedDict

from ciclo._src.base.checks import check_int
from ciclo._src.base.finite import finite_flag
from ciclo._src.base.reprs import short
from ciclo._src.base.roles import params_field
from ciclo._src.state.precision import PRECISIONS, Precision


class TrainingOptionsKwargs(TypedDict, total=False):
    """The training options as keywords, as `ManagedState.create` and every `create_*_state` take them.

    See docs/recipes.md and docs/logging.md ("Gradient, update and parameter norms").

    Attributes:
        precision: `"32"` (the default), `"bf16-mixed"`, `"16-mixed"` (float16
            with dynamic loss scaling) or a `ciclo.types.Precision`.
        accumulate_steps: micro-batches per optimizer step (default 1), through
            `optax.MultiSteps`; schedules count optimizer steps.
        ema_decay: keep `ema_params`, an EMA of the parameters with this decay
            (e.g. 0.999; default None).
        log_norms: log `grad_norm`, `update_norm` and `param_norm` in the `norms`
            collection (default False); `"modules"` adds `grad_norm/<module>`.
    """

    precision: str | Precision
    accumulate_steps: int
    ema_decay: float | None
    log_norms: bool | Literal["modules"]


OPTION_NAMES: Final = frozenset(TrainingOptionsKwargs.__annotations__)


@final
@dataclasses.dataclass(frozen=True)
class TrainingOptions:
    """The training options of a managed state (static): `TrainingOptionsKwargs`, checked.

    `precision` may be a built-in policy's name; it is kept as its `Precision`.

    Raises:
        ValueError: for an unknown `precision`, `accumulate_steps` below 1, an
            `ema_decay` outside [0, 1) or a `log_norms` other than a bool or `"modules"`.

    Example:
        >>> options = TrainingOptions(precision="bf16-mixed", accumulate_steps=4, ema_decay=0.999)
        >>> options.accumulate_steps, options.ema_decay, options.resume_options()["precision"]
        (4, 0.999, 'bf16-mixed')
    """

    precision: Precision = PRECISIONS["32"]
    accumulate_steps: int = 1
    ema_decay: float | None = None
    log_norms: bool | Literal["modules"] = False

    def __post_init__(self) -> None:
        policy = Precision.of(self.precision)
        check_int(self.accumulate_steps, "accumulate_steps", 1)
        decay = self.ema_decay
        if decay is not None and not (
            isinstance(decay, (int, float)) and not isinstance(decay, bool) and 0 <= decay < 1
        ):
            raise ValueError(f"ema_decay must be a number in [0, 1), e.g. 0.999, or None; got {short(decay)}")
        if not (isinstance(self.log_norms, bool) or self.log_norms == "modules"):
            raise ValueError(
                "log_norms must be True, False or 'modules' (a norm per top-level module too), "
                f"got {short(self.log_norms)}"
            )
        object.__setattr__(self, "precision", policy)
        object.__setattr__(self, "ema_decay", None if decay is None else float(decay))

    def accumulate(self, tx: optax.GradientTransformation) -> optax.GradientTransformation:
        """The accumulation part: `tx` in an `optax.MultiSteps` of `accumulate_steps`, or `tx` itself."""
        if self.accumulate_steps == 1:
            return tx
        multi = optax.MultiSteps(tx, every_k_schedule=self.accumulate_steps)
        # With extra args: the loss (`value=`) reaches a `tx` that takes it, as without accumulation.
        return optax.GradientTransformationExtraArgs(multi.init, multi.update)

    def init(self, params: Any) -> dict[str, Any]:
        """The options' own state at step 0: `ema_params`, `loss_scale`, `norms`."""
        # A copy: a donating strategy must not see one buffer twice.
        ema = None if self.ema_decay is None else jax.tree.map(jnp.copy, params)
        norms = None
        if self.log_norms:
            names = jax.eval_shape(self.norms, params, params, params)
            norms = {name: jnp.zeros((), jnp.float32) for name in names}
        return {"ema_params": ema, "loss_scale": self.precision.loss_scale(), "norms": norms}

    def norms(self, grads: Any, updates: Any, params: Any) -> dict[str, jax.Array]:
        """The norms part: `grad_norm`, `update_norm`, `param_norm` (and `grad_norm/<module>`), float32.

        Example:
            >>> import jax.numpy as jnp
            >>> options = TrainingOptions(log_norms="modules")
            >>> grads = {"a": jnp.array([3.0]), "b": {"w": jnp.array([4.0])}}
            >>> {name: float(norm) for name, norm in options.norms(grads, grads, grads).items()}
            {'grad_norm': 5.0, 'update_norm': 5.0, 'param_norm': 5.0, 'grad_norm/a': 3.0, 'grad_norm/b': 4.0}
        """
        norms = {
            "grad_norm": _norm(grads),
            "update_norm": _norm(updates),
            "param_norm": _norm(params),
        }
        if self.log_norms == "modules":
            groups = modules(grads)
            if "" in groups:
                raise ValueError(
                    f"log_norms='modules' names a norm by the first key of each parameter's path, but the "
                    f"parameters are one array {short(groups[''][0])}; use log_norms=True"
                )
            norms.update({f"grad_norm/{name}": _norm(part) for name, part in groups.items()})
        return norms

    def check_without_optimizer(self) -> None:
        """Refuses the options that act on optimizer steps, for a state created without `tx`."""
        needing = {
            "accumulate_steps": self.accumulate_steps if self.accumulate_steps != 1 else None,
            "ema_decay": self.ema_decay,
            "log_norms": self.log_norms or None,
        }
        chosen = [f"{name}={short(value)}" for name, value in needing.items() if value is not None]
        if chosen:
            raise ValueError(
                f"{', '.join(chosen)} {'acts' if len(chosen) == 1 else 'act'} on optimizer steps, but the "
                "state is created without tx= (for inference): pass an optimizer, e.g. "
                "tx=optax.adam(1e-3), to train, or leave these options out"
            )

    def check(self, opt_state: Any) -> None:
        """Refuses a `tx` that accumulates itself (an `optax.MultiSteps`) under `accumulate_steps` > 1."""
        if self.accumulate_steps == 1:
            return
        nodes = jax.tree.leaves(
            opt_state.inner_opt_state, is_leaf=lambda node: isinstance(node, optax.MultiStepsState)
        )
        if any(isinstance(node, optax.MultiStepsState) for node in nodes):
            k = self.accumulate_steps
            raise ValueError(
                f"tx is already an optax.MultiSteps, which accumulates micro-batches itself: "
                f"accumulate_steps={k} would wrap it in a second one, and each optimizer step would wait "
                f"for both groups. Pass the optimizer inside it with accumulate_steps={k}, or this tx "
                "with accumulate_steps=1"
            )

    def resume_options(self) -> dict[str, Any]:
        """The options as plain data, as a backup records them."""
        return {
            "precision": self.precision.to_data(),
            "accumulate_steps": self.accumulate_steps,
            "ema_decay": self.ema_decay,
            "log_norms": self.log_norms,
        }

    def resume_refusal(self, name: str, old: Any) -> str | None:
        """Why a backup whose option `name` was `old` cannot go on under these options; None where it can."""
        if name == "log_norms":
            return (
                f"a state keeps the norms it logs in its field `norms` ({_kept_norms(old)} in the backup, "
                f"{_kept_norms(self.log_norms)} in this state), so the two hold different arrays"
            )
        if name == "accumulate_steps":
            return (
                f"its optimizer state holds gradients accumulated towards optimizer steps of {short(old)} "
                "micro-batches (optax.MultiSteps)"
            )
        if name == "precision":
            # The backup's precision (`Precision.to_data`): a built-in one's name, or its fields.
            if isinstance(old, str) and old in PRECISIONS:
                old = {"loss_scaling": PRECISIONS[old].loss_scaling}
            scaled = old.get("loss_scaling") if isinstance(old, dict) else None
            if not isinstance(scaled, bool):
                return "this ciclo does not know the backup's precision"
            if scaled == self.precision.loss_scaling:
                return None  # another compute dtype or scale growth: the arrays mean what they meant
            if scaled:
                return "the backup holds a loss scale (loss_scale) that a precision without one drops"
            return "this state's precision scales the loss, and the backup holds no loss scale to go on from"
        if old is None:  # ema_decay
            return "the backup holds no EMA of the weights (ema_params) to go on from"
        if self.ema_decay is None:
            return "the backup holds an EMA of the weights (ema_params) that this state does not keep"
        return None  # the EMA goes on with the new decay


def apply_gradients(state: Any, grads: Any, value: Any, changes: dict[str, Any]) -> Any:
    """`AbstractManagedState.apply_gradients`: the one place the training options' parts meet."""
    options: TrainingOptions = state.options
    if state.tx is None:
        raise ValueError(without_tx(type(state).__name__))
    name = params_field(type(state))
    params, scale, k = getattr(state, name), state.loss_scale, options.accumulate_steps
    if scale is not None:
        grads = jax.tree.map(lambda grad: grad / scale.scale.astype(grad.dtype), grads)
    # optax passes `value` on to the transformations that take it and drops it for the rest.
    tx, extra = (
        (state.tx, {}) if value is None else (optax.with_extra_args_support(state.tx), {"value": value})
    )
    # optax.MultiSteps multiplies its float updates by an int flag, which strict promotion refuses.
    with jax.numpy_dtype_promotion("standard") if k > 1 else contextlib.nullcontext():
        updates, opt_state = tx.update(grads, state.opt_state, params, **extra)
    new = {name: optax.apply_updates(params, updates), "opt_state": opt_state}
    # Whether this micro-step updated the parameters.
    updated = None if k == 1 else jnp.asarray(optax.MultiSteps(optax.identity(), k).has_updated(opt_state))
    if options.log_norms:
        received = grads
        if k > 1:
            # What optax.MultiSteps passes its optimizer: optax's own running mean, which XLA computes
            # once for both. A micro-step carries the last optimizer step's norms.
            n, acc_grads = state.opt_state.mini_step, state.opt_state.acc_grads
            with jax.numpy_dtype_promotion("standard"):
                received = jax.tree.map(
                    lambda grad, acc: (acc + (grad - acc) / (n + 1)).astype(grad.dtype), grads, acc_grads
                )
        norms = options.norms(received, updates, new[name])
        new["norms"] = norms if updated is None else _where(updated, norms, state.norms)
    if options.ema_decay is not None:
        decay = options.ema_decay
        average = jax.tree.map(lambda old, new: decay * old + (1 - decay) * new, state.ema_params, new[name])
        new["ema_params"] = average if updated is None else _where(updated, average, state.ema_params)
    if scale is not None:
        # optax.apply_if_finite's idea: a step whose gradients are not finite changes nothing.
        finite = finite_flag(grads)
        new = {key: _where(finite, value, getattr(state, key)) for key, value in new.items()}
        new["loss_scale"] = scale.update(finite=finite, growth_interval=options.precision.growth_interval)
    return state.replace(step=state.step + 1, **new, **changes)


def without_tx(creator: str) -> str:
    """The refusal of a training step on a state made for inference; `creator` made the state."""
    return (
        f"this state was created without tx= (for inference), so it cannot train; pass an optimizer, "
        f"e.g. tx=optax.adam(1e-3), to {creator} to train it"
    )


def _norm(tree: Any) -> jax.Array:
    """The global L2 norm of a pytree's arrays in float32: `optax.tree.norm`, whose name varies by version."""
    squares = [jnp.sum(jnp.square(leaf.astype(jnp.float32))) for leaf in jax.tree.leaves(tree)]
    return jnp.sqrt(sum(squares, jnp.zeros((), jnp.float32)))


def modules(tree: Any) -> dict[str, list[Any]]:
    """A pytree's leaves grouped by the first key of their paths (`""`: the tree is one leaf)."""
    groups: dict[str, list[Any]] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        groups.setdefault(jax.tree_util.keystr(path[:1], simple=True), []).append(leaf)
    return groups


def _kept_norms(log_norms: Any) -> str:
    """What a state with this `log_norms` keeps in `norms`, in words."""
    if log_norms == "modules":
        return "the global and per-module norms"
    return "the global norms" if log_norms else "none"


def _where(condition: jax.Array, new: Any, old: Any) -> Any:
    """`new` where `condition` holds, else `old`, leaf by leaf (two trees of one structure)."""
    return jax.tree.map(lambda a, b: jnp.where(condition, a, b), new, old)
