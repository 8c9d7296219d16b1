"""The training options of `ciclo.create_model_state`: precision, accumulation, the EMA, the norms.

Each adapter's conformance case checks one option under the compiled strategies
(tests/conformance); here the plain-JAX model checks what they share: every
built-in strategy, `steps_per_execution`, resuming from a backup, the
learning-rate schedule's count and the loss scale's growth.
"""

from __future__ import annotations

import logging
from operator import attrgetter
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support.linear import CLASSES, FEATURES, Linear, batches

import ciclo
from ciclo import managed

DATA = batches(8)

# Every option at once; a loss scale these gradients fit in float16 from the first step.
OPTIONS: dict[str, Any] = {
    "precision": ciclo.types.Precision(
        jnp.float16, loss_scaling=True, initial_scale=2.0**8, growth_interval=3
    ),
    "accumulate_steps": 2,
    "ema_decay": 0.5,
}


def make(strategy: str = "jit", tx: optax.GradientTransformation | None = None, **options: Any) -> Any:
    return ciclo.create_model_state(
        Linear(),
        inputs=jnp.zeros((1, FEATURES)),
        tx=tx if tx is not None else optax.sgd(0.5),
        losses=optax.softmax_cross_entropy_with_integer_labels,
        strategy=strategy,
        **options,
    )


def host(state: Any) -> list[np.ndarray]:
    eager = state.with_strategy("eager")
    return [
        np.asarray(leaf)
        for leaf in jax.tree.leaves(
            (eager.step, eager.params, eager.opt_state, eager.ema_params, eager.loss_scale)
        )
    ]


@pytest.fixture(scope="module")
def expected() -> list[np.ndarray]:
    state = make(**OPTIONS)
    for batch in DATA:
        _, state = state.train_step(batch)
    return host(state)


@pytest.mark.parametrize("strategy", ciclo.strategies.strategy_names())
def test_every_strategy_trains_with_every_option(strategy: str, expected: list[np.ndarray]) -> None:
    state = make(strategy, **OPTIONS)
    for batch in DATA:
        _, state = state.train_step(batch)
    for actual, wanted in zip(host(state), expected, strict=True):
        np.testing.assert_allclose(actual, wanted, rtol=1e-6, atol=1e-7)


def test_steps_per_execution_composes_with_every_option(expected: list[np.ndarray]) -> None:
    state, history, _ = ciclo.train_loop(make(**OPTIONS), DATA, steps_per_execution=4)
    assert len(history.collect("loss_scale")) == len(DATA)
    for actual, wanted in zip(host(state), expected, strict=True):
        np.testing.assert_allclose(actual, wanted, rtol=1e-6, atol=1e-7)


class _Crash(Exception):
    pass


def test_a_backup_resumes_every_option_bit_for_bit(tmp_path: Any, expected: list[np.ndarray]) -> None:
    def crash(elapsed: ciclo.types.Elapsed) -> None:
        if elapsed.steps == 5:  # between two micro-batches of one optimizer step
            raise _Crash

    backup = ciclo.backup(tmp_path, every=3)
    with pytest.raises(_Crash):
        ciclo.train_loop(make(**OPTIONS), DATA, tasks={ciclo.every(1): crash}, backup=backup)
    resumed, _, elapsed = ciclo.train_loop(make(**OPTIONS), DATA, backup=backup)
    assert elapsed.steps == len(DATA)
    uninterrupted, _, _ = ciclo.train_loop(make(**OPTIONS), DATA)
    for actual, wanted in zip(host(resumed), host(uninterrupted), strict=True):
        np.testing.assert_array_equal(actual, wanted)


def test_learning_rate_schedules_count_optimizer_steps() -> None:
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=optax.linear_schedule(1.0, 0.0, 10))
    state = make(tx=tx, accumulate_steps=2)
    rates = []
    for batch in DATA[:4]:
        logs, state = state.train_step(batch)
        rates.append(float(logs.metrics.learning_rate))
    # The rate of the last optimizer update: of update 0 after steps 1-2, of update 1 after steps 3-4.
    np.testing.assert_allclose(rates, [1.0, 1.0, 1.0, 0.9], rtol=1e-6)


def test_the_loss_scale_doubles_after_its_growth_interval_and_halves_on_overflow() -> None:
    state = make(
        precision=ciclo.types.Precision(jnp.float16, loss_scaling=True, initial_scale=4.0, growth_interval=2)
    )
    scales = []
    for batch in DATA[:3]:
        logs, state = state.train_step(batch)
        scales.append(float(logs.metrics.loss_scale))
    inputs, target = DATA[3]
    logs, state = state.train_step((inputs * 1e6, target))
    scales.append(float(logs.metrics.loss_scale))
    assert scales == [4.0, 8.0, 8.0, 4.0]
    assert int(logs.metrics.skipped_steps) == 1


def test_a_skipped_step_keeps_the_accumulated_gradients_and_the_ema() -> None:
    state = make(**OPTIONS)
    _, state = state.train_step(DATA[0])  # the first micro-batch of an optimizer step
    inputs, target = DATA[1]
    _, skipped = state.train_step((inputs * 1e6, target))
    # The loss scale (opt_state.loss_scale) halves; the rest of opt_state, the accumulation's, stays.
    for name in ("params", "opt_state.inner", "ema_params"):
        for a, b in zip(
            jax.tree.leaves(attrgetter(name)(skipped)), jax.tree.leaves(attrgetter(name)(state)), strict=True
        ):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # still waiting for its second micro-batch
    assert int(optax.tree_utils.tree_get(skipped.opt_state, "mini_step")) == 1


def test_with_ema_params_evaluates_and_predicts_with_the_averaged_weights() -> None:
    state = make(ema_decay=0.5)
    for batch in DATA[:3]:
        _, state = state.train_step(batch)
    averaged = state.with_ema_params()
    np.testing.assert_array_equal(np.asarray(averaged.params["w"]), np.asarray(state.ema_params["w"]))
    logs, _ = averaged.predict_step(DATA[0][0])
    np.testing.assert_allclose(
        np.asarray(logs.outputs.preds), DATA[0][0] @ np.asarray(state.ema_params["w"]), rtol=1e-6
    )


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"precision": "fp8"}, "precision must be one of '32', 'bf16-mixed', '16-mixed'"),
        ({"accumulate_steps": 0}, "accumulate_steps must be an int >= 1"),
        ({"accumulate_steps": 2.0}, "accumulate_steps must be an int >= 1"),
        ({"ema_decay": 1.0}, r"ema_decay must be a number in \[0, 1\)"),
        ({"ema_decay": "0.9"}, r"ema_decay must be a number in \[0, 1\)"),
        ({"log_norms": "layers"}, "log_norms must be True, False or 'modules'"),
    ],
)
def test_bad_options_are_refused_when_the_state_is_created(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make(**options)
    with pytest.raises(ValueError, match=match):  # built by hand too
        managed.TrainingOptions(**options)


def test_training_options_built_by_hand_take_a_precision_s_name() -> None:
    options = managed.TrainingOptions(precision="16-mixed", ema_decay=0)
    assert options.precision == ciclo.types.Precision.of("16-mixed") and options.ema_decay == 0.0
    assert options == managed.TrainingOptions(precision=ciclo.types.Precision.of("16-mixed"), ema_decay=0.0)


def test_log_norms_under_accumulation_are_the_accumulated_gradient_s_carried_between_updates() -> None:
    # Two micro-batches of 8 rows average to the gradient of their 16 rows joined.
    joined = tuple(np.concatenate(parts) for parts in zip(*DATA[:2], strict=True))
    wanted, _ = make(log_norms=True).train_step(joined)
    state, logged = make(log_norms=True, accumulate_steps=2), []
    for batch in DATA[:3]:
        logs, state = state.train_step(batch)
        logged.append({name: float(value) for name, value in logs.norms.items()})
    assert logged[0] == dict.fromkeys(("grad_norm", "param_norm", "update_norm"), 0.0)  # no update yet
    for name in ("grad_norm", "update_norm", "param_norm"):
        np.testing.assert_allclose(logged[1][name], float(wanted.norms[name]), rtol=1e-6)
    assert logged[2] == logged[1]  # a micro-step logs the last optimizer step's norms
    assert logged[1]["update_norm"] > 0


def test_log_norms_modules_names_the_first_key_of_each_parameter_path() -> None:
    state = managed.ManagedState.create(
        params={"encoder": {"w": jnp.ones(2), "b": jnp.ones(())}, "head": jnp.ones(4)},
        tx=optax.sgd(1.0),
        log_norms="modules",
    )
    grads = {"encoder": {"w": jnp.full(2, 2.0), "b": jnp.ones(())}, "head": jnp.ones(4)}
    norms = state.apply_gradients(grads=grads).norms
    assert norms is not None
    # Gradients: encoder sqrt(4 + 4 + 1) = 3, head sqrt(4) = 2; sgd(1.0) leaves params w=-1, b=0, head=0.
    expected = {
        "grad_norm": np.sqrt(13),
        "grad_norm/encoder": 3.0,
        "grad_norm/head": 2.0,
        "update_norm": np.sqrt(13),
        "param_norm": np.sqrt(2),
    }
    assert set(norms) == set(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(float(norms[name]), value, rtol=1e-6)


def test_log_norms_modules_needs_parameters_with_modules() -> None:
    with pytest.raises(ValueError, match="the parameters are one array"):
        managed.ManagedState.create(params=jnp.zeros(2), tx=optax.sgd(0.1), log_norms="modules")


def test_a_resume_that_changes_log_norms_is_refused_and_one_that_keeps_it_is_not() -> None:
    state = make(log_norms=True)
    assert state.resume_options()["log_norms"] is True
    reason = state.resume_refusal("log_norms", False)
    assert reason is not None and "none in the backup, the global norms in this state" in reason


def test_log_norms_add_no_dispatch_and_no_host_transfer(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []  # one entry per call of a compiled step's program
    compile_step = ciclo.strategies.JIT.compile

    def counting(self: Any, step: Any, /, *, donate: bool = False) -> Any:
        compiled = compile_step(self, step, donate=donate)

        def run(*args: Any) -> Any:
            calls.append(1)
            return compiled(*args)

        return run

    monkeypatch.setattr(ciclo.strategies.JIT, "compile", counting)
    device_batches = jax.device_put(DATA[:4])
    counts = {}
    for log_norms in (False, True, "modules"):

        @managed.train_step  # a step of its own: it compiles under the counting strategy
        def train_step(state: Any, batch: Any) -> Any:
            inputs, target = batch
            logits = inputs @ state.params["w"]
            return ciclo.logs().add_loss(
                "loss", optax.softmax_cross_entropy_with_integer_labels(logits, target).mean()
            )

        params = {"w": jnp.zeros((FEATURES, CLASSES))}
        state = managed.ManagedState.create(params=params, tx=optax.adam(0.1), log_norms=log_norms)
        _, state = train_step(state, device_batches[0])  # compiles
        calls.clear()
        with jax.transfer_guard("disallow"):  # a host transfer in a step raises
            for batch in device_batches:
                logs, state = train_step(state, batch)
        counts[log_norms] = len(calls)
        assert ("norms" in logs) == bool(log_norms)
    assert counts == {False: 4, True: 4, "modules": 4}  # one program a step, norms or not


def test_a_precision_policy_needs_a_floating_dtype() -> None:
    with pytest.raises(TypeError, match="compute_dtype must be a floating dtype"):
        ciclo.types.Precision(jnp.int8)


@pytest.mark.parametrize("growth_interval", [0, True, 2.0])
def test_a_precision_policy_needs_an_int_growth_interval(growth_interval: Any) -> None:
    with pytest.raises(ValueError, match=f"growth_interval must be an int >= 1, got {growth_interval}"):
        ciclo.types.Precision(jnp.float16, loss_scaling=True, growth_interval=growth_interval)


def test_with_ema_params_needs_an_ema() -> None:
    with pytest.raises(ValueError, match="create it with ema_decay="):
        make().with_ema_params()


def test_train_loop_tests_with_the_ema_and_trains_on_with_the_trained_weights() -> None:
    test = DATA[:2]
    state, history, _ = ciclo.train_loop(
        make(ema_decay=0.5), DATA[:4], test_dataset=lambda: test, epoch_duration=4, test_with_ema=True
    )
    _, tested, _ = ciclo.test_loop(state.with_ema_params(), test)
    # test_loop's last loss is the test set's, as train_loop's loss_test.
    np.testing.assert_allclose(history.collect("loss_test"), [tested.collect("loss")[-1]], rtol=1e-6)
    plain, _, _ = ciclo.train_loop(make(ema_decay=0.5), DATA[:4], test_dataset=lambda: test, epoch_duration=4)
    np.testing.assert_array_equal(np.asarray(state.params["w"]), np.asarray(plain.params["w"]))


def test_train_loop_refuses_test_with_ema_without_an_ema() -> None:
    with pytest.raises(ValueError, match="create it with ema_decay="):
        ciclo.train_loop(make(), DATA, test_dataset=lambda: DATA, epoch_duration=4, test_with_ema=True)


def _overflowing(count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Batches whose predictions overflow float16 at any loss scale: every 16-mixed step is skipped."""
    return [(inputs * 1e6, target) for inputs, target in batches(count)]


def _stuck(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if "were all skipped" in record.getMessage()]


def test_a_float16_run_whose_every_step_is_skipped_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    # It used to train nothing for the whole run and say so only in the logged skipped_steps.
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        trained, history, _ = ciclo.train_loop(make(precision="16-mixed"), _overflowing(30))
    assert history.collect("skipped_steps")[-1] == 30
    (message,) = _stuck(caplog)
    # The count copied at step 20 is read at step 30, the next check.
    assert (
        "the last 20 steps up to step 20 were all skipped, and the loss scale is down to 1 (its floor)"
        in message
    )
    assert "precision='bf16-mixed'" in message and "max_skipped_steps" in message
    np.testing.assert_array_equal(np.asarray(trained.params["w"]), np.asarray(make().params["w"]))


def test_a_run_that_ends_stuck_at_the_scale_s_floor_warns_as_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        ciclo.train_loop(make(precision="16-mixed"), _overflowing(17))  # 2**16 halved 16 times is 1
    (message,) = _stuck(caplog)
    assert (
        "the last 17 steps up to step 17 were all skipped, and the loss scale is down to 1 (its floor)"
        in message
    )


def test_max_skipped_steps_stops_a_stuck_run(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        _, _, elapsed = ciclo.train_loop(make(precision="16-mixed"), _overflowing(60), max_skipped_steps=5)
    assert elapsed.steps == 20  # the count copied at step 10 is read at step 20
    (message,) = _stuck(caplog)
    assert "the last 10 steps up to step 10 were all skipped" in message
    assert "Stopping the loop: max_skipped_steps=5" in message


def test_a_float16_run_that_skips_a_few_steps_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    data = batches(30)
    data[3] = (data[3][0] * 1e6, data[3][1])
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        _, history, _ = ciclo.train_loop(make(precision="16-mixed"), data, max_skipped_steps=2)
    assert history.collect("skipped_steps")[-1] == 1
    assert caplog.text == ""


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"max_skipped_steps": 0}, ValueError, "max_skipped_steps must be an int >= 1 or None, got 0"),
        ({"max_skipped_steps": True}, ValueError, "max_skipped_steps must be an int >= 1 or None, got True"),
    ],
)
def test_bad_max_skipped_steps_are_refused(options: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ciclo.train_loop(make(precision="16-mixed"), DATA, **options)


def test_max_skipped_steps_needs_a_loss_scale() -> None:
    with pytest.raises(ValueError, match="counts the steps a loss scale skips, and this state has none"):
        ciclo.train_loop(make(), DATA, max_skipped_steps=5)


def _unapplied(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if "accumulated after its last" in record.getMessage()
    ]


def test_micro_batches_a_stop_leaves_unapplied_are_announced_before_the_first_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # They used to be dropped at the end of the run without a word.
    said_before_the_first_step = []

    def first_step(elapsed: ciclo.types.Elapsed) -> None:
        if elapsed.steps == 0:
            said_before_the_first_step.append(bool(_unapplied(caplog)))

    with caplog.at_level(logging.WARNING, logger="ciclo"):
        state, _, _ = ciclo.train_loop(
            make(accumulate_steps=4), DATA, tasks={ciclo.every(1): first_step}, stop=6
        )
    assert said_before_the_first_step == [True]
    (message,) = _unapplied(caplog)  # said once: not again at the end
    assert "the run will end at stop=6 steps, with 2 micro-batch(es) accumulated" in message
    assert "accumulate_steps=4: their gradients will not be applied to the parameters" in message
    assert int(state.opt_state.mini_step) == 2


def test_micro_batches_a_dataset_s_end_leaves_unapplied_are_announced_at_the_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        ciclo.train_loop(make(accumulate_steps=4), DATA[:7])
        ciclo.train_loop(make(accumulate_steps=4), DATA)  # 8 micro-batches: nothing left
    (message,) = _unapplied(caplog)
    assert "the run ended after 7 steps, with 3 micro-batch(es) accumulated" in message
    assert "were not applied" in message


def test_accumulate_steps_on_a_tx_that_accumulates_already_is_refused() -> None:
    # The two optax.MultiSteps used to nest: an update after both groups.
    tx = optax.MultiSteps(optax.sgd(0.5), every_k_schedule=2).gradient_transformation()
    with pytest.raises(
        ValueError, match=r"tx is already an optax\.MultiSteps.*accumulate_steps=2 would wrap"
    ):
        make(tx=tx, accumulate_steps=2)
    make(tx=tx)  # its own accumulation alone is fine


@managed.train_step
def _own_step(state: Any, batch: Any) -> Any:
    """The step of `Linear` written by hand, for a `managed.ManagedState` of one's own."""
    inputs, target = batch
    policy = state.options.precision
    preds = (policy.cast(jnp.asarray(inputs)) @ policy.cast(state.params["w"])).astype(jnp.float32)
    loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(preds, target))
    return ciclo.logs().add_loss("loss", loss), state


def test_a_managed_state_of_ones_own_trains_with_every_option(expected: list[np.ndarray]) -> None:
    like = make(**OPTIONS)  # the same initial weights
    params = {"w": like.params["w"]}
    state = ciclo.managed.ManagedState.create(params=params, tx=optax.sgd(0.5), **OPTIONS)
    for batch in DATA:
        logs, state = _own_step(state, batch)
    assert sorted(logs.metrics) == ["loss_scale", "skipped_steps"]
    for actual, wanted in zip(host(state), expected, strict=True):
        np.testing.assert_allclose(actual, wanted, rtol=1e-6, atol=1e-7)
    options = like.resume_options()
    del options["key_impl"]  # a ModelState's own: its key's PRNG implementation
    assert state.resume_options() == options


def test_train_loop_watches_the_loss_scale_of_a_managed_state_of_ones_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = ciclo.managed.ManagedState.create(
        params={"w": jnp.zeros((FEATURES, CLASSES))}, tx=optax.sgd(0.5), precision="16-mixed"
    )
    with caplog.at_level(logging.WARNING, logger="ciclo"):
        _, _, elapsed = ciclo.train_loop(
            state, _overflowing(60), {ciclo.on_train_step: _own_step}, max_skipped_steps=5
        )
    assert elapsed.steps == 20  # the count copied at step 10 is read at step 20
    (message,) = _stuck(caplog)
    assert "Stopping the loop: max_skipped_steps=5" in message
