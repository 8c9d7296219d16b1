"""`check_adapter`: every clause of the `ModelAdapter` contract, run on a small synthetic task."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import inspect
import logging
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypedDict, Unpack

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import optax

from ciclo._src.base.elapsed import Elapsed
from ciclo._src.base.reprs import path_name, short
from ciclo._src.base.schedules import every
from ciclo._src.base.types import ModelAdapter, SupportsToModel
from ciclo._src.loops.predefined import train_loop
from ciclo._src.resume.backup import backup
from ciclo._src.state.model_state import ModelState, create_model_state
from ciclo._src.strategies._registry import canonical_name, strategy_names

CLAUSES: Final = (
    "protocol",
    "init_kinds",
    "deterministic_evaluation",
    "key_use",
    "init_key",
    "model_state_updates",
    "compiles_once",
    "learns",
    "strategies",
    "to_model",
    "precision",
    "accumulation",
    "ema",
    "resume",
)
"""The clauses of the `ModelAdapter` contract, in the order `check_adapter` runs them."""

MESH_STRATEGIES: Final = ("data_parallel", "fsdp")  # checked against jit on several devices only
BATCH: Final = 16  # 4 micro-batches of 4 for accumulation, and 1, 2, 4, 8 or 16 devices
STEPS: Final = 30  # the task's batches: `learns` trains on all of them, the other clauses on a few
TX: Final = optax.sgd(0.05, momentum=0.9)  # plain enough that two strategies agree to rounding
RTOL, ATOL = 1e-5, 1e-6  # float32 rounding: how close two strategies' (or routes') parameters must be


class KitOptions(TypedDict, total=False):
    """The options of `check_adapter` (class attributes of `AdapterTests`); its docstring says each."""

    strategies: Sequence[str]
    variables: tuple[Any, Any] | None
    uses_key: bool | None
    has_model_state: bool | None
    call_model: Callable[[Any, Any], Any] | None
    skip: Mapping[str, str] | None


class Skipped(Exception):
    """A clause that does not apply to this adapter: the message says why."""


class Failed(Exception):
    """A clause that does not hold: `Failed(seen, fix)`, what was seen and the fix."""


@dataclasses.dataclass(frozen=True)
class AdapterReport:
    """What `ciclo.testing.check_adapter` checked, and what it skipped and why.

    Attributes:
        checked: the clauses that ran and held, in the order they ran.
        skipped: `{clause: why}` for the clauses (or parts of one, such as
            `"strategies: fsdp"`) that could not apply to this adapter.

    Example:
        >>> report = AdapterReport(checked=("protocol",), skipped={"key_use": "uses_key=False"})
        >>> print(report)
        checked: protocol
        skipped: key_use (uses_key=False)
    """

    checked: tuple[str, ...]
    skipped: Mapping[str, str]

    def __str__(self) -> str:
        skipped = ", ".join(f"{name} ({why})" for name, why in self.skipped.items())
        return f"checked: {', '.join(self.checked)}\nskipped: {skipped or 'nothing'}"


def _leaves(tree: Any) -> list[np.ndarray]:  # on the host, random keys as their key data
    out = []
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        out.append(np.asarray(leaf))
    return out


def _float_leaves(tree: Any) -> list[np.ndarray]:
    return [leaf for leaf in _leaves(tree) if np.issubdtype(leaf.dtype, np.floating)]


def _close(a: Any, b: Any, rtol: float = RTOL, atol: float = ATOL) -> bool:
    left, right = _leaves(a), _leaves(b)
    return len(left) == len(right) and all(
        x.shape == y.shape and np.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True)
        for x, y in zip(left, right, strict=True)
    )


def _same(a: Any, b: Any) -> bool:
    return _close(a, b, rtol=0, atol=0)


def _farthest(a: Any, b: Any) -> float:
    left, right = _float_leaves(a), _float_leaves(b)
    if [x.shape for x in left] != [y.shape for y in right]:
        return float("inf")
    return max(
        (float(np.max(np.abs(x - y), initial=0.0)) for x, y in zip(left, right, strict=True)), default=0.0
    )


def matmul_dtypes(state: ModelState, inputs: Any) -> set[str]:
    """The operand dtypes of every matrix product or convolution in a training forward pass."""
    jaxpr = jax.make_jaxpr(lambda params: state.replace(params=params)._apply(inputs, training=True)[0])(
        state.params
    )
    found: set[str] = set()

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
                found.update(str(var.aval.dtype) for var in eqn.invars)
            for param in eqn.params.values():
                for sub in param if isinstance(param, (tuple, list)) else [param]:
                    inner = sub.jaxpr if isinstance(sub, jax.extend.core.ClosedJaxpr) else sub
                    if isinstance(inner, jax.extend.core.Jaxpr):
                        walk(inner)

    walk(jaxpr.jaxpr)
    return found


class _Crash(Exception):
    pass


class Kit:
    """One adapter under test: its task, and the states the clauses share (each compiles once)."""

    def __init__(self, adapter: ModelAdapter, *, inputs: Any, **options: Unpack[KitOptions]) -> None:
        unknown_options = sorted(set(options) - KitOptions.__optional_keys__)
        if unknown_options:
            raise TypeError(
                f"unknown option(s) {short(unknown_options)}; check_adapter takes "
                f"{short(sorted(KitOptions.__optional_keys__))}"
            )
        strategies = options.get("strategies", ("jit",))
        variables = options.get("variables")
        skip = dict(options.get("skip") or {})
        if set(skip) - set(CLAUSES) or not all(isinstance(why, str) and why for why in skip.values()):
            raise ValueError(
                f"skip must map clauses of {short(CLAUSES)} to why each is skipped, e.g. "
                f"skip={{'precision': 'the framework casts to its own dtype policy'}}; got {short(skip)}"
            )
        if isinstance(strategies, str):
            raise TypeError(
                f"strategies must be a sequence of names, e.g. ('jit', 'fsdp'); got {short(strategies)}"
            )
        # Spelt as get_strategy takes them: "data-parallel" is "data_parallel".
        strategies = [canonical_name(name) if isinstance(name, str) else name for name in strategies]
        unknown = [name for name in strategies if name not in strategy_names()]
        if unknown:
            raise ValueError(f"unknown strategies {short(unknown)}; ciclo has {short(strategy_names())}")
        if not isinstance(inputs, (jax.Array, np.ndarray)) or not jnp.issubdtype(inputs.dtype, jnp.floating):
            raise TypeError(
                f"inputs must be one floating-point array of sample inputs with a batch dimension, e.g. "
                f"jnp.zeros((1, 16)); got {short(inputs)}"
            )
        if variables is not None and not (isinstance(variables, tuple) and len(variables) == 2):
            raise TypeError(f"variables must be (params, model_state); got {short(variables)}")
        self.adapter = adapter
        self.inputs = inputs
        self.requested = tuple(strategies)
        self.variables = variables
        self.uses_key = options.get("uses_key")
        self.has_model_state = options.get("has_model_state")
        self.call_model = options.get("call_model")
        self.skip = skip
        self.skipped: dict[str, str] = {}

    @functools.cached_property
    def initial(self) -> tuple[Any, Any]:
        if self.variables is not None:
            return self.variables
        result = self.adapter.init(jax.random.key(0), self.inputs)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise Failed(
                f"init returned {short(result)}, not a pair",
                "return (params, model_state) from init, with model_state None when the model has none",
            )
        return result

    def apply(self, inputs: Any, *, seed: int, training: bool) -> tuple[Any, Any]:
        params, model_state = self.initial
        return self.adapter.apply(params, model_state, inputs, key=jax.random.key(seed), training=training)

    @functools.cached_property
    def classes(self) -> int:
        outputs, _ = self.apply(self.inputs, seed=0, training=False)
        shape = np.shape(outputs)
        if len(shape) < 2 or shape[0] != np.shape(self.inputs)[0] or shape[-1] < 2:
            raise Failed(
                f"apply gave outputs of shape {shape} for inputs of shape {np.shape(self.inputs)}",
                "return one row of at least 2 outputs (the task's class scores) per input, "
                "(batch, ..., outputs)",
            )
        return int(shape[-1])

    @functools.cached_property
    def batches(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """`STEPS` batches of a separable task: points near one of `classes` centres, and their class."""
        features = np.shape(self.inputs)[1:]
        rng = np.random.default_rng(0)
        centres = rng.normal(size=(self.classes, *features)) * 3
        labels = rng.integers(0, self.classes, STEPS * BATCH).astype(np.int32)
        points = (centres[labels] + rng.normal(size=labels.shape + features)).astype(self.inputs.dtype)
        return [(points[i : i + BATCH], labels[i : i + BATCH]) for i in range(0, len(labels), BATCH)]

    @functools.cache  # noqa: B019 - a Kit lives as long as its checks
    def state(self, strategy: str = "jit", **options: Any) -> ModelState:
        start = {"inputs": self.inputs} if self.variables is None else {"variables": self.variables}
        return create_model_state(
            self.adapter,
            **start,
            tx=TX,
            losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
            metrics={"accuracy": lambda preds, target: preds.argmax(-1) == target},
            strategy=strategy,
            key=0,
            **options,
        )

    def host(self, state: ModelState, what: str = "params") -> list[np.ndarray]:
        return _float_leaves(getattr(state.with_strategy("eager"), what))

    @functools.cached_property
    def trained(self) -> tuple[ModelState, list[float]]:
        state, history, _ = train_loop(self.state(), self.batches)
        return state, [float(loss) for loss in history.collect("loss")]

    @functools.cached_property
    def training_uses_key(self) -> bool:
        inputs = self.batches[0][0]
        return not _same(*(self.apply(inputs, seed=s, training=True)[0] for s in (1, 2)))

    @functools.cached_property
    def model_state_leaves(self) -> int:
        return len(jax.tree.leaves(self.initial[1]))

    def protocol(self) -> None:
        try:
            hash(self.adapter)
        except TypeError as error:
            raise Failed(
                f"{type(self.adapter).__name__} is not hashable ({error})",
                "an adapter is a static field of the state: make it a frozen dataclass with eq=False, "
                "or a plain class",
            ) from error
        for name in ("init", "apply"):
            # Whether the methods exist is what this clause checks (ModelAdapter is not runtime_checkable).
            method = getattr(self.adapter, name, None)
            if not callable(method):
                raise Failed(f"{type(self.adapter).__name__} has no method {name}", f"define {name}")
            expected = inspect.signature(getattr(ModelAdapter, name))
            parameters = list(expected.parameters.values())[1:]
            args = [p.name for p in parameters if p.kind is inspect.Parameter.POSITIONAL_ONLY]
            kwargs = {p.name: p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
            try:
                inspect.signature(method).bind(*args, **kwargs)
            except TypeError as error:
                raise Failed(
                    f"{name}{inspect.signature(method)} cannot be called as ciclo calls it ({error})",
                    f"take the arguments of ciclo.types.ModelAdapter.{name}{expected}",
                ) from error
        try:
            params, model_state = self.initial
        except Failed:
            return  # init_kinds names it
        result = self.adapter.apply(params, model_state, self.inputs, key=jax.random.key(0), training=False)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise Failed(
                f"apply returned {short(result)}, not a pair",
                "return (outputs, model_state) from apply: the predictions, and the model state (the one "
                "given when training is False, None when the model has none)",
            )

    def init_kinds(self) -> None:
        params, model_state = self.initial
        source = "the variables given" if self.variables is not None else "init"
        if not jax.tree.leaves(params):
            raise Failed(f"{source} gave params with no leaves: {short(params)}", "return the trained arrays")
        for name, tree in (("params", params), ("model_state", model_state)):
            odd = [
                (path_name(path), short(leaf))
                for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
                if not isinstance(leaf, (jax.Array, np.ndarray))
            ]
            if odd:
                raise Failed(
                    f"{source} gave {name} with leaves that are not arrays: {short(odd)}",
                    f"make every leaf of {name} a jax array (jnp.asarray); keep settings in the adapter",
                )
        integral = [
            path_name(path)
            for path, leaf in jax.tree_util.tree_leaves_with_path(params)
            if not jnp.issubdtype(leaf.dtype, jnp.floating)
        ]
        if integral:
            raise Failed(
                f"{source} gave params whose leaves {short(integral)} are not floating point",
                "params are what the optimizer trains: move counters, keys and integer tables to model_state",
            )
        if self.has_model_state is not None and self.has_model_state != bool(self.model_state_leaves):
            raise Failed(
                f"{source} gave model_state {short(model_state)}, but has_model_state={self.has_model_state}",
                "return the model's own state (batch statistics) as model_state, and None when it has none",
            )

    def init_key(self) -> None:
        if self.variables is not None:
            raise Skipped("the variables given: init not called")
        first, again, other = (self.adapter.init(jax.random.key(seed), self.inputs)[0] for seed in (0, 0, 1))
        fix = "draw every random number of init from the key it is given (no global counter, no numpy "
        if not _same(first, again):
            raise Failed(
                f"init gave other params for the same key (up to {_farthest(first, again):.3g} apart)",
                fix + "or Python randomness): two states of one seed must start alike",
            )
        if _same(first, other):
            if all(np.all(leaf == leaf.flat[0]) for leaf in _float_leaves(first) if leaf.size):
                raise Skipped("init gives the same params whatever the key (no random leaves)")
            raise Failed(
                "init gave the same params for two keys, and they are not constant",
                fix + "key of its own): two seeds must start apart",
            )

    def deterministic_evaluation(self) -> None:
        inputs = self.batches[0][0]
        (first, state_first), (second, _) = (self.apply(inputs, seed=s, training=False) for s in (1, 2))
        if not _same(first, second):
            raise Failed(
                f"apply(training=False) gave outputs that differ by up to {_farthest(first, second):.3g} "
                "for two keys",
                "draw no randomness from `key` when training is False (dropout off in evaluation)",
            )
        # Floating-point leaves only: an adapter may reseed its random keys from `key` in every call
        # (ciclo-flax's nnx adapter does), which changes no output.
        if not _same(_float_leaves(state_first), _float_leaves(self.initial[1])):
            raise Failed(
                "apply(training=False) returned a model_state whose statistics differ from those given",
                "return the model_state unchanged when training is False (statistics read, not updated)",
            )
        state = self.state()
        _, tested = state.test_step(self.batches[0])
        if not _same(_float_leaves(tested.model_state), _float_leaves(state.model_state)):
            raise Failed("test_step changed the model state", "see apply(training=False)")

    def key_use(self) -> None:
        inputs = self.batches[0][0]
        if not _same(self.apply(inputs, seed=1, training=True), self.apply(inputs, seed=1, training=True)):
            raise Failed(
                "apply(training=True) gave different results for the same key",
                "draw every random number from `key` (no global or Python randomness)",
            )
        if self.uses_key is False:
            raise Skipped("uses_key=False: key use not checked")
        if not self.training_uses_key:
            if self.uses_key:
                raise Failed(
                    "apply(training=True) gave the same outputs for two keys, but uses_key=True",
                    "draw dropout masks (and any noise) from the `key` apply is given, not from a fixed key",
                )
            raise Skipped(
                "training gives the same outputs whatever the key (no dropout): key use not checked"
            )

    def model_state_updates(self) -> None:
        if not self.model_state_leaves:
            raise Skipped("no model state: updates not checked")
        before = self.initial[1]
        _, after = self.apply(self.batches[0][0], seed=1, training=True)
        # Each leaf as its dtype and shape, e.g. `{'mean': 'float32[1, 8]'}`.
        kinds = [
            jax.tree.map(lambda x: f"{jnp.result_type(x)}{list(np.shape(x))}", t) for t in (after, before)
        ]
        if str(jax.tree.flatten(kinds[0])) != str(jax.tree.flatten(kinds[1])):
            raise Failed(
                f"apply(training=True) returned a model_state of another structure, shape or dtype: "
                f"{short(kinds[0])} for {short(kinds[1])}",
                "return the updated model_state with the structure, shapes and dtypes init gave",
            )
        if _same(before, after):
            raise Failed(
                "apply(training=True) returned the model_state it was given, unchanged",
                "return the updated state (new batch statistics) when training is True, or return None "
                "from init when the model has no state of its own",
            )
        state = self.state()
        _, trained = state.train_step(self.batches[0])
        if _same(trained.model_state, state.model_state):
            raise Failed("train_step left the model state unchanged", "see apply(training=True)")

    def compiles_once(self) -> None:
        _, state = self.state().train_step(self.batches[0])
        compiles = ModelState.train_step.compiles
        for batch in self.batches[1:3]:
            _, state = state.train_step(batch)
        if ModelState.train_step.compiles != compiles:
            raise Failed(
                f"the training step was traced {ModelState.train_step.compiles - compiles} more time(s) "
                "after the first step",
                "return a model_state with the structure, dtypes and weak types init gave (e.g. jnp.asarray("
                "x, jnp.float32), not Python numbers), so each step runs the same compiled program",
            )

    def learns(self) -> None:
        _, losses = self.trained
        first, last = np.mean(losses[:5]), np.mean(losses[-5:])
        if not (np.isfinite(last) and last < 0.8 * first):
            raise Failed(
                f"{len(losses)} steps of sgd on a separable {self.classes}-class task took the loss from "
                f"{first:.4g} to {last:.4g}",
                "check that apply's outputs depend on the params it is given (not on copies captured at "
                "init) and that gradients flow through them",
            )

    def to_model(self) -> None:
        if not isinstance(self.adapter, SupportsToModel):
            raise Skipped("the adapter has no to_model")
        state, _ = self.trained
        model, inputs = state.model, self.batches[0][0]
        if self.call_model is not None:
            preds = self.call_model(model, inputs)
        elif callable(model):
            preds = model(inputs)
        else:
            raise Skipped(
                f"to_model gives a {type(model).__name__}, not a callable: pass call_model= to check it"
            )
        logs, _ = state.predict_step(inputs)
        expected = logs.outputs.preds
        if not _close(preds, expected, atol=1e-5):
            raise Failed(
                f"the model to_model gives predictions of shape {np.shape(preds)} up to "
                f"{_farthest(preds, expected):.3g} away from predict_step's, of shape {np.shape(expected)}",
                "build the model from the params and model_state to_model is given, in evaluation mode",
            )

    def strategies(self) -> None:
        others = [name for name in dict.fromkeys(self.requested) if name != "jit"]
        if not others:
            raise Skipped("only jit requested")
        checked = []
        # jit's 3 steps, trained once, when a strategy can be compared with them.
        reference = functools.cache(lambda: train_loop(self.state(), self.batches[:3])[0])
        for name in others:
            if name in MESH_STRATEGIES and jax.device_count() < 2:
                self.skipped[f"strategies: {name}"] = (
                    f"{name} needs several devices; found {jax.device_count()}"
                )
                continue
            a, b = self.host(self.state(name)), self.host(self.state())
            if not _close(a, b):
                raise Failed(
                    f"under {name!r} the params differ from jit's by up to {_farthest(a, b):.3g} before any "
                    "step",
                    "compute init's params from the key it is given alone (no global counter, no numpy or "
                    "Python randomness): every strategy calls init again",
                )
            state, _, _ = train_loop(self.state(name), self.batches[:3])
            for what in ("params", "model_state"):
                a, b = self.host(state, what), self.host(reference(), what)
                if not _close(a, b):
                    raise Failed(
                        f"after 3 steps under {name!r} the {what} differ from jit's by up to "
                        f"{_farthest(a, b):.3g}",
                        "compute with the arrays apply is given (no host round trips, no per-device "
                        "statistics: reduce batch statistics over the whole batch)",
                    )
            checked.append(name)
        if not checked:
            raise Skipped("; ".join(self.skipped[f"strategies: {name}"] for name in others))

    def precision(self) -> None:
        # Batch norms reduce half-precision activations in float32 on purpose, which strict dtype
        # promotion refuses: users' default, standard promotion, is the one to check.
        with jax.numpy_dtype_promotion("standard"):
            state = self.state(precision="bf16-mixed")
            dtypes = matmul_dtypes(state, self.batches[0][0])
            if dtypes and "bfloat16" not in dtypes:
                raise Failed(
                    f"under precision='bf16-mixed' the model's matrix products ran in {sorted(dtypes)}",
                    "compute with the (cast) params and inputs apply is given; cast nothing back to float32",
                )
            state, history, _ = train_loop(state, self.batches[:2])
        loss = float(history.collect("loss")[-1])
        kinds = {leaf.dtype for leaf in self.host(state) + self.host(state, "opt_state")}
        if not np.isfinite(loss) or kinds != {np.dtype("float32")}:
            raise Failed(
                f"under precision='bf16-mixed' two steps gave loss {loss} and params "
                f"of dtypes {sorted(map(str, kinds))}",
                "return params in the dtype apply is given them in; ciclo keeps the float32 copy",
            )

    def accumulation(self) -> None:
        state = self.state(accumulate_steps=4)
        inputs, target = self.batches[0]
        quarter = BATCH // 4
        initial = self.host(state)
        for index in range(4):
            part = slice(index * quarter, (index + 1) * quarter)
            _, state = state.train_step((inputs[part], target[part]))
            if (index < 3) != _same(self.host(state), initial):
                raise Failed(
                    f"with accumulate_steps=4 the params {'changed' if index < 3 else 'stayed'} at "
                    f"micro-batch {index + 1}",
                    "keep the params out of model_state, and return outputs per example",
                )
        # Training that depends on the key, or batch statistics: micro-batches cannot match their join.
        if self.training_uses_key or self.model_state_leaves:
            self.skipped["accumulation: the joined batch"] = (
                "training is random or has batch statistics: micro-batches differ from their join"
            )
            return
        _, joined = self.state().train_step(self.batches[0])
        if not _close(self.host(state), self.host(joined)):
            raise Failed(
                f"4 accumulated micro-batches gave params up to "
                f"{_farthest(self.host(state), self.host(joined)):.3g} from one step on their join",
                "compute each example's outputs from that example alone (no batch-wide statistics in "
                "apply without model_state)",
            )

    def ema(self) -> None:
        decay = 0.75
        state = self.state(ema_decay=decay)
        ema = self.host(state)
        for batch in self.batches[:3]:
            _, state = state.train_step(batch)
            ema = [
                np.float32(decay) * e + np.float32(1 - decay) * p
                for e, p in zip(ema, self.host(state), strict=True)
            ]
            if not _close(self.host(state, "ema_params"), ema, atol=1e-7):
                raise Failed(
                    "the EMA of the params does not follow ema = decay * ema + (1 - decay) * params",
                    "keep every trained array in params (nothing trained in model_state)",
                )

    def resume(self) -> None:
        if importlib.util.find_spec("orbax") is None:
            raise Skipped('backups need orbax-checkpoint: pip install "ciclo-core[testing]"')
        state, batches = self.state(), self.batches[:6]
        expected, _, _ = train_loop(state, batches)

        def crash(state: Any, batch: Any, elapsed: Elapsed) -> None:
            if elapsed.steps == 4:
                raise _Crash

        announcer = logging.getLogger("ciclo.resume")  # the kit's own resume is no news to its user
        level = announcer.level
        announcer.setLevel(logging.ERROR)
        try:
            with tempfile.TemporaryDirectory() as directory:
                resumable = backup(directory, every=2)
                try:
                    train_loop(state, batches, tasks={every(1): crash}, backup=resumable)
                except _Crash:
                    pass
                resumed, _, elapsed = train_loop(state, batches, backup=resumable)
        finally:
            announcer.setLevel(level)
        if elapsed.steps != 6 or not _same(resumed.with_strategy("eager"), expected.with_strategy("eager")):
            raise Failed(
                "a run resumed from its backup at step 4 ended with other arrays than the run not stopped",
                "keep every array the model needs in params or model_state (random keys as jax.random.key "
                "arrays or their key data), none in the adapter",
            )

    def run(self, clause: str) -> str | None:
        """Runs one clause: None when it held, the reason when it was skipped."""
        if clause in self.skip:
            self.skipped[clause] = f"skipped by the caller: {self.skip[clause]}"
            return self.skipped[clause]
        try:
            getattr(self, clause)()
        except Skipped as skipped:
            self.skipped[clause] = str(skipped)
            return str(skipped)
        except Failed as failed:
            seen, fix = failed.args
            raise AssertionError(f"ciclo.testing clause {clause!r} failed: {seen}. Fix: {fix}") from None
        return None


def check_adapter(adapter: ModelAdapter, *, inputs: Any, **options: Unpack[KitOptions]) -> AdapterReport:
    """Checks every clause of the `ciclo.types.ModelAdapter` contract on a small synthetic task.

    The clauses (`CLAUSES`, in order) run on a separable classification task
    built from `inputs`, as many classes as the model has outputs
    (docs/adapter.md, "Checking an adapter").

    Args:
        adapter: the adapter under test.
        inputs: sample inputs for `init`: one floating-point array whose first
            axis is the batch.
        **options: all optional (`KitOptions`).
            `strategies`: those that must train as `jit` does (default `("jit",)`).
            `variables`: `(params, model_state)` for a model built initialised.
            `uses_key`: True for a model with dropout, False to skip `key_use`;
            None (default) checks it where training outputs differ across keys.
            `has_model_state`: whether `init` must give a model state; None: any.
            `call_model`: `call_model(model, inputs)` runs what `to_model` gives;
            by default a callable model is called, else `to_model` is skipped.
            `skip`: `{clause: why}` for clauses this framework cannot meet.

    Raises:
        AssertionError: for the first clause that fails, naming it, what was
            seen and the fix.
        TypeError, ValueError: for an unknown option or strategy, or inputs of the wrong kind.

    Example:
        >>> import ciclo, ciclo.testing, jax, jax.numpy as jnp
        >>> class Linear:  # a ModelAdapter for a linear classifier
        ...     def init(self, key, inputs):
        ...         return {"w": jax.random.normal(key, (inputs.shape[-1], 3)) * 0.1}, None
        ...     def apply(self, params, model_state, inputs, *, key, training):
        ...         return inputs @ params["w"], model_state
        >>> report = ciclo.testing.check_adapter(Linear(), inputs=jnp.zeros((1, 4)))
        >>> report.skipped["key_use"]
        'training gives the same outputs whatever the key (no dropout): key use not checked'
    """
    kit = Kit(adapter, inputs=inputs, **options)
    checked = [clause for clause in CLAUSES if kit.run(clause) is None]
    return AdapterReport(checked=tuple(checked), skipped=dict(kit.skipped))
