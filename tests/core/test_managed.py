"""The managed API under every strategy: same parameters as a hand-written loop, clear errors."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import STRATEGIES
from support import training
from support.optional import optional

import ciclo
from ciclo import managed


@pytest.mark.parametrize("model", list(training.MODELS))
def test_train_step_matches_a_hand_written_loop(strategy: str, model: str) -> None:
    data = training.batches()
    state = training.managed_state(model, strategy)
    losses = []
    for batch in data:
        logs, state = training.train_step(state, batch)
        losses.append(float(logs.losses.mse))

    assert state.strategy == ciclo.strategies.get_strategy(strategy)
    assert int(state.with_strategy("eager").step) == training.STEPS
    params = state.with_strategy("eager").params
    training.assert_trees_close(params, training.reference_params(model, data))
    assert np.mean(losses[-5:]) < np.mean(losses[:5])


def test_step_lowers_logs_per_collection(strategy: str) -> None:
    state = training.managed_state("mlp", strategy)
    x, y = training.batches(1)[0]
    logs, state = training.eval_step(state, (x, y))

    host = state.with_strategy("eager")
    preds = training.apply_mlp(host.params, x)
    assert logs.outputs.preds.shape == (training.BATCH, 1)
    np.testing.assert_allclose(logs.outputs.preds, preds, rtol=1e-5, atol=1e-6)
    assert np.shape(logs.metrics.mse) == ()
    np.testing.assert_allclose(logs.metrics.mse, jnp.mean((preds - y) ** 2), rtol=1e-5)


class Counted(managed.ManagedState):
    """A state whose step counts examples in a batch-statistics field and a stateful metric."""

    batch_stats: jax.Array = managed.field(role=managed.Role.MODEL_STATE)
    mean_target: ciclo.metrics.Mean = managed.field(role=managed.Role.METRICS)


def running_batch_mean(data: list[Any]) -> np.ndarray:
    """The model state the test steps keep: an exponential mean (0.5) of each batch's input mean."""
    expected = np.zeros(training.FEATURES)
    for x, _ in data:
        expected = 0.5 * expected + 0.5 * x.mean(axis=0)
    return expected


@managed.train_step
def counted_step(state: Counted, batch: Any) -> tuple[ciclo.types.Logs, Counted]:
    x, y = batch
    loss = jnp.mean((x @ state.params - y[:, 0]) ** 2)
    # Per-device batch means differ under pmap; synchronisation must make them global.
    state = state.replace(batch_stats=0.5 * state.batch_stats + 0.5 * jnp.mean(x, axis=0))
    state = state.replace(mean_target=state.mean_target.update(target=y))
    return ciclo.logs().add_loss("loss", loss).add_metric("mean_target", state.mean_target), state


def test_model_state_and_metrics_are_global(strategy: str) -> None:
    data = training.batches(3)
    state = Counted.create(
        params=jnp.zeros(training.FEATURES),
        tx=optax.sgd(0.01),
        batch_stats=jnp.zeros(training.FEATURES),
        mean_target=ciclo.metrics.Mean(lambda target: target),
        strategy=strategy,
    )
    for batch in data:
        logs, state = counted_step(state, batch)

    host = state.with_strategy("eager")
    np.testing.assert_allclose(host.batch_stats, running_batch_mean(data), rtol=1e-5, atol=1e-6)
    all_targets = np.concatenate([y for _, y in data])
    np.testing.assert_allclose(logs.metrics.mean_target, all_targets.mean(), rtol=1e-5)
    if strategy != "pmap":  # under pmap each device's copy counts only its own rows
        np.testing.assert_allclose(host.mean_target.compute(), all_targets.mean(), rtol=1e-5)
        assert float(host.mean_target.count) == all_targets.size


def test_compiles_once_per_strategy(strategy: str) -> None:
    traces = []

    @managed.train_step
    def step(state: managed.ManagedState, batch: Any) -> ciclo.types.Logs:
        traces.append(1)
        x, y = batch
        return ciclo.logs().add_loss("loss", jnp.mean((x @ state.params - y[:, 0]) ** 2))

    state = managed.ManagedState.create(
        params=jnp.zeros(training.FEATURES), tx=optax.sgd(0.1), strategy=strategy
    )
    for batch in training.batches(4):
        _, state = step(state, batch)
    assert len(traces) == (4 if strategy == "eager" else 1)


def test_decorator_strategy_applies_to_states_without_one() -> None:
    traces: list[Any] = []

    @managed.step(strategy="eager")
    def count(state: dict[str, Any], batch: jax.Array) -> tuple[ciclo.types.Logs, dict[str, Any]]:
        traces.append(type(batch))
        return ciclo.logs().add_metric("n", batch.sum()), {"n": state["n"] + batch.sum()}

    state = {"n": jnp.zeros(())}
    for _ in range(2):
        logs, state = count(state, jnp.ones(3))
    assert float(state["n"]) == 6.0 and float(logs.metrics.n) == 3.0
    assert len(traces) == 2 and repr(count) == "managed.step(count)"


def test_a_step_in_a_class_body_is_named_by_its_class() -> None:
    # What a recompile warning names: the state's own step, not the function behind it.
    assert repr(ciclo.types.ModelState.train_step) == "ModelState.train_step"
    assert repr(ciclo.types.ModelState.test_step) == "ModelState.test_step"


def test_a_state_field_overrides_the_decorator_strategy() -> None:
    step = managed.train_step(lambda state, batch: ciclo.logs().add_loss("l", state.params**2), "eager")
    state = managed.ManagedState.create(params=jnp.ones(()), tx=optax.sgd(0.25), strategy="jit")
    _, state = step(state, None)
    assert list(step._compiled) == [ciclo.strategies.get_strategy("jit")]
    assert float(state.params) == 0.5


class WithMethods(managed.ManagedState):
    @managed.train_step
    def train_step(self, batch: Any) -> ciclo.types.Logs:
        x, y = batch
        return ciclo.logs().add_loss("loss", jnp.mean((x @ self.params - y[:, 0]) ** 2))

    @managed.step
    def test_step(self, batch: Any) -> ciclo.types.Logs:
        x, y = batch
        return ciclo.logs().add_metric("loss", jnp.mean((x @ self.params - y[:, 0]) ** 2))


def test_steps_bind_as_methods_and_plug_into_train_loop() -> None:
    state = WithMethods.create(params=jnp.zeros(training.FEATURES), tx=optax.adam(1e-2))
    logs, stepped = state.train_step(training.batches(1)[0])
    assert int(stepped.step) == 1 and "loss" in logs.losses

    state, history, elapsed = ciclo.train_loop(
        state,
        training.batches(40),
        test_dataset=lambda: training.batches(2, seed=1),
        epoch_duration=10,
        stop=40,
    )
    assert elapsed.steps == 40 and int(state.step) == 40
    train_losses = history.collect("losses.loss")
    assert len(train_losses) == 40 and train_losses[-1] < train_losses[0]
    assert len(history.collect("loss_test")) == 4


def test_donating_strategy_consumes_the_input_state() -> None:
    state = training.managed_state("linear", "jit_donate")
    _, new_state = training.train_step(state, training.batches(1)[0])
    assert state.params["w"].is_deleted()
    assert not new_state.params["w"].is_deleted()


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (lambda state: ciclo.logs().add_metric("m", 1.0), r"logged no losses \(collections: \['metrics'\]\)"),
        (lambda state: None, r"logged no losses \(collections: \[\]\)"),
        (lambda state: {"losses": {}}, "logged no losses"),
        (lambda state: ciclo.logs().add_loss("xent", state.params), r"loss 'xent' has shape \(3,\)"),
        (lambda state: (ciclo.logs(), state, 1), r"returns \(logs, state\), logs, state or None"),
    ],
)
def test_train_step_errors_name_the_problem(returned: Any, message: str) -> None:
    step = managed.train_step(lambda state, batch: returned(state))
    state = managed.ManagedState.create(params=jnp.ones(3), tx=optax.sgd(0.1))
    with pytest.raises((ValueError, TypeError), match=message):
        step(state, None)


def test_train_step_needs_a_trainable_state() -> None:
    step = managed.train_step(lambda state, batch: ciclo.logs().add_loss("l", 0.0))
    with pytest.raises(TypeError, match=r"needs a managed.ManagedState .* got \{'w'"):
        step({"w": jnp.ones(2)}, None)


def test_a_subclass_that_loses_the_params_role_fails_when_defined() -> None:
    with pytest.raises(TypeError, match="one field with the role managed.Role.PARAMS.*Plain declares none"):

        class Plain(managed.ManagedState):
            params: Any

    with pytest.raises(TypeError, match="Doubled declares 2: params, weights"):

        class Doubled(managed.ManagedState):
            weights: Any = managed.field(role=managed.Role.PARAMS)


def test_field_declares_roles_and_static_fields() -> None:
    class State(managed.ManagedState):
        stats: jax.Array = managed.field(role=managed.Role.MODEL_STATE, default_factory=lambda: jnp.zeros(2))
        note: str = managed.field(static=True, default="x")
        old_style: str = dataclasses.field(default="y", metadata={"static": True})

    state = State.create(params=jnp.zeros(2), tx=optax.sgd(0.1), strategy="eager")
    assert managed.fields_with_role(State, managed.Role.MODEL_STATE) == ("stats",)
    assert managed.fields_with_role(State, managed.Role.PARAMS) == ("params",)
    assert managed.fields_with_role(State, managed.Role.KEY) == ()
    assert len(jax.tree.leaves(state)) == 3  # step, params, stats: the static fields are not leaves
    with pytest.raises(TypeError, match="a static field cannot have a role"):
        managed.field(role=managed.Role.KEY, static=True)


def test_subclasses_are_frozen_keyword_only_pytrees() -> None:
    class State(managed.ManagedState):
        key: jax.Array
        note: str = dataclasses.field(default="x", metadata={"static": True})

    state = State.create(params=jnp.zeros(2), tx=optax.sgd(0.1), key=jax.random.key(1), strategy="eager")
    assert dataclasses.is_dataclass(state)
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.note = "y"  # type: ignore[misc]
    leaves, treedef = jax.tree.flatten(state)
    assert len(leaves) == 3  # step, params, key (sgd keeps an empty optimizer state)
    assert jax.tree.unflatten(treedef, leaves).note == "x"
    with pytest.raises(TypeError):
        State(step=jnp.zeros(()), params=0, opt_state=(), tx=optax.sgd(0.1))  # type: ignore[call-arg]


class Scored(managed.ManagedState):
    accuracy: Any
    plain_accuracy: ciclo.metrics.Mean


@managed.step
def score_step(state: Scored, batch: Any) -> tuple[ciclo.types.Logs, Scored]:
    logits, target = batch
    state = state.replace(
        accuracy=state.accuracy.update(preds=logits, target=target),
        plain_accuracy=state.plain_accuracy.update(preds=logits, target=target),
    )
    return ciclo.logs().add_metrics(accuracy=state.accuracy, plain_accuracy=state.plain_accuracy), state


jax_metrics = optional("jax_metrics")
ACCURACIES = {
    "mean": lambda: ciclo.metrics.Mean(lambda preds, target: preds.argmax(-1) == target),
    **({"jax_metrics": lambda: jax_metrics.metrics.Accuracy()} if jax_metrics else {}),
}
"""Running accuracies: ciclo's own, and jax_metrics' where it is installed (Python < 3.12)."""


# pmap combines the devices' copies with `reduce`, which jax_metrics 0.2.5 implements with
# `jax.tree_map`, removed in JAX 0.6: jax_metrics runs under every other strategy.
@pytest.mark.parametrize("accuracy", list(ACCURACIES))
@pytest.mark.parametrize("strategy", [name for name in STRATEGIES if name != "pmap"])
def test_stateful_metrics_and_plain_callables_agree(strategy: str, accuracy: str) -> None:
    state = Scored.create(
        params=jnp.zeros(()),
        tx=optax.sgd(0.1),
        accuracy=ACCURACIES[accuracy](),
        plain_accuracy=ciclo.metrics.Mean(lambda preds, target: preds.argmax(-1) == target),
        strategy=strategy,
    )
    rng = np.random.default_rng(0)
    correct = []
    for _ in range(3):
        logits = rng.normal(size=(8, 5)).astype(np.float32)
        target = rng.integers(0, 5, size=8)
        logs, state = score_step(state, (logits, target))
        correct.extend(logits.argmax(-1) == target)
    np.testing.assert_allclose(logs.metrics.accuracy, np.mean(correct), rtol=1e-6)
    np.testing.assert_allclose(logs.metrics.plain_accuracy, np.mean(correct), rtol=1e-6)


def test_python_numbers_in_logs_pass_through_every_strategy(strategy: str) -> None:
    step = managed.step(
        lambda state, batch: ciclo.logs().add_metric("rows", batch.shape[0]).add_metric("half", 0.5)
    )
    state = managed.ManagedState.create(params=jnp.zeros(()), tx=optax.sgd(0.1), strategy=strategy)
    logs, _ = step(state, np.ones((training.BATCH, 2), np.float32))
    assert float(logs.metrics.half) == 0.5 and int(logs.metrics.rows) > 0


class Renamed(managed.ManagedState):
    """Every role on a field with its own name: no behaviour may depend on the names."""

    stats: jax.Array = managed.field(role=managed.Role.MODEL_STATE)
    rng: jax.Array = managed.field(role=managed.Role.KEY)
    running: ciclo.metrics.Mean = managed.field(role=managed.Role.METRICS)


@managed.train_step
def renamed_step(state: Renamed, batch: Any) -> tuple[ciclo.types.Logs, Renamed]:
    x, y = batch
    rng, noise_key = jax.random.split(state.rng)
    noise = jax.random.uniform(noise_key, ())
    loss = jnp.mean((x @ state.params - y[:, 0]) ** 2)
    # Per-device batch means differ under pmap: the model-state role makes them global.
    stats = 0.5 * state.stats + 0.5 * jnp.mean(x, axis=0)
    running = state.running.update(target=y)
    logs = ciclo.logs().add_loss("loss", loss).add_metric("running", running).add_metric("noise", noise)
    return logs, state.replace(stats=stats, rng=rng, running=running)


def test_roles_work_under_any_field_name(strategy: str) -> None:
    data = training.batches(3)
    state = Renamed.create(
        params=jnp.zeros(training.FEATURES),
        tx=optax.sgd(0.01),
        stats=jnp.zeros(training.FEATURES),
        rng=jax.random.key(0),
        running=ciclo.metrics.Mean(lambda target: target),
        strategy=strategy,
    )
    if strategy == "pmap":  # each device gets its own split of the key-role field
        keys = {tuple(np.asarray(k)) for k in jax.random.key_data(state.rng)}
        assert state.rng.shape == (jax.local_device_count(),) and len(keys) == jax.local_device_count()
    for batch in data:
        logs, state = renamed_step(state, batch)

    host = state.with_strategy("eager")
    expected = running_batch_mean(data)
    np.testing.assert_allclose(host.stats, expected, rtol=1e-5, atol=1e-6)
    if strategy == "pmap":  # the synchronised model state is the same on every device
        np.testing.assert_allclose(
            state.stats, np.broadcast_to(expected, state.stats.shape), rtol=1e-5, atol=1e-6
        )
    all_targets = np.concatenate([y for _, y in data])
    np.testing.assert_allclose(logs.metrics.running, all_targets.mean(), rtol=1e-5)
    assert int(host.step) == len(data) and jnp.issubdtype(host.rng.dtype, jax.dtypes.prng_key)
    training.assert_trees_close(host.params, _renamed_reference(data), rtol=1e-5, atol=1e-6)


def _renamed_reference(data: list[Any]) -> jax.Array:
    def loss(params: jax.Array, x: np.ndarray, y: np.ndarray) -> jax.Array:
        return jnp.mean((x @ params - y[:, 0]) ** 2)

    params = jnp.zeros(training.FEATURES)
    for x, y in data:
        params = params - 0.01 * jax.grad(loss)(params, x, y)
    return params


def test_a_state_is_frozen_and_keeps_its_defaults_however_it_is_built() -> None:
    class Counted(managed.ManagedState):
        count: jax.Array = dataclasses.field(default_factory=lambda: jnp.zeros(()))

    state = Counted.create(params=jnp.zeros(2), tx=optax.sgd(0.1))
    assert state.apply_fn is None and int(state.count) == 0 and state.options == managed.TrainingOptions()
    leaves, treedef = jax.tree.flatten(state)
    rebuilt = jax.tree.unflatten(treedef, leaves)
    assert rebuilt.replace(step=jnp.ones((), jnp.int32)).tx is state.tx
    with pytest.raises(dataclasses.FrozenInstanceError):
        rebuilt.step = 1  # type: ignore[misc]
    with pytest.raises(TypeError, match="opt_state"):
        Counted(step=state.step, params=state.params, tx=state.tx)  # type: ignore[call-arg]


def test_jax_rebuilds_a_state_without_its_init_and_flattens_what_it_holds() -> None:
    inits: list[Any] = []

    class Counted(managed.ManagedState):
        count: jax.Array = managed.field(role=managed.Role.MODEL_STATE)

        def __post_init__(self) -> None:
            inits.append(self)

    state = Counted.create(params=jnp.zeros(2), tx=optax.sgd(0.1), count=jnp.zeros(()))
    built = len(inits)
    leaves, treedef = jax.tree.flatten(state)
    rebuilt = jax.tree.unflatten(treedef, [leaf + 1 for leaf in leaves])
    assert len(inits) == built  # jax's rebuild (after every compiled step) runs no __init__
    assert int(rebuilt.count) == 1 and rebuilt.tx is state.tx and rebuilt.strategy is state.strategy
    assert [int(leaf.sum()) for leaf in jax.tree.leaves(rebuilt)] == [1, 2, 1]  # step, params, count
    changed = rebuilt.replace(count=jnp.full((), 5.0))
    assert len(inits) == built + 1
    assert [int(leaf.sum()) for leaf in jax.tree.leaves(changed)] == [1, 2, 5]
    paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(rebuilt)]
    assert paths == [".step", ".params", ".count"]  # sgd keeps an empty optimizer state


# --- compiles and recompiles --------------------------------------------------------------------


def _recompile_run(strategy: str, sizes: list[int], **kwargs: Any) -> tuple[Any, Any, list[Any]]:
    """A train_loop on batches of `sizes` rows: its history, its step, and the warnings it gave."""
    import warnings

    @managed.train_step
    def train_step(state: managed.ManagedState, batch: Any) -> ciclo.types.Logs:
        x, y = batch
        return ciclo.logs().add_loss("loss", jnp.mean((x @ state.params - y[:, 0]) ** 2))

    state = managed.ManagedState.create(
        params=jnp.zeros(training.FEATURES), tx=optax.sgd(0.1), strategy=strategy
    )
    data = [batch for size in sizes for batch in training.batches(1, batch=size)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, history, _ = ciclo.train_loop(state, data * 2, {ciclo.on_train_step: [train_step]}, **kwargs)
    return history, train_step, [w for w in caught if w.category is ciclo.types.RecompileWarning]


@pytest.mark.parametrize("strategy", ["jit", "data_parallel", "pmap"])
def test_a_smaller_last_batch_warns_once_naming_both_shapes(strategy: str) -> None:
    history, step, warned = _recompile_run(strategy, [32, 32, 16], epoch_duration=3)
    assert len(warned) == 1  # two epochs: the smaller batch compiles once
    message = str(warned[0].message)
    assert message.startswith("managed.train_step(train_step) compiled again (compile 2)")
    # pmap compiles for one device's rows: the shapes it names are per device.
    devices = jax.local_device_count() if strategy == "pmap" else 1
    small, full = 16 // devices, 32 // devices
    assert f"batch[0] ({small}, 8) float32, first compiled for ({full}, 8) float32" in message
    assert f"batch[1] ({small}, 1) float32, first compiled for ({full}, 1) float32" in message
    assert "drop_remainder=True" in message
    assert step.compiles == 2
    assert history.collect("steps", "performance.compiles") == ([0, 2], [1, 2])


@pytest.mark.parametrize("strategy", ["eager", "jit", "fsdp"])
def test_constant_shapes_warn_of_nothing(strategy: str) -> None:
    history, step, warned = _recompile_run(strategy, [32, 32, 32], steps_per_execution=4)
    assert warned == []
    # Eager compiles nothing; the others a group of 4 steps, then the last 2: a new program, for the
    # same shapes of a step, which is not warned.
    assert step.compiles == (0 if strategy == "eager" else 2)
    if strategy == "eager":
        assert all("performance" not in entry for entry in history)
    else:
        # Logged with the group's last step, as a fused group's other step-level logs.
        assert history.collect("steps", "performance.compiles") == ([3, 5], [1, 2])


def test_a_python_scalar_in_the_state_is_named() -> None:
    import warnings

    class State(managed.ManagedState):
        scale: Any = None

    @managed.train_step
    def train_step(state: State, batch: jax.Array) -> Any:
        loss = jnp.mean((batch * state.params * state.scale) ** 2)
        return ciclo.logs().add_loss("loss", loss), state.replace(scale=state.scale * 1.0 + 0.0 * loss)

    state = State.create(params=jnp.ones(2), tx=optax.sgd(0.1), scale=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ciclo.train_loop(state, [jnp.ones(2)] * 3, {ciclo.on_train_step: [train_step]})
    (warned,) = [w for w in caught if w.category is ciclo.types.RecompileWarning]
    message = str(warned.message)
    assert "state.scale () float32, first compiled for () float32 (weak: a Python scalar)" in message
    assert "Keep Python scalars out of the state" in message


def test_a_changed_static_field_and_batch_structure_are_named() -> None:
    import warnings

    class State(managed.ManagedState):
        scale: float = managed.field(static=True, default=1.0)

    @managed.train_step
    def train_step(state: State, batch: Any) -> Any:
        loss = jnp.mean((batch["x"] * state.params * state.scale) ** 2)
        return ciclo.logs().add_loss("loss", loss), state.replace(scale=2.0)

    state = State.create(params=jnp.ones(2), tx=optax.sgd(0.1))
    batches = [{"x": jnp.ones(2)}, {"x": jnp.ones(2)}, {"x": jnp.ones(2), "y": jnp.ones(2)}]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ciclo.train_loop(state, batches, {ciclo.on_train_step: [train_step]})
    static, structure = [str(w.message) for w in caught if w.category is ciclo.types.RecompileWarning]
    assert "for static field state.scale 2.0, first compiled for 1.0" in static
    assert "hold a value that changes during training in an array field" in static
    assert (
        "the batch's structure PyTreeDef({'x': *, 'y': *}), first compiled for PyTreeDef({'x': *})"
        in structure
    )
    assert "drop_remainder=True" in structure


def test_recompile_warnings_are_silenced_by_their_category() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=ciclo.types.RecompileWarning)
        warnings.simplefilter("error", UserWarning)  # anything else would still raise
        _, step, _ = _recompile_run("jit", [32, 16])
    assert step.compiles == 2


def test_steps_called_by_hand_count_compiles_without_warning() -> None:
    import warnings

    @managed.step
    def test_step(state: managed.ManagedState, batch: jax.Array) -> Any:
        return ciclo.logs().add_metric("sum", batch.sum()), state

    state = managed.ManagedState.create(params=jnp.zeros(()), tx=optax.sgd(0.1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for size in (4, 4, 3):
            test_step(state, jnp.ones(size))
    assert test_step.compiles == 2


def test_a_later_loop_compares_with_its_first_step() -> None:
    import warnings

    @managed.train_step
    def train_step(state: managed.ManagedState, batch: Any) -> ciclo.types.Logs:
        x, y = batch
        return ciclo.logs().add_loss("loss", jnp.mean((x @ state.params - y[:, 0]) ** 2))

    def run(sizes: list[int], tx: optax.GradientTransformation) -> list[Any]:
        state = managed.ManagedState.create(params=jnp.zeros(training.FEATURES), tx=tx)
        data = [batch for size in sizes for batch in training.batches(1, batch=size)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ciclo.train_loop(state, data, {ciclo.on_train_step: [train_step]})
        return [w for w in caught if w.category is ciclo.types.RecompileWarning]

    sgd = optax.sgd(0.1)
    assert run([32, 32], sgd) == []
    # The first step runs the program compiled by the loop before: the smaller batch is still named.
    (warned,) = run([32, 16], sgd)
    assert "(16, 8) float32, first compiled for (32, 8) float32" in str(warned.message)
    # A new optimizer compiles anew at the first step of its loop: that is no recompile.
    assert run([32, 32], optax.adam(0.1)) == []
    assert train_step.compiles == 3


def _message(error: BaseException) -> str:
    return "\n".join([str(error), *getattr(error, "__notes__", [])])


def test_a_batch_of_python_lists_is_refused_at_the_first_batch(strategy: str) -> None:
    ran: list[int] = []

    @managed.step
    def tolerant_step(state: managed.ManagedState, batch: Any) -> ciclo.types.Logs:
        ran.append(1)  # traced or run: the step would take the lists, one input per number
        x, y = batch
        return ciclo.logs().add_metric("y", jnp.mean(jnp.asarray(x) @ state.params - jnp.asarray(y)))

    state = managed.ManagedState.create(
        params=jnp.zeros(training.FEATURES), tx=optax.sgd(0.1), strategy=strategy
    )
    x, y = training.batches(1, batch=200)[0]  # 1,600 numbers: their list's repr alone is ~30,000 characters
    with pytest.raises(TypeError) as info:
        tolerant_step(state, (x.tolist(), y[:, 0].tolist()))
    assert type(info.value) is TypeError  # a user catches it by the builtin's name
    message = _message(info.value)
    assert message.startswith("batch leaf [0] is a Python list ([[") and "np.asarray" in message
    assert "1600 separate numbers" in message and len(message) <= 2000 and not ran


@pytest.mark.parametrize(
    ("batch", "found"),
    [
        (lambda x, y: (x.tolist(), y), r"batch leaf \[0\] is a Python list .*np.asarray"),
        (lambda x, y: {"x": x, "name": "abc"}, r"batch leaf \['name'\] is a str \('abc'\), .*np.asarray"),
    ],
    ids=["list", "str"],
)
def test_a_batch_the_step_cannot_take_is_named_after_the_first_batch(
    strategy: str, batch: Any, found: str
) -> None:
    # After a first batch of arrays (the step compiled), a later batch fails in the step: the error
    # names the batch's leaf instead of the model's failure.
    @managed.step
    def test_step(state: managed.ManagedState, batch: Any) -> ciclo.types.Logs:
        x = batch["x"] if isinstance(batch, dict) else batch[0]
        sizes = sum(jnp.size(jnp.asarray(leaf)) for leaf in jax.tree.leaves(batch))  # eager reads them here
        return ciclo.logs().add_metric("y", jnp.mean(x @ state.params) + sizes)

    state = managed.ManagedState.create(
        params=jnp.zeros(training.FEATURES), tx=optax.sgd(0.1), strategy=strategy
    )
    x, y = training.batches(1)[0]
    test_step(state, (x, y))
    with pytest.raises(TypeError, match=found) as info:
        test_step(state, batch(x, y))
    assert type(info.value) is TypeError and len(_message(info.value)) <= 2000


@pytest.mark.parametrize("recorded", [[], {"": 1}, {"": {"precision": "32"}, "['b']": None}])
def test_a_backup_s_options_record_that_is_no_dict_of_options_by_state_is_refused(recorded: Any) -> None:
    from ciclo._src.state.managed import check_static_options

    state = managed.ManagedState.create(params=jnp.zeros(2), tx=optax.sgd(0.1))
    with pytest.raises(ValueError, match=r"at step 1 in DIR: options is .*, not a dict of options"):
        check_static_options(recorded, state, "at step 1 in DIR")
    assert check_static_options({"": {"precision": "32"}}, state, "at step 1 in DIR") == []


def test_a_stepped_state_is_rebuilt_only_when_read_and_trains_on_in_place_changes() -> None:
    # A compiled step returns its state flat: its dicts are built when a field is read, not at each step.
    step = managed.train_step(lambda state, batch: ciclo.logs().add_loss("l", (state.params["w"] ** 2).sum()))
    state = managed.ManagedState.create(params={"w": jnp.ones(2)}, tx=optax.sgd(0.25), strategy="jit")
    start = jax.tree.structure(state)
    _, state = step(state, None)
    _, state = step(state, None)
    assert "params" not in vars(state)  # not rebuilt: only its static fields and its leaves
    assert state.strategy == ciclo.strategies.get_strategy("jit") and "params" not in vars(state)
    assert jax.tree.structure(state) == start  # flattens rebuilt, as any other state
    np.testing.assert_allclose(state.params["w"], [0.25, 0.25])
    state.params["w"] = state.params["w"] * 8  # a read state's dicts are its own: a change in place trains
    _, state = step(state, None)
    np.testing.assert_allclose(state.params["w"], [1.0, 1.0])
    assert step.compiles == 1
    with pytest.raises(AttributeError, match="'ManagedState' object has no attribute 'nope'"):
        _ = state.nope
