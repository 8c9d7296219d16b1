"""The managed API: a state that carries its optimizer and strategy, and steps that only report losses."""

from __future__ import annotations

import abc
import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final, Generic, Self, TypeVar, cast, final, overload

import jax
import jax.numpy as jnp
import numpy as np
import optax
from typing_extensions import dataclass_transform

from ciclo._src.base.batches import Stacked, is_stacked
from ciclo._src.base.compile_cache import start as start_compile_cache
from ciclo._src.base.reprs import path_name, short
from ciclo._src.base.roles import Role, field, fields_with_role, params_field
from ciclo._src.data.fused import as_logs_and_state, scan_steps
from ciclo._src.logs.logs import PERFORMANCE, Entries, Logs
from ciclo._src.state._pytree import FLAT, Lazy, as_flat, register_frozen
from ciclo._src.state.learning_rate import learning_rate_logs
from ciclo._src.state.metrics import Metric
from ciclo._src.state.precision import LossScale
from ciclo._src.state.training_options import (
    OPTION_NAMES,
    EmaState,
    NormsState,
    ScaledState,
    TrainingOptions,
    skip_metrics,
    without_tx,
)
from ciclo._src.strategies._local import Eager
from ciclo._src.strategies._placement import batch_refusal, number_list
from ciclo._src.strategies._protocols import DeviceReductions, Strategy
from ciclo._src.strategies._registry import get_strategy

S = TypeVar("S")

StepBody = Callable[[Any, Any], Any]
"""What a managed step wraps: `(state, batch) -> (logs, state)`, `logs`, or `None`."""

COMPILES: Final = (PERFORMANCE, "compiles")
"""Where a watched step logs its count of compiles: `(collection, entry)`."""


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(dataclasses.field, field))
@dataclasses.dataclass(frozen=True, kw_only=True)
class AbstractManagedState(Lazy):
    """What every managed state is: a pytree that knows its optimizer, strategy and training options.

    Subclass `ManagedState` (or use `ciclo.types.ModelState`): every subclass becomes a frozen,
    keyword-only dataclass registered as a pytree (docs/strategies.md, "Field roles"). It is abstract:
    a subclass without `resume_options` and `resume_refusal` is refused when instantiated (abc's TypeError).

    Attributes:
        step: the number of `apply_gradients` calls (an int32 array).
        params: the trained parameters, any pytree (role `PARAMS`).
        opt_state: the optimizer's state.
        tx: the optax optimizer with the training options' parts around it
            (`TrainingOptions.wrap`; static); None for a state made for inference.
        strategy: where the state lives and how steps compile (static).
        options: the `managed.TrainingOptions` (static).
    """

    step: jax.Array
    params: Any = field(role=Role.PARAMS)
    opt_state: Any
    tx: optax.GradientTransformation | None = field(static=True)
    strategy: Strategy = field(static=True, default_factory=Eager)
    options: TrainingOptions = field(static=True, default=TrainingOptions())

    # abc's refusal at instantiation, without abc.ABCMeta (whose isinstance costs ~0.3 µs once a step):
    # `dataclasses.dataclass` runs `abc.update_abstractmethods` on a class that has this attribute.
    __abstractmethods__: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__abstractmethods__ = frozenset()
        dataclasses.dataclass(frozen=True, kw_only=True)(cls)
        register_frozen(cls)
        params_field(cls)  # a subclass that loses or doubles the params role fails here, not at a step

    @abc.abstractmethod
    def resume_options(self) -> dict[str, Any]:
        """The static options that give this state's arrays their meaning, as JSON data (docs/resume.md)."""

    @abc.abstractmethod
    def resume_refusal(self, name: str, old: Any) -> str | None:
        """Why this state cannot resume a backup whose option `name` was another value, `old`; None: noted."""

    def replace(self, **changes: Any) -> Self:
        """A copy with some fields changed."""
        return dataclasses.replace(cast(Any, self), **changes)  # type: ignore[no-any-return]

    def apply_gradients(self, *, grads: Any, value: Any = None, **changes: Any) -> Self:
        """Applies one optimizer update under the state's training options (docs/recipes.md): `step + 1`.

        `value`, the loss, goes to an optimizer that takes it (`optax.contrib.reduce_on_plateau`);
        `changes` are other fields to replace. `managed.train_step` always passes `value=`: a subclass
        that overrides this method takes it too (and may ignore it).
        """
        if self.tx is None:
            raise ValueError(without_tx(type(self).__name__))
        name = params_field(type(self))
        extra = {} if value is None else {"value": value}
        tx = optax.with_extra_args_support(self.tx)
        updates, opt_state = tx.update(grads, self.opt_state, getattr(self, name), **extra)
        params = optax.apply_updates(getattr(self, name), updates)
        return self.replace(step=self.step + 1, opt_state=opt_state, **{name: params}, **changes)

    @property
    def ema_params(self) -> Any:
        """The EMA of the parameters (`ema_decay`, `managed.ema` in `tx`), else None."""
        found = optax.tree_utils.tree_get(self.opt_state, EmaState.__name__)
        return None if found is None else found.ema_params

    @property
    def loss_scale(self) -> LossScale | None:
        """The `ciclo.types.LossScale` (`precision="16-mixed"`, `managed.loss_scaling`), else None."""
        found = optax.tree_utils.tree_get(self.opt_state, ScaledState.__name__)
        return None if found is None else found.loss_scale

    @property
    def norms(self) -> dict[str, jax.Array] | None:
        """The last optimizer step's norms by name (`log_norms`, `managed.keep_norms`), else None."""
        found = optax.tree_utils.tree_get(self.opt_state, NormsState.__name__)
        return None if found is None else found.norms

    def scale_loss(self, loss: jax.Array) -> jax.Array:
        """What `managed.train_step` differentiates: `loss` times the loss scale under loss scaling."""
        scale = self.loss_scale
        return loss if scale is None else loss * scale.scale

    def step_metrics(self) -> dict[str, jax.Array]:
        """What a training step logs in `metrics` after the update: learning rate, loss scale, skips."""
        return {**learning_rate_logs(self.opt_state), **skip_metrics(self.opt_state)}

    def with_ema_params(self) -> Self:
        """The state with its EMA weights as its parameters (a state created with `ema_decay`)."""
        ema = self.ema_params
        if ema is None:
            raise ValueError(
                "this state keeps no EMA of its weights: create it with ema_decay=, e.g. "
                "ciclo.create_model_state(..., ema_decay=0.999)"
            )
        return self.replace(**{params_field(type(self)): ema})

    def with_strategy(self, strategy: str | Strategy) -> Self:
        """Moves the state to another strategy (docs/strategies.md, "Creating and moving a state")."""
        new = get_strategy(strategy)
        if new == self.strategy:
            return self
        return new.place(self.strategy.unplace(self).replace(strategy=new))


class ManagedState(AbstractManagedState):
    """A training state that knows its optimizer and its strategy; a pytree. Subclass it to add fields.

    See docs/strategies.md. Under a mixed precision, cast what your step computes with through
    `state.options.precision.cast(...)`.

    Attributes:
        apply_fn: the model's apply function, for the step's use (static).

    Example:
        >>> import jax, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> class State(managed.ManagedState):
        ...     stats: jax.Array = managed.field(role=managed.Role.MODEL_STATE)
        ...     rng: jax.Array = managed.field(role=managed.Role.KEY)
        >>> state = State.create(
        ...     params={"w": jnp.zeros(2)}, tx=optax.sgd(0.1), stats=jnp.zeros(2), rng=jax.random.key(0)
        ... )
        >>> state = state.apply_gradients(grads={"w": jnp.ones(2)})
        >>> state.params["w"], int(state.step)
        (Array([-0.1, -0.1], dtype=float32), 1)
        >>> managed.fields_with_role(State, managed.Role.KEY)
        ('rng',)
    """

    apply_fn: Callable[..., Any] | None = field(static=True, default=None)

    @classmethod
    def create(
        cls,
        *,
        params: Any,
        tx: optax.GradientTransformation,
        apply_fn: Callable[..., Any] | None = None,
        strategy: str | Strategy = "jit",
        **fields: Any,
    ) -> Self:
        """Makes a state at step 0 with a fresh optimizer state, built in place for `strategy`.

        Args:
            params: the parameters to train, any pytree of arrays.
            tx: an optax optimizer.
            apply_fn: the model's apply function, kept for the steps' use.
            strategy: a strategy or its name (see `ciclo.strategies.get_strategy`).
            **fields: the values of a subclass's own fields, and the training
                options (`managed.TrainingOptionsKwargs`).
        """
        check_params(params)
        options = TrainingOptions(**{name: fields.pop(name) for name in OPTION_NAMES & fields.keys()})
        # Static fields are configuration: they go around the strategy's placement and jax.jit.
        static = {f.name for f in dataclasses.fields(cast(Any, cls)) if f.metadata.get("static")}
        return create_state(
            cls,
            lambda values: values,
            {"params": params, **{name: value for name, value in fields.items() if name not in static}},
            tx=tx,
            strategy=strategy,
            options=options,
            apply_fn=apply_fn,
            **{name: value for name, value in fields.items() if name in static},
        )

    def resume_options(self) -> dict[str, Any]:
        """The training options (`managed.TrainingOptionsKwargs`), as plain data (JSON)."""
        return self.options.resume_options()

    def resume_refusal(self, name: str, old: Any) -> str | None:
        """The training options' verdict (`TrainingOptions.resume_refusal`); any other change is refused."""
        if name in OPTION_NAMES:
            return self.options.resume_refusal(name, old)
        return f"the backup's arrays were made with {name}={short(old)}"


def create_state(
    cls: type[S],
    fields: Callable[..., Mapping[str, Any]],
    *args: Any,
    tx: optax.GradientTransformation | None,
    strategy: str | Strategy,
    options: TrainingOptions,
    **static: Any,
) -> S:
    """A managed state at step 0, built by `strategy.create` (`tx=None`: for inference).

    `fields(*args)`, run under the strategy, returns the array fields, the parameters under `"params"`.
    """
    start_compile_cache()  # building a state compiles most of a run's programs: a rerun reads them back
    placed = get_strategy(strategy)
    if tx is None:
        options.check_without_optimizer()
    else:
        tx = options.wrap(tx)

    def init(*args: Any) -> S:
        values = dict(fields(*args))
        params = values.pop("params")
        check_params(params)
        return cls(  # type: ignore[call-arg]
            step=jnp.zeros((), jnp.int32),
            opt_state=None if tx is None else tx.init(params),
            tx=tx,
            strategy=placed,
            options=options,
            **{params_field(cls): params},
            **values,
            **static,
        )

    state = placed.create(init, *args)
    options.check(cast(AbstractManagedState, state).opt_state)
    return state


def static_options(state: Any) -> dict[str, dict[str, Any]]:
    """What a backup records: the `resume_options()` of each managed state in `state`, by path, as JSON."""
    found = {}
    for path, node in _managed_states(state).items():
        try:
            found[path] = json.loads(json.dumps(node.resume_options(), allow_nan=False))
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"{type(node).__name__}.resume_options() must return plain data (JSON): {error}"
            ) from None
    return found


def _managed_states(state: Any) -> dict[str, AbstractManagedState]:
    leaves = jax.tree_util.tree_flatten_with_path(
        state, is_leaf=lambda n: isinstance(n, AbstractManagedState)
    )[0]
    return {jax.tree_util.keystr(path): n for path, n in leaves if isinstance(n, AbstractManagedState)}


class ResumeRefused(ValueError):
    """A resume refused for an option of the state: the backups before were written with it too."""


def check_static_options(recorded: Any, state: Any, where: str) -> list[str]:
    """Notes on the options that changed between a backup's record (`static_options`) and `state`.

    Only states and options on both sides are compared (the structure check names the rest).
    """
    # `recorded` is read from JSON, whose keys are strings.
    if not isinstance(recorded, dict) or not all(isinstance(options, dict) for options in recorded.values()):
        raise ValueError(f"the backup {where}: options is {short(recorded)}, not a dict of options by state")
    nodes = _managed_states(state)
    current = static_options(state)
    notes = []
    for path in sorted(set(recorded) & set(current)):
        for name in sorted(set(recorded[path]) & set(current[path])):
            old, new = recorded[path][name], current[path][name]
            if old == new:
                continue
            option = f"{path} {name}" if path else name
            reason = nodes[path].resume_refusal(name, old)
            if reason is not None:
                raise ResumeRefused(
                    f"the backup {where} was written with {option}={short(old)}, and this run's state has "
                    f"{option}={short(new)}: {reason}. Resume with {name}={short(old)}, or give backup= "
                    "another directory to start afresh"
                )
            notes.append(f"{option}: {short(old)} -> {short(new)}")
    return notes


_ARRAY_LEAVES = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)


def check_params(params: Any) -> None:
    """Refuses parameters with a leaf that is not an array (an equinox module's functions), naming it.

    Example:
        >>> import jax
        >>> check_params({"w": jax.numpy.ones(2), "activation": jax.nn.relu})
        Traceback (most recent call last):
        TypeError: params/activation is ... not an array: ...
    """
    found = [
        (path, leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(params)
        if not isinstance(leaf, _ARRAY_LEAVES)
    ]
    if not found:
        return
    path, leaf = found[0]
    more = f" (and {len(found) - 1} more leaves)" if len(found) > 1 else ""
    raise TypeError(
        f"params/{path_name(path)} is {short(leaf)}{more}, not an array: optax cannot train it "
        "and jax.jit cannot take it. Train only the arrays and keep the rest in a static field: for an "
        "equinox module, ciclo.create_equinox_state(model, ...) does it; by hand, "
        "`params, static = eqx.partition(model, eqx.is_array)`, a field "
        "`static: Any = managed.field(static=True)` given `static=static`, and "
        "`eqx.combine(state.params, state.static)` in the step"
    )


Listener = Callable[[Strategy, Any, Any, tuple[int, int]], None]
"""Told the inputs of a step's program: `(strategy, state, batch, cuts)` (`ManagedStep.listen`)."""


@final
class ManagedStep(Generic[S]):
    """A step function run under a strategy: what `train_step` and `step` return.

    Call it as `logs, state = step(state, batch)`; it compiles once per strategy (the state's, else the
    decorator's, else `"jit"`) and binds like a method in a class body (docs/logging.md on recompiles).
    """

    __slots__ = (
        "__name__",
        "__wrapped__",
        "_armed",
        "_cache",
        "_compiled",
        "_compiles",
        "_default",
        "_fused",
        "_listener",
        "_owner",
        "_update",
    )

    def __init__(self, fn: StepBody, strategy: str | Strategy | None, *, update: bool) -> None:
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self._default = get_strategy(strategy if strategy is not None else "jit")
        self._update = update
        # By strategy, then by the tree of the state whose leaves the program takes (None: it takes the
        # state): the program and the tree it takes (None under eager).
        self._compiled: dict[Strategy, dict[Any, tuple[Callable[[Any, Any], tuple[Logs, Any]], Any]]] = {}
        self._fused: dict[Strategy, dict[Any, tuple[Callable[[Any, Any], tuple[Logs, Any]], Any]]] = {}
        # The last single step's (strategy, tree, program).
        self._cache: tuple[Strategy | None, Any, Any] = (None, None, None)
        self._compiles = 0
        self._listener: Listener | None = None
        self._armed = False  # whether the listener is told the next call's inputs
        self._owner: str | None = None  # `Class.name` where a class body holds it

    def __repr__(self) -> str:
        kind = "train_step" if self._update else "step"
        return self._owner or f"managed.{kind}({self.__name__})"

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self._owner = f"{owner.__name__}.{name}"

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> Self: ...

    @overload
    def __get__(self, instance: S, owner: type[Any]) -> Callable[[Any], tuple[Logs, S]]: ...

    def __get__(self, instance: S | None, owner: type[Any]) -> Self | Callable[[Any], tuple[Logs, S]]:
        return self if instance is None else functools.partial(self, instance)

    def __call__(self, state: S, batch: Any) -> tuple[Logs, S]:
        """Runs one step, or all steps of a `ciclo.types.Stacked` batch in one dispatch."""
        strategy = state.strategy if isinstance(state, AbstractManagedState) else self._default
        lazy = state._pytree_lazy if isinstance(state, Lazy) else None  # a state a step returned flat
        compiles = self._compiles
        try:
            lifted = strategy.lift_batch(batch)
            if self._armed:
                self._tell_first(strategy, state, lifted)
            last, tree, compiled = self._cache
            # A state the last step returned flat (`_pytree.as_flat`) goes back as its leaves, unbuilt.
            if strategy is not last or type(batch) is Stacked:
                logs, state = self._run(strategy, state, batch, lifted, lazy)
            elif lazy is not None and lazy[1] is tree:
                logs, state = compiled(lazy[0], lifted)
            elif tree is None:
                logs, state = compiled(state, lifted)
            else:
                logs, state = self._run(strategy, state, batch, lifted, lazy)
        except Exception:
            # Only on the failure path: a batch of Python lists or strings fails somewhere in the
            # model, with an error about the model; this one names the batch's leaf and the fix.
            refusal = batch_refusal(batch)
            if refusal is None:
                raise
            raise refusal from None
        if isinstance(state, Lazy):
            vars(state).pop(FLAT, None)  # jax has read it flat: from now on it flattens rebuilt
        if self._compiles != compiles and self._listener is not None:
            logs.add_entry(*COMPILES, self._compiles)  # the step that compiled says so
        return logs, state

    @property
    def compiles(self) -> int:
        """How many times this step was compiled (traced), under every strategy; 0 before its first call."""
        return self._compiles

    def listen(self, listener: Listener | None) -> None:
        """Tells `listener` the inputs of the next call and of each compile, until `listen(None)`.

        It gets `(strategy, state, batch, cuts)`: `batch` is one step's (a `Stacked` group's batches),
        `cuts` the leading axes of the batch's and the state's leaves that the program does not see (the
        group's, pmap's devices'). While
        one listens, a step that compiled logs its count as `performance.compiles`
        (`ciclo.watch_recompiles`, which `train_loop` adds, listens).
        """
        self._listener, self._armed = listener, listener is not None

    def lower(self, state: Any, batch: Any) -> jax.stages.Lowered | None:
        """One step's program on `state` and `batch` (of a `Stacked` group, one step), traced, not compiled.

        None under a strategy that runs one program per device (pmap): there is no one program.
        """
        strategy = state.strategy if isinstance(state, AbstractManagedState) else self._default
        if isinstance(strategy, DeviceReductions):
            return None
        if is_stacked(batch):
            batch = jax.tree.map(
                lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf)[1:], leaf.dtype),  # type: ignore[no-untyped-call]
                batch.batches,
            )
        else:
            batch = strategy.lift_batch(batch)
        return jax.jit(self._body(strategy, state)).lower(state, batch)

    def _run(self, strategy: Strategy, state: Any, batch: Any, lifted: Any, lazy: Any) -> tuple[Logs, Any]:
        # A compiled single step of a managed state takes its leaves: one program per (strategy, tree).
        stacked, leaves, tree = is_stacked(batch), [], None
        if not stacked and isinstance(state, Lazy):
            leaves, tree = lazy or jax.tree.flatten(state)
        programs = (self._fused if stacked else self._compiled).setdefault(strategy, {})
        found = programs.get(tree)
        if found is None:
            _check_batch(batch)
            found = programs[tree] = self._compile(strategy, state, fused=stacked, tree=tree)
        compiled, takes = found  # None: the program takes the state
        tree = None if takes is None else tree  # the next state's tree is this very object (`Flat.tree`)
        if not stacked:
            self._cache = (strategy, tree, compiled)
        return compiled(state if tree is None else tuple(leaves), lifted)

    def _body(self, strategy: Strategy, state: Any) -> Callable[[Any, Any], tuple[Logs, Any]]:
        # Asked once per compiled step: only strategies that run one program per device reduce in it.
        reductions = strategy if isinstance(strategy, DeviceReductions) else None
        fn = self.__wrapped__
        if self._update:
            return _train_body(fn, reductions, state)
        return lambda state, batch: _finish(*as_logs_and_state(fn, state, batch), reductions)

    def _compile(
        self, strategy: Strategy, state: Any, *, fused: bool, tree: Any = None
    ) -> tuple[Callable[[Any, Any], tuple[Logs, Any]], Any]:
        body = self._body(strategy, state)

        def step(state: Any, batch: Any) -> tuple[Logs, Any]:
            if fused:
                return scan_steps(body, state, batch.batches)
            if tree is None:
                return body(state, batch)
            logs, new = body(tree.unflatten(state), batch)
            return logs, (as_flat(new) if isinstance(new, Lazy) else new)

        def run(state: Any, batch: Any) -> tuple[Logs, Any]:
            self._compiles += 1  # jax traces the step only to compile it
            if self._listener is not None:
                told = state if tree is None else tree.unflatten(state)
                self._listener(strategy, told, batch.batches if fused else batch, (fused, 0))
            return step(state, batch)

        # Only training consumes the state: the state an evaluation reads stays valid, since a train
        # loop trains on from it after a test pass.
        compiled = strategy.compile(run, donate=self._update)
        if compiled is not run:
            return compiled, tree
        # A strategy that runs the step as it is (eager) compiles nothing: no compile to count; it
        # takes and returns the state itself.
        return (step, None) if tree is None else self._compile(strategy, state, fused=fused)

    def _tell_first(self, strategy: Strategy, state: Any, batch: Any) -> None:
        # The first call a listener sees may run a program an earlier loop compiled: it is told its inputs.
        self._armed = False
        stacked, devices = is_stacked(batch), isinstance(strategy, DeviceReductions)
        cast(Listener, self._listener)(
            strategy, state, batch.batches if stacked else batch, (stacked + devices, devices)
        )


@overload
def train_step(fn: StepBody, /, strategy: str | Strategy | None = None) -> ManagedStep[Any]: ...


@overload
def train_step(*, strategy: str | Strategy | None = None) -> Callable[[StepBody], ManagedStep[Any]]: ...


def train_step(
    fn: StepBody | None = None, /, strategy: str | Strategy | None = None
) -> ManagedStep[Any] | Callable[[StepBody], ManagedStep[Any]]:
    """Turns a step that logs losses into a training step: gradients and update are ciclo's.

    `fn(state, batch)` returns `(logs, state)` or `logs`, with scalar entries in `losses`; ciclo
    differentiates their sum and applies `state.apply_gradients` (docs/strategies.md, "The managed API
    in brief"). Also `@train_step(strategy=...)`, for states that carry no strategy.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> @managed.train_step
        ... def train_step(state, batch):
        ...     x, y = batch
        ...     loss = jnp.mean((x @ state.params - y) ** 2)
        ...     return ciclo.logs().add_loss("mse", loss), state
        >>> state = managed.ManagedState.create(params=jnp.zeros(2), tx=optax.sgd(0.5))
        >>> batch = (jnp.array([[1.0, 0.0], [0.0, 1.0]]), jnp.array([1.0, -1.0]))
        >>> for _ in range(50):
        ...     logs, state = train_step(state, batch)
        >>> state.params, float(logs.losses.mse) < 1e-4
        (Array([ 1., -1.], dtype=float32), True)
    """
    if fn is None:
        return lambda fn: ManagedStep(fn, strategy, update=True)
    return ManagedStep(fn, strategy, update=True)


@overload
def step(fn: StepBody, /, strategy: str | Strategy | None = None) -> ManagedStep[Any]: ...


@overload
def step(*, strategy: str | Strategy | None = None) -> Callable[[StepBody], ManagedStep[Any]]: ...


def step(
    fn: StepBody | None = None, /, strategy: str | Strategy | None = None
) -> ManagedStep[Any] | Callable[[StepBody], ManagedStep[Any]]:
    """Runs a step under the state's strategy, with no gradients and no update: for evaluation and inference.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> @managed.step
        ... def test_step(state, batch):
        ...     x, y = batch
        ...     return ciclo.logs().add_metric("mse", jnp.mean((x @ state.params - y) ** 2)), state
        >>> state = managed.ManagedState.create(params=jnp.ones(2), tx=optax.sgd(0.1))
        >>> logs, state = test_step(state, (jnp.eye(2), jnp.zeros(2)))
        >>> float(logs.metrics.mse)
        1.0
    """
    if fn is None:
        return lambda fn: ManagedStep(fn, strategy, update=False)
    return ManagedStep(fn, strategy, update=False)


def _train_body(fn: StepBody, reductions: DeviceReductions | None, state: Any) -> Callable[[Any, Any], Any]:
    if not isinstance(state, AbstractManagedState):
        raise TypeError(
            "managed.train_step needs a managed.ManagedState (or a subclass), or a ciclo.types.ModelState "
            f"(the adapters' states), got {short(state)}"
        )
    params_name = params_field(type(state))
    model_state_names = fields_with_role(type(state), Role.MODEL_STATE)

    def train(state: Any, batch: Any) -> tuple[Logs, Any]:
        def loss(params: Any) -> tuple[jax.Array, tuple[jax.Array, Logs, Any]]:
            logs, new_state = as_logs_and_state(fn, state.replace(**{params_name: params}), batch)
            losses = logs.get("losses")
            if not losses:
                raise ValueError(
                    f"managed.train_step: {short(getattr(fn, '__name__', fn))} logged no losses "
                    f"(collections: {sorted(logs)}); add the loss to differentiate with "
                    "logs.add_loss('loss', value)"
                )
            total = jnp.zeros((), jnp.float32)
            for name, value in losses.items():
                if jnp.shape(value) != ():
                    raise ValueError(
                        f"managed.train_step: loss {short(name)} has shape {jnp.shape(value)}, but losses "
                        "must be scalars; reduce it over the batch first, e.g. with .mean()"
                    )
                total = total + value
            return state.scale_loss(total), (total, logs, new_state)

        (_, (total, logs, new_state)), grads = jax.value_and_grad(loss, has_aux=True)(
            getattr(state, params_name)
        )
        if reductions is not None:
            grads = reductions.reduce_grads(grads)
            # Every device's optimizer sees the same loss, as it sees the same gradients.
            total = reductions.reduce_logs(Logs().add_loss("total", total)).losses.total
        new_state = new_state.apply_gradients(grads=grads, value=total)
        logged = {name for entries in logs.values() for name in entries}
        reported = {name: value for name, value in new_state.step_metrics().items() if name not in logged}
        logs = Logs(logs).add_metrics(**reported) if reported else logs
        if new_state.norms is not None:
            logs = Logs(logs).add_entries("norms", **new_state.norms)
        if reductions is not None:
            new_state = new_state.replace(
                **{
                    name: reductions.reduce_model_state(getattr(new_state, name))
                    for name in model_state_names
                    if getattr(new_state, name) is not None
                }
            )
        return _finish(logs, new_state, reductions)

    return train


def _finish(logs: Logs, state: Any, reductions: DeviceReductions | None) -> tuple[Logs, Any]:
    # Stateful metrics in the logs become their values; then the logs are reduced over devices.
    lowered = Logs()
    for collection, entries in logs.items():
        values = lowered[collection] = Entries()
        for name, value in entries.items():
            if not isinstance(value, Metric):
                values[name] = value
                continue
            computed = (value if reductions is None else reductions.reduce_metric(value)).compute()
            if isinstance(computed, Mapping):
                values.update(computed)
            else:
                values[name] = computed
    return (lowered if reductions is None else reductions.reduce_logs(lowered)), state


def _check_batch(batch: Any) -> None:
    # At a step's first call under a strategy: a batch holding a Python list of numbers.
    if number_list(batch) is not None:
        raise cast(TypeError, batch_refusal(batch))
