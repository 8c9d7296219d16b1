"""ciclo.types.ModelState and create_model_state, with framework-free adapters."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo import managed


@dataclasses.dataclass(frozen=True, eq=False)
class Linear:
    """y = x @ w, with a model state counting the training calls."""

    stateful: bool = False

    def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Any, Any]:
        return jnp.zeros(inputs.shape[-1]), (jnp.zeros(()) if self.stateful else None)

    def apply(self, params, model_state, inputs, *, key, training):
        if self.stateful and training:
            model_state = model_state + 1.0
        return inputs @ params, model_state


BATCH = (jnp.array([[1.0, 0.0], [0.0, 1.0]]), jnp.array([2.0, -1.0]))


def make(**overrides: Any) -> ciclo.types.ModelState:
    settings: dict[str, Any] = {
        "inputs": jnp.ones((1, 2)),
        "tx": optax.sgd(0.3),
        "losses": {"mse": lambda preds, target: (preds - target) ** 2},
        **overrides,
    }
    return ciclo.create_model_state(settings.pop("adapter", Linear()), **settings)


def test_adapters_satisfy_the_protocol() -> None:
    adapter: ciclo.types.ModelAdapter = Linear()
    assert callable(adapter.init) and callable(adapter.apply)


def test_train_step_learns_under_every_strategy(strategy: str) -> None:
    state = make(strategy=strategy, adapter=Linear(stateful=True))
    for _ in range(30):
        logs, state = state.train_step(BATCH)
    host = state.with_strategy("eager")
    np.testing.assert_allclose(host.params, [2.0, -1.0], atol=1e-3)
    assert float(host.model_state) == 30.0 and int(host.step) == 30
    assert float(logs.losses.mse) < 1e-5


@pytest.mark.parametrize(
    "batch",
    [
        BATCH,
        list(BATCH),
        {"inputs": BATCH[0], "target": BATCH[1]},
        {"image": BATCH[0], "label": BATCH[1]},
        {"x": BATCH[0], "y": BATCH[1]},
    ],
    ids=["tuple", "list", "inputs-target", "image-label", "x-y"],
)
def test_batch_forms(batch: Any) -> None:
    logs, _ = make(strategy="eager").test_step(batch)
    assert float(logs.losses.mse) == pytest.approx(2.5)


def test_split_batch_errors() -> None:
    with pytest.raises(KeyError, match=r"'inputs'/'target', 'image'/'label', 'x'/'y'.*\['a', 'b'\]"):
        managed.split_batch({"a": 1, "b": 2})
    with pytest.raises(ValueError, match="got 3 elements"):
        managed.split_batch((1, 2, 3))
    assert managed.split_batch(np.ones(3))[1] is None


def test_names_given_to_losses_and_metrics() -> None:
    seen: dict[str, Any] = {}

    def loss(preds, target, logits, labels, inputs, batch, params):
        seen.update(preds=preds, logits=logits, target=target, labels=labels, batch=batch, params=params)
        return jnp.sum(inputs) * 0.0

    state = make(losses={"zero": loss}, metrics={"loss_seen": lambda loss: loss}, strategy="eager")
    logs, _ = state.train_step(BATCH)
    assert seen["preds"] is seen["logits"] and seen["target"] is seen["labels"]
    assert seen["batch"] is BATCH and float(logs.metrics.loss_seen) == 0.0


def test_per_sample_losses_are_averaged_and_losses_summed() -> None:
    state = make(
        losses={
            "mse": lambda preds, target: (preds - target) ** 2,
            "l1": lambda params: jnp.abs(params).sum(),
        },
        strategy="eager",
    )
    logs, _ = state.test_step(BATCH)
    assert float(logs.losses.mse) == pytest.approx(2.5) and float(logs.losses.l1) == 0.0


def test_one_loss_function_is_named_loss() -> None:
    logs, _ = make(losses=lambda preds, target: (preds - target) ** 2, strategy="eager").test_step(BATCH)
    assert list(logs.losses) == ["loss"]


def test_predict_step_outputs_preds_and_keeps_the_state() -> None:
    state = make(strategy="eager")
    logs, same = state.predict_step(BATCH[0])
    assert same is state
    np.testing.assert_array_equal(logs.outputs.preds, [0.0, 0.0])


def test_train_step_without_losses_says_how_to_add_them() -> None:
    state = make(losses=None, strategy="eager")
    with pytest.raises(ValueError, match="no losses to train on; create it with losses="):
        state.train_step(BATCH)
    logs, _ = state.test_step(BATCH)  # evaluation needs no losses
    assert "losses" not in logs


def test_dropout_key_changes_every_step_and_is_reproducible() -> None:
    state = make(key=7, strategy="eager")
    keys = [state.step_key()]
    for _ in range(2):
        _, state = state.train_step(BATCH)
        keys.append(state.step_key())
    data = [tuple(np.asarray(jax.random.key_data(k))) for k in keys]
    assert len(set(data)) == 3
    assert tuple(np.asarray(jax.random.key_data(make(key=7).step_key()))) == data[0]


@pytest.mark.parametrize("key", [3, jax.random.key(3), jax.random.PRNGKey(3)], ids=["int", "typed", "raw"])
def test_key_forms(key: Any) -> None:
    state = make(key=key)
    assert jax.dtypes.issubdtype(state.step_key().dtype, jax.dtypes.prng_key)
    assert state.key.dtype == jnp.uint32  # raw data: cheap to pass through a compiled step


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"inputs": None}, TypeError, "needs sample `inputs`.*got neither"),
        ({"variables": (jnp.zeros(2), None)}, TypeError, "got both"),
        ({"tx": "adam"}, TypeError, "tx must be an optax optimizer"),
        ({"losses": {"mse": 3}}, TypeError, "entry 'mse' is 3"),
        ({"losses": [1]}, TypeError, "losses must be a dict"),
        ({"metrics": {"acc": 3}}, TypeError, "metric 'acc'"),
        ({"metrics": [1]}, TypeError, "metrics must be a dict"),
        ({"metrics": {1: len}}, TypeError, "metric names must be strings"),
        ({"key": "seed"}, TypeError, "key must be an int seed"),
    ],
)
def test_bad_arguments_are_named(overrides: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        make(**overrides)


@pytest.mark.parametrize("strategy", ["eager", "jit", "fsdp"])
def test_a_state_without_tx_predicts_tests_and_summarises_but_refuses_to_train(strategy: str) -> None:
    trained = make(strategy=strategy)
    state = ciclo.create_model_state(
        Linear(),
        inputs=jnp.ones((1, 2)),
        losses={"mse": lambda preds, target: (preds - target) ** 2},
        metrics={"mae": lambda preds, target: abs(preds - target)},
        strategy=strategy,
    )
    assert state.tx is None and state.opt_state is None and state.ema_params is None
    state = state.replace(params=trained.params + jnp.array([2.0, -1.0]))
    logs, _ = state.predict_step(BATCH[0])
    np.testing.assert_allclose(logs.outputs.preds, [2.0, -1.0])
    logs, state = state.test_step(BATCH)
    assert float(logs.losses.mse) == 0.0 and float(logs.metrics.mae) == 0.0
    assert "no optimizer (no tx)" in str(ciclo.summary(state))
    with pytest.raises(
        ValueError,
        match=r"created without tx= \(for inference\).*tx=optax.adam\(1e-3\), to create_model_state",
    ):
        state.train_step(BATCH)
    with pytest.raises(ValueError, match="created without tx="):
        state.apply_gradients(grads=state.params)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"accumulate_steps": 2}, "accumulate_steps=2"),
        ({"ema_decay": 0.9}, "ema_decay=0.9"),
        ({"log_norms": True}, "log_norms=True"),
    ],
)
def test_options_that_need_an_optimizer_are_refused_without_tx(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=f"{named} acts on optimizer steps.*without tx="):
        ciclo.create_model_state(Linear(), inputs=jnp.ones((1, 2)), **options)


def test_a_state_without_tx_keeps_its_precision() -> None:
    state = ciclo.create_model_state(Linear(), inputs=jnp.ones((1, 2)), precision="bf16-mixed")
    assert state.options.precision.compute_dtype == jnp.bfloat16
    assert state.predict_step(BATCH[0])[0].outputs.preds.dtype == jnp.float32


def test_variables_skip_init() -> None:
    state = ciclo.create_model_state(
        Linear(), variables=(jnp.array([2.0, -1.0]), None), tx=optax.sgd(0.1), strategy="eager"
    )
    logs, _ = state.predict_step(BATCH)
    np.testing.assert_array_equal(logs.outputs.preds, [2.0, -1.0])


def test_named_losses_compare_by_identity() -> None:
    losses = managed.NamedLosses({"a": len})
    assert losses == losses and losses != managed.NamedLosses({"a": len})
    assert hash(losses) == hash(losses) and dict(losses) == {"a": len} and len(losses) == 1
    assert "NamedLosses" in repr(losses)


def test_train_loop_evaluates_with_running_metrics_and_resets_each_epoch() -> None:
    batches = [(np.eye(2, dtype=np.float32) * (i + 1), np.array([2.0, -1.0], np.float32)) for i in range(4)]
    state = make(metrics={"seen": lambda target: jnp.ones(target.shape)}, strategy="jit")
    state, history, _ = ciclo.train_loop(
        state, batches * 3, test_dataset=lambda: batches, epoch_duration=4, stop=12
    )
    # The test loop reports the last running value of the metrics and the mean of the losses.
    assert history.collect("seen_test") == [1.0, 1.0, 1.0]
    counts = float(state.with_strategy("eager").metrics["seen"].count)
    assert counts == 0.0  # reset at the end of the last epoch; the test run updated a copy


def test_train_loop_without_epochs_does_not_need_reset_step() -> None:
    state, history, _ = ciclo.train_loop(make(), [BATCH] * 5)
    assert len(history) == 5


def test_model_state_declares_the_roles_of_its_fields() -> None:
    roles = {role: managed.fields_with_role(ciclo.types.ModelState, role) for role in managed.Role}
    assert roles == {
        managed.Role.PARAMS: ("params",),
        managed.Role.MODEL_STATE: ("model_state",),
        managed.Role.KEY: ("key",),
        managed.Role.METRICS: ("metrics",),
    }


@pytest.mark.parametrize("strategy", ["eager", "jit", "data_parallel", "fsdp"])
def test_init_runs_under_the_strategy(strategy: str) -> None:
    traced: list[bool] = []

    @dataclasses.dataclass(frozen=True, eq=False)
    class Recording(Linear):
        def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Any, Any]:
            traced.append(isinstance(inputs, jax.core.Tracer))
            return super().init(key, inputs)

    state = make(adapter=Recording(), strategy=strategy)
    # The mesh strategies build the state inside jax.jit, with its layout as output shardings.
    assert traced and all(traced) == (strategy in ("data_parallel", "fsdp"))
    assert all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(state))


def test_states_are_abstract_or_final_and_override_no_concrete_method() -> None:
    base = managed.AbstractManagedState
    abstract = {"resume_options", "resume_refusal"}
    # What dataclasses generates for every class (__init__, __eq__, ...) is not ciclo's to override.
    concrete = {
        name
        for name, value in vars(base).items()
        if callable(value) and not name.startswith("__") and name not in abstract
    }
    for kind in (managed.ManagedState, ciclo.types.ModelState):
        assert not concrete & set(vars(kind)), kind
        assert abstract <= set(vars(kind)), kind
    assert getattr(ciclo.types.ModelState, "__final__", False)
    assert not issubclass(ciclo.types.ModelState, managed.ManagedState)
    assert "apply_fn" not in {field.name for field in dataclasses.fields(ciclo.types.ModelState)}

    class _Half(managed.AbstractManagedState):
        pass

    # abc refuses a class that leaves the abstract methods out, when it is instantiated.
    with pytest.raises(TypeError, match=r"abstract class _Half .*resume_options'?, '?resume_refusal"):
        _Half(step=jnp.zeros((), jnp.int32), params=jnp.ones(2), opt_state=None, tx=None)


@dataclasses.dataclass(frozen=True, eq=False)
class FailsOnOtherInputs:
    """Takes the leaves of a dict of inputs; `apply` fails on any other structure than `init` saw."""

    def init(self, key: jax.Array, inputs: Any) -> tuple[Any, Any]:
        return jnp.zeros(len(inputs)), None

    def apply(self, params, model_state, inputs, *, key, training):
        return jnp.stack(list(inputs.values()), axis=-1) @ params, model_state


def test_the_note_of_a_model_failing_on_a_large_batch_stays_short() -> None:
    # A batch of 200 leaves the model cannot take (their shapes in full would take ~2,400 characters):
    # the note names the first shapes and counts the rest.
    state = make(adapter=FailsOnOtherInputs(), inputs={"a": jnp.ones((1,))}, strategy="eager")
    inputs = {f"leaf{i}": np.ones(2, np.float32) for i in range(200)}
    with pytest.raises(TypeError) as info:
        state.test_step((inputs, np.zeros(2, np.float32)))
    (note,) = [note for note in info.value.__notes__ if note.startswith("the model failed on inputs")]
    assert note.startswith("the model failed on inputs float32[2], float32[2], ")
    assert "and 192 more leaves: give every step" in note and len(note) <= 300
