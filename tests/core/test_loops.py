import jax.numpy as jnp
import numpy as np
import pytest

import ciclo


class CounterState:
    """A state whose methods self-register in the predefined loops."""

    def __init__(self, value=0, resets=0, log=None):
        self.value = value
        self.resets = resets
        self.log = [] if log is None else log

    def train_step(self, batch):
        self.log.append(("train", batch))
        new = CounterState(self.value + 1, self.resets, self.log)
        return ciclo.logs().add_loss("loss", 1.0 / new.value), new

    def test_step(self, batch):
        self.log.append(("test", batch))
        return ciclo.logs().add_metric("accuracy", float(batch))

    def reset_step(self):
        self.log.append(("reset",))
        return CounterState(self.value, self.resets + 1, self.log)

    def predict_step(self, batch):
        return ciclo.logs().add_output("pred", batch * 10)


def test_train_loop_registers_state_methods_and_runs_tests_each_epoch():
    state = CounterState()
    state, history, elapsed = ciclo.train_loop(
        state,
        range(100),
        test_dataset=lambda: [0.0, 1.0],
        epoch_duration=3,
        stop=7,
    )
    assert state.value == 7 and elapsed.steps == 7
    # Epochs end after steps 3 and 6: a reset, then a test run (a ciclo.test_loop, which
    # resets the copy it evaluates first), each time.
    assert history.collect("steps", "accuracy_test") == ([2, 5], [0.5, 0.5])
    assert state.resets == 2
    assert state.log[:8] == [
        ("train", 0),
        ("train", 1),
        ("train", 2),
        ("reset",),
        ("reset",),
        ("test", 0.0),
        ("test", 1.0),
        ("train", 3),
    ]
    assert [entry for entry in state.log if entry[0] == "test"] == [("test", 0.0), ("test", 1.0)] * 2
    assert len(history.collect("loss")) == 7


def test_named_schedules_in_tasks_and_order():
    order = []

    def named(name):
        return lambda: order.append(name)

    ciclo.train_loop(
        0,
        range(10),
        {
            ciclo.on_train_batch_begin: named("batch_begin"),
            "train_step": named("train_step"),
            ciclo.on_train_step: [named("on_train_step")],
            ciclo.every(2): [named("every2")],
            ciclo.on_epoch_end: [named("epoch_end")],
            ciclo.on_reset_step: [named("reset")],
            ciclo.on_train_batch_end: [named("batch_end")],
            ciclo.on_train_begin: [named("begin")],
            ciclo.on_train_end: [named("end")],
            ciclo.on_test_begin: [named("test_begin")],
            ciclo.on_test_step: [named("test_step")],
            ciclo.on_test_end: [named("test_end")],
        },
        test_dataset=lambda: [1],
        epoch_duration=2,
        stop=2,
    )
    assert order == [
        "begin",
        "batch_begin", "train_step", "on_train_step", "every2", "batch_end",
        "batch_begin", "train_step", "on_train_step",
        "reset", "test_begin", "test_step", "test_end", "epoch_end",
        "batch_end",
        "end",
    ]  # fmt: skip


def test_callbacks_self_register_by_hook_name():
    class Hooks:
        def __init__(self):
            self.calls = []

        def on_train_batch_end(self, state, batch, elapsed, loop_state):
            self.calls.append(("batch_end", elapsed.steps))

        def on_epoch_end(self, state, batch, elapsed, loop_state):
            self.calls.append(("epoch_end", elapsed.steps, dict(loop_state.accumulated_logs["metrics"])))

    hooks = Hooks()
    ciclo.train_loop(
        CounterState(),
        range(10),
        callbacks=[hooks],
        test_dataset=lambda: [1.0, 3.0],
        epoch_duration=2,
        stop=4,
    )
    assert hooks.calls == [
        ("batch_end", 0),
        # Epoch-end callbacks see the counts that include the step that ends the epoch.
        ("epoch_end", 2, {"accuracy_test": 2.0}),
        ("batch_end", 1),
        ("batch_end", 2),
        ("epoch_end", 4, {"accuracy_test": 2.0}),
        ("batch_end", 3),
    ]


def test_epoch_duration_in_samples():
    _, history, _ = ciclo.train_loop(
        0,
        [[0] * 3] * 10,
        {ciclo.on_train_step: lambda state: state + 1, ciclo.on_epoch_end: lambda: {"metrics": {"end": 1}}},
        epoch_duration=ciclo.at(samples=7),
        batch_size_fn=len,
    )
    # 3 samples per step: epochs end after steps that cross 7, 14, 21, 28 samples.
    assert history.collect("steps") == [2, 4, 6, 9]


def test_test_duration_and_inner_loop_kwargs():
    _, history, _ = ciclo.train_loop(
        0,
        range(4),
        {ciclo.on_test_step: lambda state, batch: ciclo.logs().add_metric("b", float(batch))},
        test_dataset=lambda: [1.0, 2.0, 3.0, 4.0],
        test_duration=2,
        test_name="val",
        epoch_duration=2,
        inner_loop_kwargs={"aggregation": "last"},
    )
    assert history.collect("b_val") == [2.0, 2.0]


def test_test_loop_resets_then_tests():
    state = CounterState(value=5)
    _, history, elapsed = ciclo.test_loop(state, [1.0, 0.0])
    assert history.collect("accuracy") == [1.0, 0.0]
    assert state.log == [("reset",), ("test", 1.0), ("test", 0.0)]
    assert elapsed.steps == 2


def _mean_loss_step(state, batch):
    return ciclo.logs().add_loss("loss", np.float32(batch.mean())).add_metric("error", float(batch.mean()))


def test_test_loop_logs_each_loss_as_the_weighted_mean_so_far():
    # Three batches of 4, 4 and 2 samples whose losses are 1, 2 and 4: the test set's loss is 2.0.
    batches = [np.full(4, 1.0), np.full(4, 2.0), np.full(2, 4.0)]
    _, history, _ = ciclo.test_loop(None, batches, {ciclo.on_test_step: _mean_loss_step})
    assert history.collect("loss") == [1.0, 1.5, 2.0]  # (4 * 1 + 4 * 2) / 8, then (12 + 2 * 4) / 10
    assert history.collect("error") == [1.0, 2.0, 4.0]  # a metric the step logs per batch: kept as it is
    # train_loop's evaluation and an inner loop over test_loop give the same test loss, the test set's.
    tasks = {ciclo.on_test_step: _mean_loss_step}
    evaluate = ciclo.inner_loop("test", lambda state: ciclo.test_loop(state, batches, tasks))
    assert evaluate(None) == ({"losses": {"loss_test": 2.0}, "metrics": {"error_test": 2.0}}, None)
    for aggregation, loss in ((None, 2.0), ({"loss": "max"}, 4.0)):
        _, history, _ = ciclo.train_loop(
            None,
            [np.zeros(4)],
            {ciclo.on_train_step: lambda: None, ciclo.on_test_step: _mean_loss_step},
            test_dataset=lambda: batches,
            epoch_duration=1,
            test_aggregation=aggregation,
        )
        assert history.collect("loss_test") == [loss]  # train_loop's rules still see the per-batch losses


def test_a_resumed_test_loop_goes_on_with_its_running_losses(tmp_path):
    # Stopped after two of four batches and resumed from its backup, test_loop ends on the loss of
    # the whole test set, bit for bit the uninterrupted run's, not on the mean of the batches after.
    batches = [np.full(4, 0.1), np.full(4, 0.7), np.full(2, 0.3), np.full(3, 1.9)]
    tasks = {
        ciclo.on_test_step: lambda batch: ciclo.logs().add_loss("loss", jnp.mean(batch, dtype=jnp.float32))
    }
    _, whole, _ = ciclo.test_loop(None, batches, tasks)
    backup = ciclo.backup(tmp_path, every=1)
    _, first, elapsed = ciclo.test_loop(None, batches, tasks, backup=backup, stop=2)
    assert elapsed.steps == 2
    _, resumed, elapsed = ciclo.test_loop(None, batches, tasks, backup=backup)
    assert elapsed.steps == 4
    assert resumed.collect("loss") == whole.collect("loss")
    assert resumed.running == whole.running == {"losses.loss"}


def test_test_loop_with_stop_and_callbacks():
    class Hook:
        def __init__(self):
            self.steps = []

        def on_test_batch_end(self, state, batch, elapsed, loop_state):
            self.steps.append(elapsed.steps)

    hook = Hook()
    ciclo.test_loop(CounterState(), range(10), callbacks=[hook], stop=3)
    assert hook.steps == [0, 1, 2]


def test_predict_loop_collects_outputs():
    _, history, _ = ciclo.predict_loop(CounterState(), [1, 2, 3])
    assert history.collect("pred") == [10, 20, 30]


def test_predict_loop_hooks():
    begun = []
    ciclo.predict_loop(
        None,
        [1],
        {
            ciclo.hooks.on_predict_begin: lambda: begun.append("b"),
            ciclo.hooks.on_predict_end: lambda: begun.append("e"),
        },
    )
    assert begun == ["b", "e"]


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: ciclo.train_loop(0, [], {"on_train_stpe": []}), ValueError, "'on_train_stpe'.*valid names"),
        (lambda: ciclo.test_loop(0, [], {"on_train_step": []}), ValueError, "test_loop does not know"),
        (lambda: ciclo.predict_loop(0, [], {"test_step": []}), ValueError, "predict_loop does not know"),
        (
            lambda: ciclo.train_loop(0, [], test_dataset=[1, 2], epoch_duration=1),
            TypeError,
            "zero-argument function",
        ),
        (lambda: ciclo.train_loop(0, [], test_dataset=lambda: [1]), ValueError, "pass epoch_duration"),
        (lambda: ciclo.train_loop(0, [], epoch_duration=-1), ValueError, "epoch_duration must be >= 0"),
        (lambda: ciclo.train_loop(0, [], callbacks=[object()]), ValueError, "has none of the hooks"),
        (lambda: ciclo.train_loop(0, [], callbacks=ciclo.noop), TypeError, "callbacks must be a list"),
        (lambda: ciclo.train_loop(0, [], [1]), TypeError, "tasks must be a dict"),
        (
            lambda: ciclo.train_loop(0, [], epoch_duration=2, test_dataset=lambda: [], test_name=3),
            TypeError,
            "test_name",
        ),
    ],
)
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("run", [ciclo.loop, ciclo.train_loop, ciclo.test_loop, ciclo.predict_loop])
def test_every_loop_takes_the_loop_settings_and_refuses_other_keywords(run):
    tasks = {ciclo.every(1): lambda state: state + 1}
    state, history, elapsed = run(0, range(5), tasks, stop=3, metadata="m", catch_keyboard_interrupt=False)
    assert (state, elapsed.steps) == (3, 3)
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) \['stpo'\].*'stop'.*LoopSettings"):
        run(0, range(5), tasks, stpo=3)


@pytest.mark.parametrize(
    ("call", "name", "value"),
    [
        (lambda: ciclo.train_loop(CounterState(), [1], test_with_ema="yes"), "test_with_ema", "'yes'"),
        (
            lambda: ciclo.train_loop(CounterState(), [1], catch_keyboard_interrupt="no"),
            "catch_keyboard_interrupt",
            "'no'",
        ),
        (
            lambda: ciclo.test_loop(CounterState(), [1], catch_keyboard_interrupt=1),
            "catch_keyboard_interrupt",
            "1",
        ),
        (
            lambda: ciclo.predict_loop(CounterState(), [1], catch_keyboard_interrupt=None),
            "catch_keyboard_interrupt",
            "None",
        ),
        (
            lambda: ciclo.loop(0, [1], {ciclo.every(1): lambda s: s}, catch_keyboard_interrupt=0),
            "catch_keyboard_interrupt",
            "0",
        ),
        (
            lambda: ciclo.inner_loop("test", lambda s: (s, None, None), output_state="yes"),
            "output_state",
            "'yes'",
        ),
    ],
)
def test_boolean_options_take_only_true_or_false(call, name, value):
    # "yes" and "no" are both true: they used to be accepted as True.
    with pytest.raises(TypeError, match=f"^{name} must be True or False, got {value}$"):
        call()


@pytest.mark.parametrize(
    ("run", "protocol"),
    [
        (lambda: ciclo.train_loop({"w": 1}, range(3)), "ciclo.types.Trainable"),
        (lambda: ciclo.test_loop({"w": 1}, range(3)), "ciclo.types.Evaluable"),
        (lambda: ciclo.predict_loop({"w": 1}, range(3)), "ciclo.types.Predictable"),
    ],
)
def test_a_state_without_steps_and_no_tasks_is_refused(run, protocol):
    with pytest.raises(TypeError, match=f"has no step to run.*dict.*{protocol}"):
        run()


def test_user_state_classes_satisfy_the_state_protocols():
    state = CounterState()
    assert isinstance(state, ciclo.types.Trainable)
    assert isinstance(state, ciclo.types.Evaluable)
    assert isinstance(state, ciclo.types.Predictable)
    assert not isinstance({"w": 1}, ciclo.types.Trainable | ciclo.types.Evaluable | ciclo.types.Predictable)


def test_a_plain_state_runs_with_tasks_only():
    state, history, elapsed = ciclo.train_loop({"w": 1}, range(3), {ciclo.every(1): [lambda: None]})
    assert state == {"w": 1} and len(history) == 0 and elapsed.steps == 3


class _Bar:
    """A callback object whose methods are hooks, or ordinary methods no loop mistakes for one."""

    def __init__(self):
        self.batches = 0

    def on_train_batch_end(self, state, batch):
        self.batches += 1

    def update(self): ...

    def reset(self): ...

    def state_dict(self):
        return {}

    def load_state_dict(self, state): ...

    def close(self): ...


def test_ordinary_methods_of_a_callback_object_are_not_taken_for_hooks():
    bar = _Bar()
    ciclo.train_loop(CounterState(), range(3), callbacks=[bar])  # warnings are errors in the tests
    assert bar.batches == 3


@pytest.mark.parametrize(
    ("misspelt", "right"), [("on_epoch_ends", "on_epoch_end"), ("on_epoch_edn", "on_epoch_end")]
)
def test_a_near_miss_of_a_hook_name_on_an_object_with_no_hook_is_refused_naming_the_hook(misspelt, right):
    ran = []
    Missed = type("Missed", (), {misspelt: lambda self, state: ran.append(1)})
    with pytest.raises(
        ValueError, match=rf"has none of the hooks.*{misspelt} is not a hook: rename it {right}"
    ):
        ciclo.train_loop(CounterState(), range(3), callbacks=[Missed()], epoch_duration=1)
    assert ran == []


def test_a_near_miss_beside_a_valid_hook_is_warned_naming_the_hook_before_the_first_step():
    class Both(_Bar):
        def on_train_batch_ends(self, state, batch): ...

    state = CounterState()
    with pytest.warns(
        UserWarning, match=r"on_train_batch_ends, which no loop calls.*rename it on_train_batch_end"
    ):
        ciclo.train_loop(state, range(3), callbacks=[Both()])
    assert [kind for kind, _ in state.log] == ["train"] * 3


@pytest.mark.parametrize(
    ("keras", "right"), [("on_batch_end", "on_train_batch_end"), ("on_batch_begin", "on_train_batch_begin")]
)
def test_a_keras_hook_name_says_the_name_ciclo_calls_it(keras, right):
    Keras = type("Keras", (), {keras: lambda self, state: None})
    with pytest.raises(ValueError, match=rf"has none of the hooks.*{keras} is not a hook: rename it {right}"):
        ciclo.train_loop(CounterState(), range(3), callbacks=[Keras()])
    Both = type("Both", (_Bar,), {keras: lambda self, state: None})
    with pytest.warns(UserWarning, match=rf"{keras}, which no loop calls.*rename it {right}"):
        ciclo.train_loop(CounterState(), range(3), callbacks=[Both()])
    with pytest.raises(
        ValueError, match=rf"named schedule '{keras}'; valid names: .*; did you mean {right}\?"
    ):
        ciclo.train_loop(CounterState(), range(3), {keras: [lambda: None]})


def test_an_object_with_several_hooks_is_one_callback_with_one_lifecycle():
    class Hooks:
        def __init__(self):
            self.events = []

        def on_train_begin(self, state):
            self.events.append("begin")

        def on_train_batch_end(self, state, batch):
            self.events.append("batch")

        def on_end(self, loop_state, error):
            self.events.append("end")

        def state_dict(self):
            return {"events": len(self.events)}

        def load_state_dict(self, state): ...

    hooks = Hooks()
    named, _ = ciclo.hooks.collect(ciclo.hooks.TRAIN, callbacks=[hooks])
    begin, batch_end = named["on_train_begin"], named["on_train_batch_end"]
    assert len(begin) == len(batch_end) == 1 and isinstance(begin[0], ciclo.Callback)
    assert begin[0].owner is batch_end[0].owner  # wrapped once: both hooks live one lifecycle
    ciclo.train_loop(CounterState(), range(2), callbacks=[hooks])
    assert hooks.events == ["begin", "batch", "batch", "end"]


def test_a_built_in_with_several_hooks_declares_them():
    swap = ciclo.swap_ema_weights()
    assert set(swap.hook) == {"on_train_begin", "on_test_begin", "on_test_end"}
    named, _ = ciclo.hooks.collect(ciclo.hooks.TEST, callbacks=[swap])
    assert [len(named[name]) for name in ("on_test_begin", "on_test_end")] == [1, 1]
    assert all(
        callback.owner is swap for name in ("on_test_begin", "on_test_end") for callback in named[name]
    )
    with pytest.raises(
        ValueError, match=r"has none of the hooks.*it runs under on_train_begin or on_test_begin"
    ):
        ciclo.predict_loop(None, [1], {ciclo.hooks.on_predict_step: lambda: None}, callbacks=[swap])


@pytest.mark.parametrize(("dunder", "right"), [("__loop_end__", "on_end"), ("__loop_start__", "on_start")])
def test_a_loop_dunder_other_than_loop_callback_is_refused_before_the_first_step(dunder, right):
    Old = type("Old", (_Bar,), {dunder: lambda self, loop_state: None})
    state = CounterState()
    with pytest.raises(TypeError, match=rf"{dunder}, which no loop calls.*rename it {right}"):
        ciclo.train_loop(state, range(3), callbacks=[Old()])
    assert state.log == []


@pytest.mark.parametrize(("options", "watched"), [({}, False), ({"accumulate_steps": 2}, True)])
def test_train_loop_adds_the_options_watch_only_to_a_state_that_needs_it(monkeypatch, options, watched):
    import optax

    from ciclo import managed
    from ciclo._src.callbacks._training_options import TrainingOptionsWatch

    heard = []
    monkeypatch.setattr(TrainingOptionsWatch, "__loop_callback__", lambda self, loop_state: heard.append(1))

    @managed.train_step
    def train_step(state, batch):
        return ciclo.logs().add_loss("loss", jnp.mean((batch * state.params) ** 2))

    state = managed.ManagedState.create(params=jnp.ones(2), tx=optax.sgd(0.1), **options)
    ciclo.train_loop(state, [jnp.ones(2)] * 4, {ciclo.on_train_step: [train_step]})
    assert bool(heard) == watched  # a state without options: nothing runs for the watch at each step


def test_loops_check_no_ciclo_class_with_isinstance_only_protocols():
    # The loops wire features through callbacks the state or the callback declares, never by testing
    # for a built-in class: an isinstance in loops/ names a builtin type or a protocol of base/types.
    import ast
    from pathlib import Path

    loops = Path(ciclo.__file__).parent / "_src" / "loops"
    found = []
    for path in sorted(loops.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        origin = {
            alias.asname or alias.name: node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ciclo")
            for alias in node.names
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
                classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                for cls in classes:
                    module = origin.get(getattr(cls, "id", ""))
                    if module is not None and module != "ciclo._src.base.types":
                        found.append(f"{path.name}:{node.lineno} {ast.unparse(cls)}")
    assert found == []
