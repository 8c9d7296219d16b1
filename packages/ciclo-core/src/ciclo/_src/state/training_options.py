"""Training options: mixed precision, gradient accumulation, skipping non-finite steps, the weight EMA, norms.

Each option that acts on optimizer steps is an optax transformation whose state lives in `opt_state`
(`loss_scaling`, `accumulate`, `ema`, `keep_norms`), built on optax's own pieces (`optax.MultiSteps`,
`optax.apply_if_finite`'s skipping); `TrainingOptions.wrap` puts them around the user's `tx`, and a
user may chain them by hand (docs/recipes.md, "The options as optax parts").
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final, Literal, NamedTuple, final

import jax
import jax.numpy as jnp
import optax
from typing_extensions import TypedDict

from ciclo._src.base.checks import check_int
from ciclo._src.base.finite import finite_flag
from ciclo._src.base.reprs import short
from ciclo._src.state.precision import PRECISIONS, LossScale, Precision


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

_KEPT_NORMS: Final = {
    "False": "none",
    "True": "the global norms",
    "modules": "the global and per-module norms",
}
"""What a state keeps in its norms by `str(log_norms)`, in words."""

_PARTS: Final = {"precision": "a loss scale (loss_scale)", "ema_decay": "an EMA of the weights (ema_params)"}
"""What the part an option adds keeps in the optimizer state, in words (a resume refusal's)."""

_MULTI: Final = optax.MultiStepsState.__name__
"""How `optax.tree_utils.tree_get` finds the accumulation's state (a part state is found by its name)."""


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

    def wrap(self, tx: optax.GradientTransformation) -> optax.GradientTransformation:
        """`tx` with the options' parts around it; `tx` itself without options (docs/recipes.md).

        Example:
            >>> import optax
            >>> tx = TrainingOptions(accumulate_steps=2, ema_decay=0.9).wrap(optax.sgd(0.1))
            >>> state = tx.init({"w": 0.0})
            >>> type(state).__name__, type(state.inner).__name__
            ('EmaState', 'MultiStepsState')
        """
        if self.accumulate_steps > 1:
            tx = accumulate(tx, self.accumulate_steps)
        if self.log_norms:
            tx = keep_norms(tx, modules=self.log_norms == "modules")
        if self.ema_decay is not None:
            tx = ema(tx, self.ema_decay)
        if self.precision.loss_scaling:
            policy = self.precision
            tx = loss_scaling(tx, initial_scale=policy.initial_scale, growth_interval=policy.growth_interval)
        return tx

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
        if self.accumulate_steps > 1 and len(optax.tree_utils.tree_get_all_with_path(opt_state, _MULTI)) > 1:
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
            kept = [_KEPT_NORMS.get(str(value), short(value)) for value in (old, self.log_norms)]
            return (
                f"a state keeps the norms it logs in its optimizer state ({kept[0]} in the backup, {kept[1]} "
                "in this state), so the two hold different arrays"
            )
        if name == "accumulate_steps":
            return (
                f"its optimizer state holds gradients accumulated towards optimizer steps of {short(old)} "
                "micro-batches (optax.MultiSteps)"
            )
        if name == "precision":
            # The backup's precision (`Precision.to_data`): a built-in one's name, or its fields.
            named = PRECISIONS[old].loss_scaling if isinstance(old, str) and old in PRECISIONS else None
            had = old.get("loss_scaling") if isinstance(old, dict) else named
            if not isinstance(had, bool):
                return "this ciclo does not know the backup's precision"
            has = self.precision.loss_scaling  # another compute dtype or scale growth is noted
        else:  # ema_decay: another decay is noted, the EMA goes on with it
            had, has = old is not None, self.ema_decay is not None
        if had == has:
            return None
        part = _PARTS[name]
        if had:
            return f"the backup holds {part} that this state does not keep"
        return f"this state keeps {part}, and the backup holds none to go on from"


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


def by_module(tree: Any) -> dict[str, list[Any]]:
    """A pytree's leaves grouped by the first key of their paths (`""`: the tree is one leaf)."""
    groups: dict[str, list[Any]] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        groups.setdefault(jax.tree_util.keystr(path[:1], simple=True), []).append(leaf)
    return groups


def _where(condition: jax.Array, new: Any, old: Any) -> Any:
    """`new` where `condition` holds, else `old`, leaf by leaf (two trees of one structure)."""
    return jax.tree.map(lambda a, b: jnp.where(condition, a, b), new, old)


class ScaledState(NamedTuple):
    """The state of `loss_scaling`: the loss scale and the wrapped transformation's state."""

    loss_scale: LossScale
    inner: Any


class EmaState(NamedTuple):
    """The state of `ema`: the EMA of the parameters, and the wrapped state."""

    ema_params: Any
    inner: Any


class NormsState(NamedTuple):
    """The state of `keep_norms`: the last optimizer step's norms by name, and the wrapped state."""

    norms: dict[str, jax.Array]
    inner: Any


def loss_scaling(
    inner: optax.GradientTransformation, *, initial_scale: float = 2.0**16, growth_interval: int = 2000
) -> optax.GradientTransformationExtraArgs:
    """Dynamic loss scaling around `inner`: gradients divided by the scale, non-finite steps skipped.

    The step multiplies its loss by the scale (`state.scale_loss`); a step whose gradients are not
    finite changes nothing and halves the scale (`optax.apply_if_finite`'s idea), and the scale doubles
    after `growth_interval` finite steps. The `ciclo.types.LossScale` is `state.loss_scale`.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> tx = loss_scaling(optax.sgd(1.0), initial_scale=4.0)
        >>> state = tx.init(jnp.zeros(()))
        >>> updates, state = tx.update(jnp.array(jnp.inf), state, jnp.zeros(()))
        >>> float(updates), float(state.loss_scale.scale), int(state.loss_scale.skipped_steps)
        (0.0, 2.0, 1)
    """
    inner = optax.with_extra_args_support(inner)
    Precision(loss_scaling=True, initial_scale=initial_scale, growth_interval=growth_interval)  # checks both

    def init(params: Any) -> ScaledState:
        counts = [jnp.zeros((), jnp.int32) for _ in range(3)]  # three buffers: a strategy may donate each
        return ScaledState(LossScale(jnp.asarray(initial_scale, jnp.float32), *counts), inner.init(params))

    def update(grads: Any, state: ScaledState, params: Any = None, **extra: Any) -> tuple[Any, ScaledState]:
        scale = state.loss_scale
        grads = jax.tree.map(lambda grad: grad / scale.scale.astype(grad.dtype), grads)
        updates, new = inner.update(grads, state.inner, params, **extra)
        finite = finite_flag(grads)
        updates = jax.tree.map(lambda update: jnp.where(finite, update, jnp.zeros_like(update)), updates)
        scale = scale.update(finite=finite, growth_interval=growth_interval)
        return updates, ScaledState(scale, _where(finite, new, state.inner))

    return optax.GradientTransformationExtraArgs(init, update)


def accumulate(inner: optax.GradientTransformation, every: int) -> optax.GradientTransformationExtraArgs:
    """`optax.MultiSteps(inner, every)`: one optimizer step per `every` micro-batches, their mean.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> tx = accumulate(optax.sgd(1.0), 2)
        >>> state = tx.init(jnp.zeros(()))
        >>> updates, state = tx.update(jnp.array(1.0), state, jnp.zeros(()))
        >>> float(updates), int(state.mini_step)
        (0.0, 1)
    """
    multi = optax.MultiSteps(inner, every_k_schedule=every)

    def update(grads: Any, state: Any, params: Any = None, **extra: Any) -> tuple[Any, Any]:
        # optax.MultiSteps multiplies its float updates by an int flag, which strict promotion refuses.
        with jax.numpy_dtype_promotion("standard"):
            updates, new = multi.update(grads, state, params, **extra)
        return updates, new

    return optax.GradientTransformationExtraArgs(multi.init, update)


def ema(inner: optax.GradientTransformation, decay: float) -> optax.GradientTransformationExtraArgs:
    """Keeps `ema_params`, an EMA of the parameters after each update of `inner`: `state.ema_params`.

    Around an `accumulate` part, the EMA moves only at the micro-steps that update the parameters.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> tx = ema(optax.sgd(1.0), 0.5)
        >>> _, state = tx.update(jnp.array(-2.0), tx.init(jnp.zeros(())), jnp.zeros(()))
        >>> float(state.ema_params)
        1.0
    """
    inner = optax.with_extra_args_support(inner)

    def init(params: Any) -> EmaState:
        # A copy: a donating strategy must not see one buffer twice.
        return EmaState(jax.tree.map(jnp.copy, params), inner.init(params))

    def update(grads: Any, state: EmaState, params: Any = None, **extra: Any) -> tuple[Any, EmaState]:
        updates, new = inner.update(grads, state.inner, params, **extra)
        average = jax.tree.map(
            lambda old, new: decay * old + (1 - decay) * new,
            state.ema_params,
            optax.apply_updates(params, updates),
        )
        return updates, EmaState(_if_updated(new, average, state.ema_params), new)

    return optax.GradientTransformationExtraArgs(init, update)


def keep_norms(
    inner: optax.GradientTransformation, *, modules: bool = False
) -> optax.GradientTransformationExtraArgs:
    """Keeps the norms of `inner`'s gradients, updates and new parameters (float32): `state.norms`.

    `grad_norm`, `update_norm`, `param_norm`, and with `modules` a `grad_norm/<module>` per first key
    of the parameters' paths. A managed training step logs them in the `norms` collection. Around an
    `accumulate` part, the gradients are the accumulated mean, and a micro-step keeps the last norms.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> tx = keep_norms(optax.sgd(1.0), modules=True)
        >>> params = {"a": jnp.array([0.0]), "b": jnp.array([0.0])}
        >>> _, state = tx.update({"a": jnp.array([3.0]), "b": jnp.array([4.0])}, tx.init(params), params)
        >>> {name: float(norm) for name, norm in state.norms.items()}
        {'grad_norm': 5.0, 'update_norm': 5.0, 'param_norm': 5.0, 'grad_norm/a': 3.0, 'grad_norm/b': 4.0}
    """
    inner = optax.with_extra_args_support(inner)

    def norms(grads: Any, updates: Any, params: Any) -> dict[str, jax.Array]:
        found = {"grad_norm": _norm(grads), "update_norm": _norm(updates), "param_norm": _norm(params)}
        if modules:
            groups = by_module(grads)
            if "" in groups:
                raise ValueError(
                    f"log_norms='modules' names a norm by the first key of each parameter's path, but the "
                    f"parameters are one array {short(groups[''][0])}; use log_norms=True"
                )
            found.update({f"grad_norm/{name}": _norm(part) for name, part in groups.items()})
        return found

    def init(params: Any) -> NormsState:
        names = jax.eval_shape(norms, params, params, params)
        return NormsState({name: jnp.zeros((), jnp.float32) for name in names}, inner.init(params))

    def update(grads: Any, state: NormsState, params: Any = None, **extra: Any) -> tuple[Any, NormsState]:
        updates, new = inner.update(grads, state.inner, params, **extra)
        received, multi = grads, optax.tree_utils.tree_get(state.inner, _MULTI)
        if multi is not None:
            # What optax.MultiSteps passes its optimizer: optax's own running mean, which XLA computes
            # once for both.
            n = multi.mini_step
            with jax.numpy_dtype_promotion("standard"):
                received = jax.tree.map(
                    lambda grad, acc: (acc + (grad - acc) / (n + 1)).astype(grad.dtype),
                    grads,
                    multi.acc_grads,
                )
        found = norms(received, updates, optax.apply_updates(params, updates))
        return updates, NormsState(_if_updated(new, found, state.norms), new)

    return optax.GradientTransformationExtraArgs(init, update)


def _if_updated(inner_state: Any, new: Any, old: Any) -> Any:
    """`new`, or `old` where `inner_state` is an accumulation's that did not update at this micro-step."""
    multi = optax.tree_utils.tree_get(inner_state, _MULTI)
    if multi is None:
        return new
    return _where(jnp.asarray(optax.MultiSteps(optax.identity(), 1).has_updated(multi)), new, old)
