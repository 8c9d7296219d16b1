"""A managed state for any model (through a `ModelAdapter`): losses, metrics and the loops' four steps."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, cast, final

import jax
import jax.numpy as jnp
import optax
from typing_extensions import Unpack

from ciclo._src.base.compile_cache import start as start_compile_cache
from ciclo._src.base.frameworks import creator_name
from ciclo._src.base.reprs import short
from ciclo._src.base.roles import Role, field
from ciclo._src.base.types import ModelAdapter, SupportsToModel
from ciclo._src.logs.logs import Logs
from ciclo._src.state import managed as _managed
from ciclo._src.state.managed import AbstractManagedState, create_state
from ciclo._src.state.metrics import Metric, as_metric, call_for_array, call_with_available
from ciclo._src.state.precision import cast_like, to_float32
from ciclo._src.state.training_options import (
    OPTION_NAMES,
    TrainingOptions,
    TrainingOptionsKwargs,
    without_tx,
)
from ciclo._src.strategies._protocols import Strategy


@final
class NamedLosses(Mapping[str, Callable[..., Any]]):
    """The loss functions of a `ModelState` by name; static, compared by identity (steps compile once).

    Example:
        >>> losses = NamedLosses({"mse": lambda preds, target: (preds - target) ** 2})
        >>> list(losses)
        ['mse']
    """

    __slots__ = ("_losses",)

    def __init__(self, losses: Mapping[str, Callable[..., Any]]) -> None:
        self._losses = dict(losses)

    def __getitem__(self, name: str) -> Callable[..., Any]:
        return self._losses[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._losses)

    def __len__(self) -> int:
        return len(self._losses)

    def __repr__(self) -> str:
        return f"NamedLosses({self._losses!r})"

    __eq__ = object.__eq__
    __hash__ = object.__hash__


BATCH_KEYS = (("inputs", "target"), ("image", "label"), ("x", "y"))
"""The `(inputs, target)` key pairs a batch given as a mapping may use, in lookup order."""


def split_batch(batch: Any) -> tuple[Any, Any]:
    """Splits a batch into `(inputs, target)`; `target` is None when the batch has none.

    A batch is `(inputs, target)`, `(inputs,)`, the inputs alone, or a mapping with a pair of `BATCH_KEYS`
    (the target key may be absent).

    Example:
        >>> split_batch({"image": [1, 2], "label": [0, 1]})
        ([1, 2], [0, 1])
    """
    if isinstance(batch, Mapping):
        for inputs, target in BATCH_KEYS:
            if inputs in batch:
                return batch[inputs], batch.get(target)
        pairs = ", ".join(f"{short(inputs)}/{short(target)}" for inputs, target in BATCH_KEYS)
        raise KeyError(f"a batch given as a mapping needs the keys {pairs}; it has {sorted(batch)}")
    if isinstance(batch, (tuple, list)):
        if len(batch) > 2:
            raise ValueError(
                f"a batch tuple is (inputs, target) or (inputs,), got {len(batch)} elements; pass "
                "several inputs as one pytree, e.g. ((x1, x2), target), or a dict with 'inputs' and 'target'"
            )
        return batch[0], (batch[1] if len(batch) == 2 else None)
    return batch, None


@final
class ModelState(AbstractManagedState):
    """A training state for any model: `train_step`, `test_step`, `predict_step`, `reset_step`.

    Make one with `ciclo.create_model_state(adapter, ...)` or a framework's
    `create_*_state`; what the steps do is in docs/frameworks/index.md.

    Attributes:
        model_state: the model's own state (batch statistics), or None (role `MODEL_STATE`).
        metrics: the running metrics by name (`ciclo.metrics.Metric`s; role `METRICS`).
        key: the raw `uint32` data of the key steps derive theirs from (`step_key`; role `KEY`).
        adapter: the `ciclo.types.ModelAdapter` (static).
        losses: the loss functions by name (static).
        key_impl: the PRNG implementation of `key` (static).

    Example:
        >>> import ciclo, jax, jax.numpy as jnp, optax
        >>> class Linear:  # a ModelAdapter for a linear model
        ...     def init(self, key, inputs):
        ...         return jnp.zeros(inputs.shape[-1]), None
        ...     def apply(self, params, model_state, inputs, *, key, training):
        ...         return inputs @ params, model_state
        >>> state = ciclo.create_model_state(
        ...     Linear(),
        ...     inputs=jnp.ones((1, 2)),
        ...     tx=optax.sgd(0.3),
        ...     losses={"mse": lambda preds, target: (preds - target) ** 2},
        ...     metrics={"mae": lambda preds, target: abs(preds - target)},
        ... )
        >>> batch = (jnp.array([[1.0, 0.0], [0.0, 1.0]]), jnp.array([2.0, -1.0]))
        >>> for _ in range(30):
        ...     logs, state = state.train_step(batch)
        >>> round(float(logs.losses.mse), 4), state.params.round(2)
        (0.0, Array([ 2., -1.], dtype=float32))
    """

    model_state: Any = field(role=Role.MODEL_STATE)
    metrics: dict[str, Metric] = field(role=Role.METRICS)
    key: jax.Array = field(role=Role.KEY)  # raw data: a typed key costs microseconds to rebuild each step
    adapter: ModelAdapter = field(static=True)
    losses: NamedLosses = field(static=True)
    key_impl: Any = field(static=True)

    @property
    def model(self) -> Any:
        """The trained model in its framework's own form, built anew by the adapter's `to_model`."""
        if not isinstance(self.adapter, SupportsToModel):
            raise AttributeError(
                f"{type(self.adapter).__name__} has no to_model(params, model_state) method, so this "
                "state cannot build its model: add one to the adapter (see ciclo.types.SupportsToModel), "
                "or use state.params and state.model_state"
            )
        params, model_state = self.strategy.unplace((self.params, self.model_state))
        return self.adapter.to_model(params, model_state)

    def resume_options(self) -> dict[str, Any]:
        """The training options and `key_impl`, as a backup records them (docs/resume.md)."""
        return {**self.options.resume_options(), "key_impl": str(self.key_impl)}

    def resume_refusal(self, name: str, old: Any) -> str | None:
        """Why a backup whose option `name` was `old` cannot be resumed into this state; None where it can."""
        if name == "key_impl":
            return "its random key is the data of another PRNG implementation"
        return self.options.resume_refusal(name, old)

    def step_key(self) -> jax.Array:
        """The random key of the current step: `key` folded with `step`, a typed key."""
        return jax.random.fold_in(jax.random.wrap_key_data(self.key, impl=self.key_impl), self.step)

    def _apply(self, inputs: Any, *, training: bool) -> tuple[Any, Any]:
        policy = self.options.precision
        preds, model_state = self.adapter.apply(
            policy.cast(self.params),
            self.model_state,
            policy.cast(inputs),
            key=self.step_key(),
            training=training,
        )
        if policy.compute_dtype is None:
            return preds, model_state
        # Predictions in float32; the model's own state (batch statistics) keeps its dtype: normalisation
        # layers update their statistics in float32 from half-precision activations (flax, haiku promote).
        return to_float32(preds), cast_like(model_state, self.model_state)

    def _run_model(self, batch: Any, *, training: bool) -> tuple[Logs, ModelState]:
        inputs, target = split_batch(batch)
        try:
            preds, model_state = self._apply(inputs, training=training)
        except Exception as error:  # any framework's own error (flax's ScopeParamShapeError, ...)
            error.add_note(
                f"the model failed on inputs {_shapes(inputs)}: give every step (train, test, predict) "
                "batches shaped like those the state was created with",
            )
            raise
        available: dict[str, Any] = {
            "preds": preds,
            "logits": preds,
            "inputs": inputs,
            "batch": batch,
            "params": self.params,
        }
        if target is not None:
            available["target"] = available["labels"] = target
        logs = Logs()
        total = jnp.zeros((), jnp.float32)
        for name, fn in self.losses.items():
            hint = functools.partial(_loss_hint, name, preds, target)
            value = jnp.mean(call_for_array(fn, f"loss {short(name)}", hint, **available))
            logs.add_loss(name, value)
            total = total + value
        metrics = {}
        for name, metric in self.metrics.items():
            try:
                metrics[name] = call_with_available(metric.update, **available, loss=total)
            except (TypeError, ValueError) as error:
                error.add_note(f"raised by metric {short(name)}")
                raise
            logs.add_metric(name, metrics[name])
        return logs, self.replace(model_state=model_state, metrics=metrics)

    def _train(self, batch: Any) -> tuple[Logs, ModelState]:
        if self.tx is None:
            raise ValueError(without_tx(creator_name(self.adapter)))
        if not self.losses:
            raise ValueError(
                "this state has no losses to train on; create it with losses={'loss': fn}, e.g. "
                "losses={'loss': optax.softmax_cross_entropy_with_integer_labels}"
            )
        return self._run_model(batch, training=True)

    def _test(self, batch: Any) -> tuple[Logs, ModelState]:
        return self._run_model(batch, training=False)

    def _predict(self, batch: Any) -> tuple[Logs, ModelState]:
        inputs, _ = split_batch(batch)
        preds, _ = self._apply(inputs, training=False)
        return Logs().add_output("preds", preds), self

    def _reset(self, batch: Any = None) -> tuple[None, ModelState]:
        return None, self.replace(metrics={name: metric.reset() for name, metric in self.metrics.items()})

    train_step = _managed.train_step(_train)
    test_step = _managed.step(_test)
    predict_step = _managed.step(_predict)
    _reset_metrics = _managed.step(_reset)

    def reset_step(self) -> ModelState:
        """Returns the state with empty metrics, placed as before."""
        _, state = self._reset_metrics(None)
        return cast(ModelState, state)


def _shapes(tree: Any) -> str:
    """`float32[4, 8]`-style shapes and dtypes of the first leaves of a batch, then a count, for error notes.

    Example:
        >>> import numpy as np
        >>> _shapes([np.ones((4, 8), np.float32)] * 10)
        'float32[4, 8], float32[4, 8], ... and 2 more leaves'
    """
    leaves = jax.tree.leaves(tree)
    shown = ", ".join(
        f"{getattr(x, 'dtype', type(x).__name__)}{list(getattr(x, 'shape', ()))}" for x in leaves[:8]
    )
    more = len(leaves) - 8
    return (shown + (f" and {more} more leaves" if more > 0 else "")) or "(none)"


def _loss_hint(name: str, preds: Any, target: Any) -> str:
    return (
        f"loss {short(name)} failed on preds {_shapes(preds)} and target {_shapes(target)}; "
        "integer-label losses (optax.softmax_cross_entropy_with_integer_labels) need int "
        "labels, e.g. labels.astype(np.int32)"
    )


class ModelStateSettings(TrainingOptionsKwargs, total=False):
    """The keywords of `ciclo.create_model_state` (documented there) that every `create_*_state` forwards."""

    tx: optax.GradientTransformation | None
    losses: Mapping[str, Callable[..., Any]] | Callable[..., Any] | None
    metrics: Mapping[str, Any] | None
    strategy: str | Strategy
    key: jax.Array | int


def setting_behind(path: tuple[str, ...]) -> tuple[str, str] | None:
    """The `create_*_state` setting behind the leaf at `path` and what it holds, for a checkpoint's errors."""
    # The options' parts keep their state in opt_state, each under a field name of its own.
    return next((_SETTING_OF_FIELD[key] for key in (*path[1:], *path[:1]) if key in _SETTING_OF_FIELD), None)


_SETTING_OF_FIELD: Final = {
    "metrics": ("metrics=", "the running metrics (metrics)"),
    "loss_scale": ("precision=", "the loss scale of precision='16-mixed' (loss_scale)"),
    "ema_params": ("ema_decay=", "the EMA of the weights (ema_params)"),
    "norms": ("log_norms=", "the norms log_norms keeps (norms)"),
    "spikes": ("skip_spikes=", "the spike guard's statistics (spikes)"),
    **dict.fromkeys(
        optax.MultiStepsState._fields,
        ("accumulate_steps=", "the micro-batches optax.MultiSteps accumulates (opt_state)"),
    ),
    "opt_state": ("tx=", "the optimizer state: another optimizer, or none (opt_state)"),
}


def create_model_state(
    adapter: ModelAdapter,
    *,
    inputs: Any = None,
    variables: tuple[Any, Any] | None = None,
    **settings: Unpack[ModelStateSettings],
) -> ModelState:
    """Initialises a model through its adapter and returns its `ModelState`, built in place for `strategy`.

    Every `create_*_state` takes the keywords after `variables` as they are here (`ModelStateSettings`).

    Args:
        adapter: how to initialise and apply the model (see `ciclo.types.ModelAdapter`).
        inputs: sample inputs to initialise the model with (`adapter.init`), e.g.
            `jnp.empty((1, 28, 28, 1))`.
        variables: `(params, model_state)` of a model that is built initialised
            (flax nnx, equinox), instead of `inputs`.
        **settings: `tx`: the optax optimizer (without it the state is for
            inference, and refuses to train). `losses`: `{name: fn}`, summed for
            training; one function is named `"loss"`. `metrics`: `{name: metric}`:
            functions, `ciclo.metrics.Metric`s or clu metrics. `strategy`: a
            strategy or its name (default `"jit"`). `key`: a seed (default 0) or a
            `jax.random.key`. And the training options (`managed.TrainingOptionsKwargs`).

    Raises:
        TypeError: for a setting of the wrong kind, or not exactly one of `inputs` and `variables`.
        ValueError: for a training option out of its range, or one that needs a `tx`.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> class Scale:
        ...     def init(self, key, inputs):
        ...         return jnp.ones(()), None
        ...     def apply(self, params, model_state, inputs, *, key, training):
        ...         return params * inputs, model_state
        >>> state = ciclo.create_model_state(Scale(), inputs=jnp.ones(3), tx=optax.sgd(0.1), strategy="eager")
        >>> logs, _ = state.predict_step(jnp.arange(3.0))
        >>> logs.outputs.preds
        Array([0., 1., 2.], dtype=float32)
        >>> inference = ciclo.create_model_state(Scale(), inputs=jnp.ones(3))  # no tx: predicts, never trains
        >>> inference.predict_step(jnp.arange(3.0))[0].outputs.preds
        Array([0., 1., 2.], dtype=float32)
    """
    unknown = sorted(set(settings) - _SETTINGS)
    if unknown:
        raise TypeError(
            f"create_model_state got the unknown keyword(s) {short(unknown)}; it takes {sorted(_SETTINGS)}"
        )
    tx = settings.get("tx")
    if tx is not None and not (hasattr(tx, "init") and hasattr(tx, "update")):
        raise TypeError(f"tx must be an optax optimizer (e.g. optax.adam(1e-3)), got {short(tx)}")
    if (inputs is None) == (variables is None):
        raise TypeError(
            "create_model_state needs sample `inputs` to initialise the model with (e.g. "
            "inputs=jnp.empty((1, 28, 28, 1))), or the `variables` of a model built initialised; "
            + ("got neither" if inputs is None else "got both")
        )
    if isinstance(inputs, (tuple, list)) and inputs and all(type(n) is int for n in inputs):
        raise TypeError(
            f"inputs={short(tuple(inputs))} looks like a shape: inputs must be an example batch, e.g. "
            f"inputs=jnp.zeros({short(tuple(inputs))}), from which the model's shapes are inferred"
        )
    losses = settings.get("losses")
    losses = {} if losses is None else losses
    if callable(losses) and not isinstance(losses, Mapping):
        losses = {"loss": losses}
    if not isinstance(losses, Mapping):
        raise TypeError(f"losses must be a dict of name -> function (or one function), got {short(losses)}")
    for name, fn in losses.items():
        if not isinstance(name, str) or not callable(fn):
            raise TypeError(f"losses must map names to functions; entry {short(name)} is {short(fn)}")
    metrics = settings.get("metrics")
    metrics = {} if metrics is None else metrics
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a dict of name -> metric or function, got {short(metrics)}")
    running: dict[str, Metric] = {}
    for name, metric in metrics.items():
        if not isinstance(name, str):
            raise TypeError(f"metric names must be strings, got {short(name)}")
        try:
            running[name] = as_metric(metric).reset()
        except TypeError as error:
            raise TypeError(f"metric {short(name)}: {error}") from None
    chosen: dict[str, Any] = {name: value for name, value in settings.items() if name in OPTION_NAMES}
    options = TrainingOptions(**chosen)
    start_compile_cache()  # before the key's programs: a rerun reads them back too
    key = settings.get("key", 0)
    if isinstance(key, int) and not isinstance(key, bool):
        key = jax.random.key(key)
    elif isinstance(key, jax.Array) and key.shape == (2,) and key.dtype == jnp.uint32:
        key = jax.random.wrap_key_data(key)
    elif not (isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)):
        raise TypeError(f"key must be an int seed or a jax.random.key, got {short(key)}")
    init_key, state_key = jax.random.split(key)

    def fields(key: jax.Array, inputs: Any, variables: Any, values: dict[str, Any]) -> dict[str, Any]:
        # Under a mesh strategy this runs inside `jax.jit`: the variables are born in their layout.
        params, model_state = adapter.init(key, inputs) if variables is None else variables
        return {"params": params, "model_state": model_state, **values}

    return create_state(
        ModelState,
        fields,
        init_key,
        inputs,
        variables,
        {"metrics": running, "key": jax.random.key_data(state_key)},
        tx=tx,
        strategy=settings.get("strategy", "jit"),
        options=options,
        key_impl=jax.random.key_impl(state_key),
        adapter=adapter,
        losses=NamedLosses(losses),
    )


_SETTINGS: Final = frozenset(ModelStateSettings.__required_keys__ | ModelStateSettings.__optional_keys__)
