"""Training options: mixed precision, accumulation, skipping non-finite steps and spikes, the EMA, norms.

Each option that acts on optimizer steps is an optax transformation whose state lives in `opt_state`
(`loss_scaling`, `accumulate`, `ema`, `keep_norms`, `skip_spikes`), built on optax's own pieces
(`optax.MultiSteps`, `optax.apply_if_finite`'s skipping); `TrainingOptions.wrap` puts them around the
user's `tx`, and a user may chain them by hand (docs/recipes.md, "The options as optax parts").
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
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
        skip_spikes: a `ciclo.SpikeGuard`: skip the optimizer steps whose loss or
            gradient norm spikes (default None).
    """

    precision: str | Precision
    accumulate_steps: int
    ema_decay: float | None
    log_norms: bool | Literal["modules"]
    skip_spikes: SpikeGuard | None


OPTION_NAMES: Final = frozenset(TrainingOptionsKwargs.__annotations__)

_KEPT_NORMS: Final = {
    "False": "none",
    "True": "the global norms",
    "modules": "the global and per-module norms",
}
"""What a state keeps in its norms by `str(log_norms)`, in words."""

_PARTS: Final = {
    "precision": "a loss scale (loss_scale)",
    "ema_decay": "an EMA of the weights (ema_params)",
    "skip_spikes": "a spike guard's statistics (spikes)",
}
"""What the part an option adds keeps in the optimizer state, in words (a resume refusal's)."""

_MULTI: Final = optax.MultiStepsState.__name__
"""How `optax.tree_utils.tree_get` finds the accumulation's state (a part state is found by its name)."""


SIGNALS: Final = ("loss", "grad_norm")
"""What a `SpikeGuard` may judge."""


@jax.tree_util.register_static  # kept in `SpikeStats` with no array: `train_loop`'s watch reads its limit
@final
@dataclasses.dataclass(frozen=True)
class SpikeGuard:
    """Skips the optimizer steps whose loss or gradient norm spikes: `create_*_state(..., skip_spikes=)`.

    A step whose judged value is above the mean of the last `window` accepted optimizer steps by more
    than `factor` standard deviations (once `warmup` steps were accepted), or is not finite, leaves the
    parameters, the optimizer state and the EMA as they were, and does not enter the statistics, which
    live in `opt_state` (docs/recipes.md, "Skipping loss and gradient spikes").

    Attributes:
        window: the accepted optimizer steps the mean and standard deviation are taken over.
        factor: the standard deviations above the mean that make a spike.
        on: what is judged: `"loss"` (the step's total loss; under accumulation, the
            mean over its micro-batches), `"grad_norm"` (the global norm of the
            gradients the optimizer receives), or both.
        warmup: the accepted optimizer steps before the first judgement (None: `window`).
        max_consecutive: `train_loop` stops with an error once this many optimizer
            steps in a row were skipped (None: it never stops for them).

    Example:
        >>> import ciclo
        >>> ciclo.SpikeGuard(window=64, on="loss")
        SpikeGuard(window=64, factor=6.0, on=('loss',), warmup=None, max_consecutive=None)
    """

    window: int = 128
    factor: float = 6.0
    on: Sequence[str] = SIGNALS
    warmup: int | None = None
    max_consecutive: int | None = None

    def __post_init__(self) -> None:
        check_int(self.window, "window", 2)
        factor = self.factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor < math.inf:
            raise ValueError(
                f"factor must be a number > 0 (standard deviations), e.g. 6.0; got {short(factor)}"
            )
        on = tuple(
            [self.on] if isinstance(self.on, str) else self.on if isinstance(self.on, (tuple, list)) else ()
        )
        if not on or len(set(on)) < len(on) or not set(on) <= set(SIGNALS):
            raise ValueError(
                f"on must be 'loss', 'grad_norm' or both, e.g. on=('loss', 'grad_norm'); got {short(self.on)}"
            )
        if self.warmup is not None:
            check_int(self.warmup, "warmup", 2, " or None (the window)")
        if self.max_consecutive is not None:
            check_int(self.max_consecutive, "max_consecutive", 1, " or None")
        object.__setattr__(self, "factor", float(factor))
        object.__setattr__(self, "on", on)


@final
@dataclasses.dataclass(frozen=True)
class TrainingOptions:
    """The training options of a managed state (static): `TrainingOptionsKwargs`, checked.

    `precision` may be a built-in policy's name; it is kept as its `Precision`.

    Raises:
        ValueError: for an unknown `precision`, `accumulate_steps` below 1, an
            `ema_decay` outside [0, 1) or a `log_norms` other than a bool or `"modules"`.
        TypeError: for a `skip_spikes` other than a `SpikeGuard` or None.

    Example:
        >>> options = TrainingOptions(precision="bf16-mixed", accumulate_steps=4, ema_decay=0.999)
        >>> options.accumulate_steps, options.ema_decay, options.resume_options()["precision"]
        (4, 0.999, 'bf16-mixed')
    """

    precision: Precision = PRECISIONS["32"]
    accumulate_steps: int = 1
    ema_decay: float | None = None
    log_norms: bool | Literal["modules"] = False
    skip_spikes: SpikeGuard | None = None

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
        if not isinstance(self.skip_spikes, (SpikeGuard, type(None))):
            raise TypeError(
                "skip_spikes must be a ciclo.SpikeGuard, e.g. skip_spikes=ciclo.SpikeGuard(window=128, "
                f"factor=6.0), or None; got {short(self.skip_spikes)}"
            )
        object.__setattr__(self, "precision", policy)
        object.__setattr__(self, "ema_decay", None if decay is None else float(decay))

    def wrap(self, tx: optax.GradientTransformation) -> optax.GradientTransformation:
        """`tx` with the options' parts around it; `tx` itself without options (docs/recipes.md).

        From the inside out: `accumulate`, `keep_norms`, `ema`, `skip_spikes`, `loss_scaling`. The
        guard judges whole optimizer steps, and a skip restores the EMA and norms inside it; loss
        scaling hands it unscaled gradients, and its own skip of a non-finite step restores the guard's
        statistics too.

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
        if self.skip_spikes is not None:
            tx = skip_spikes(tx, self.skip_spikes)
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
            "skip_spikes": self.skip_spikes,
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
            "skip_spikes": self.skip_spikes and {**vars(self.skip_spikes), "on": list(self.skip_spikes.on)},
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
        else:  # ema_decay, skip_spikes: another decay, factor, warmup or limit is noted
            had, has = old is not None, getattr(self, name) is not None
            now = self.resume_options()[name]
            if name == "skip_spikes" and had and has and any(old.get(k) != now[k] for k in ("window", "on")):
                return (
                    f"the spike guard's statistics in the backup hold the last {short(old.get('window'))} "
                    f"values of {short(old.get('on'))}, and this state's guard judges the last "
                    f"{now['window']} of {short(now['on'])}"
                )
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


class SpikeStats(NamedTuple):
    """What `skip_spikes` keeps in `opt_state`, so that a resumed run decides as the run would have.

    Attributes:
        guard: the `SpikeGuard` (static: no array).
        history: the last `window` accepted values of each judged signal, a ring (`[len(on), window]`).
        accepted: the optimizer steps accepted so far; the next value goes at `accepted % window`.
        judged: the last optimizer step's judged values and their thresholds (`[2, len(on)]`).
        loss: under accumulation, the mean loss of the optimizer step's micro-batches so far.
        skipped: 1 where the last train step skipped an optimizer step, else 0.
        skipped_steps: the optimizer steps skipped so far.
        skipped_in_a_row: the optimizer steps skipped since the last one accepted.
    """

    guard: SpikeGuard
    history: jax.Array
    accepted: jax.Array
    judged: jax.Array
    loss: jax.Array
    skipped: jax.Array
    skipped_steps: jax.Array
    skipped_in_a_row: jax.Array


class SpikeState(NamedTuple):
    """The state of `skip_spikes`: its statistics, and the wrapped state."""

    spikes: SpikeStats
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
        multi = optax.tree_utils.tree_get(state.inner, _MULTI)
        step_grads = grads if multi is None else _mean_with(grads, multi.acc_grads, multi.mini_step)
        found = norms(step_grads, updates, optax.apply_updates(params, updates))
        return updates, NormsState(_if_updated(new, found, state.norms), new)

    return optax.GradientTransformationExtraArgs(init, update)


def skip_spikes(
    inner: optax.GradientTransformation, guard: SpikeGuard
) -> optax.GradientTransformationExtraArgs:
    """Skips the optimizer steps of `inner` whose loss or gradient norm spikes (`SpikeGuard`).

    The decision is a `jnp.where` in the step. The loss is the `value=` extra argument (which
    `apply_gradients` passes). Around an `accumulate` part it judges each optimizer step, and a skip
    drops the step's micro-batches. `SpikeStats`: `spike_stats(state.opt_state)`.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> tx = skip_spikes(optax.sgd(1.0), SpikeGuard(window=2, on="loss"))
        >>> state, losses = tx.init(jnp.zeros(())), [1.0, 1.5, 9.0, 1.2]
        >>> for loss in losses:
        ...     updates, state = tx.update(jnp.array(1.0), state, jnp.zeros(()), value=jnp.array(loss))
        ...     print(float(updates), int(state.spikes.skipped), int(state.spikes.accepted))
        -1.0 0 1
        -1.0 0 2
        0.0 1 2
        -1.0 0 3
    """
    inner = optax.with_extra_args_support(inner)
    warmup = guard.window if guard.warmup is None else guard.warmup
    ring = jnp.arange(guard.window)[None, :]  # the positions in the history, for its every row

    def init(params: Any) -> SpikeState:
        size, count = len(guard.on), functools.partial(jnp.zeros, (), jnp.int32)  # a buffer each: donated
        stats = SpikeStats(
            guard,
            history=jnp.zeros((size, guard.window), jnp.float32),
            accepted=count(),
            judged=jnp.zeros((2, size), jnp.float32),
            loss=jnp.zeros((), jnp.float32),
            skipped=count(),
            skipped_steps=count(),
            skipped_in_a_row=count(),
        )
        return SpikeState(stats, inner.init(params))

    def update(grads: Any, state: SpikeState, params: Any = None, **extra: Any) -> tuple[Any, SpikeState]:
        stats, multi = state.spikes, optax.tree_utils.tree_get(state.inner, _MULTI)
        updates, new = inner.update(grads, state.inner, params, **extra)
        done = _updated(new)  # this call makes an optimizer step
        done = jnp.asarray(True) if done is None else done
        loss = stats.loss
        signals = {}
        if "loss" in guard.on:
            if extra.get("value") is None:
                raise ValueError(
                    "skip_spikes judges the loss, and the update got none: pass it as value=, e.g. "
                    "state.apply_gradients(grads=grads, value=loss) (managed.train_step does), or judge "
                    "only the gradients with ciclo.SpikeGuard(on='grad_norm')"
                )
            value = jnp.asarray(extra["value"], jnp.float32)
            signals["loss"] = value if multi is None else _mean_with(value, stats.loss, multi.mini_step)
            loss = jnp.where(done, jnp.zeros_like(loss), signals["loss"])
        if "grad_norm" in guard.on:
            step_grads = grads if multi is None else _mean_with(grads, multi.acc_grads, multi.mini_step)
            signals["grad_norm"] = _norm(step_grads)
        values = jnp.stack([signals[name] for name in guard.on])
        filled = jnp.minimum(stats.accepted, guard.window)
        seen, count = ring < filled, jnp.maximum(filled, 1).astype(jnp.float32)
        mean = jnp.sum(jnp.where(seen, stats.history, 0), axis=1) / count
        deviation = jnp.where(seen, stats.history - mean[:, None], 0)
        threshold = mean + guard.factor * jnp.sqrt(jnp.sum(deviation**2, axis=1) / count)
        spike = ~jnp.all(jnp.isfinite(values)) | ((stats.accepted >= warmup) & jnp.any(values > threshold))
        skip, accept = done & spike, done & ~spike
        skipped = skip.astype(jnp.int32)
        spikes = stats._replace(
            history=jnp.where(
                accept & (ring == stats.accepted % guard.window), values[:, None], stats.history
            ),
            accepted=stats.accepted + accept.astype(jnp.int32),
            judged=jnp.where(done, jnp.stack([values, threshold]), stats.judged),
            loss=loss,
            skipped=skipped,
            skipped_steps=stats.skipped_steps + skipped,
            skipped_in_a_row=jnp.where(done, (stats.skipped_in_a_row + 1) * skipped, stats.skipped_in_a_row),
        )
        updates = jax.tree.map(lambda update: jnp.where(skip, jnp.zeros_like(update), update), updates)
        kept = _where(skip, state.inner, new)
        if multi is not None:  # a skipped optimizer step drops its micro-batches: the accumulation restarts
            fresh = optax.tree_utils.tree_get(new, _MULTI)
            kept = optax.tree_utils.tree_set(kept, acc_grads=fresh.acc_grads, mini_step=fresh.mini_step)
        return updates, SpikeState(spikes, kept)

    return optax.GradientTransformationExtraArgs(init, update)


def spike_stats(opt_state: Any) -> SpikeStats | None:
    """The `SpikeStats` of a `skip_spikes` part in `opt_state`, else None."""
    found: SpikeState | None = optax.tree_utils.tree_get(opt_state, SpikeState.__name__)
    return None if found is None else found.spikes


def skip_metrics(opt_state: Any) -> dict[str, jax.Array]:
    """What a training step logs of its skips: `loss_scale`, `skipped_steps`, and `skipped` with a guard."""
    metrics: dict[str, jax.Array] = {}
    scaled: ScaledState | None = optax.tree_utils.tree_get(opt_state, ScaledState.__name__)
    if scaled is not None:
        metrics["loss_scale"] = scaled.loss_scale.scale
        metrics["skipped_steps"] = scaled.loss_scale.skipped_steps
    spikes = spike_stats(opt_state)
    if spikes is not None:
        # A step skipped for its non-finite gradients restored the guard's statistics: it says so itself.
        stopped = 0 if scaled is None else (scaled.loss_scale.skipped_in_a_row > 0).astype(jnp.int32)
        metrics["skipped"] = jnp.maximum(spikes.skipped, stopped)
        metrics["skipped_steps"] = spikes.skipped_steps + metrics.get("skipped_steps", 0)
    return metrics


def _mean_with(value: Any, mean: Any, n: Any) -> Any:
    """`mean`, the mean of `n` values, with `value` added: optax.MultiSteps' running mean.

    Of the gradients, it is what optax.MultiSteps passes its optimizer, which XLA computes once for all.
    """
    with jax.numpy_dtype_promotion("standard"):
        return jax.tree.map(
            lambda value, mean: (mean + (value - mean) / (n + 1)).astype(value.dtype), value, mean
        )


def _updated(inner_state: Any) -> jax.Array | None:
    """Whether the accumulation in `inner_state` updated at this micro-step; None: there is none."""
    multi = optax.tree_utils.tree_get(inner_state, _MULTI)
    if multi is None:
        return None
    return jnp.asarray(optax.MultiSteps(optax.identity(), 1).has_updated(multi))


def _if_updated(inner_state: Any, new: Any, old: Any) -> Any:
    """`new`, or `old` where `inner_state` is an accumulation's that did not update at this micro-step."""
    updated = _updated(inner_state)
    return new if updated is None else _where(updated, new, old)
