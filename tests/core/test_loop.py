import functools
import inspect
import logging
import os
import signal
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo
from ciclo._src.resume.signals import ForcedInterrupt


def run(tasks, data=range(5), **kwargs):
    return ciclo.loop(0, data, tasks, **kwargs)


@pytest.mark.parametrize("arity", [0, 1, 2, 3, 4])
def test_callbacks_of_every_arity_receive_their_arguments(arity):
    received = []

    def record(*args):
        received.append(args)

    params = ["state", "batch", "elapsed", "loop_state"][:arity]
    namespace: dict = {"record": record}
    exec(
        f"def callback({', '.join(params)}):\n    record({', '.join(params)}{',' if params else ''})",
        namespace,
    )
    ciclo.loop("s", ["b0", "b1"], {ciclo.every(1): [namespace["callback"]]})
    assert len(received) == 2
    assert all(len(args) == arity for args in received)
    if arity >= 2:
        assert [args[1] for args in received] == ["b0", "b1"]
    if arity >= 3:
        assert [args[2].steps for args in received] == [0, 1]
    if arity == 4:
        assert isinstance(received[0][3], ciclo.types.LoopState)


def test_defaults_and_varargs_are_accepted():
    calls = []
    ciclo.loop(0, [1], {ciclo.every(1): [lambda state, batch=None, extra=None: calls.append(batch)]})
    ciclo.loop(0, [1], {ciclo.every(1): [lambda *args: calls.append(len(args))]})
    ciclo.loop(0, [1], {ciclo.every(1): [functools.partial(lambda a, state: calls.append(a), "p")]})
    assert calls == [1, 4, "p"]


@pytest.mark.parametrize(
    ("output", "expected_state", "expected_logs"),
    [
        (None, 0, []),
        (({"metrics": {"m": 1}}, 5), 5, [1]),
        ((None, 5), 5, []),
        (({"metrics": {"m": 1}}, None), 0, [1]),
        ({"metrics": {"m": 1}}, 0, [1]),
        (ciclo.logs().add_metric("m", 1), 0, [1]),
        (7, 7, []),
    ],
)
def test_return_forms(output, expected_state, expected_logs):
    state, history, _ = ciclo.loop(0, [None], {ciclo.every(1): [lambda: output]})
    assert state == expected_state
    assert (history.collect("m") if expected_logs else len(history)) == (expected_logs or 0)


def test_falsy_state_is_kept():
    state, _, _ = ciclo.loop(1, [None], {ciclo.every(1): [lambda: ({}, 0)]})
    assert state == 0


def test_three_tuple_is_a_clear_error():
    def bad():
        return 1, 2, 3

    with pytest.raises(ValueError, match="bad returned a tuple of length 3"):
        ciclo.loop(0, [None], {ciclo.every(1): [bad]})


@pytest.mark.parametrize(
    ("callback", "error", "match"),
    [
        (42, TypeError, "42 of type int is not a callback"),
        ("train_step", TypeError, "'train_step' is a string"),
        (lambda a, b, c, d, e: None, TypeError, "requires 5 positional arguments"),
        (lambda *, key: None, TypeError, "keyword-only argument 'key'"),
    ],
)
def test_bad_callbacks_fail_before_the_loop_runs(callback, error, match):
    consumed = []

    def data():
        consumed.append(True)
        yield 1

    with pytest.raises(error, match=match):
        ciclo.loop(0, data(), {ciclo.every(1): [callback]})
    assert not consumed


def test_unreadable_signature_is_reported(monkeypatch):
    def callback(state):
        return state

    monkeypatch.setattr("inspect.signature", lambda fn: (_ for _ in ()).throw(ValueError("no")))
    with pytest.raises(TypeError, match="cannot read the signature"):
        ciclo.loop(0, [1], {ciclo.every(1): callback})


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"tasks": {"on_train_step": [lambda: None]}}, ValueError, "named schedule 'on_train_step'"),
        ({"tasks": {3: [lambda: None]}}, TypeError, "task key 3"),
        ({"tasks": [lambda: None]}, TypeError, "tasks must be a dict"),
        ({"tasks": {}, "stop": -1}, ValueError, "stop must be >= 0 steps, got -1"),
        ({"tasks": {}, "stop": "10"}, TypeError, "'10'"),
        ({"tasks": {}, "history": []}, TypeError, "history must be a ciclo.types.History"),
        ({"tasks": {}, "elapsed": 3}, TypeError, "elapsed must be a ciclo.types.Elapsed"),
        ({"tasks": {}, "on_start": [1]}, TypeError, "in on_start"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        ciclo.loop(0, range(3), **kwargs)


def test_non_iterable_dataset():
    with pytest.raises(TypeError, match="dataset must be an iterable"):
        ciclo.loop(0, 5, {})  # type: ignore[arg-type]


def test_execution_order_dict_then_list():
    order = []

    def make(name):
        return lambda: order.append(name)

    ciclo.loop(
        0,
        [None],
        {ciclo.every(1): [make("a"), make("b")], ciclo.every(2): [make("c")], ciclo.always(): make("d")},
        on_start=make("start"),
        on_end=[make("end")],
    )
    assert order == ["start", "a", "b", "c", "d", "end"]


def test_state_threads_through_callbacks_and_logs_merge():
    def add(state, batch):
        return ciclo.logs().add_metric("after_add", state + batch), state + batch

    def double(state):
        return {"metrics": {"after_double": state * 2}}, state * 2

    state, history, elapsed = ciclo.loop(1, [1, 2, 3], {ciclo.every(1): [add, double]})
    assert state == 30
    assert history.collect("after_add", "after_double") == ([2, 6, 15], [4, 12, 30])
    assert elapsed.steps == 3


def test_stop_period_and_dataset_end():
    _, _, elapsed = run({}, stop=3)
    assert elapsed.steps == 3
    _, _, elapsed = run({})
    assert elapsed.steps == 5
    _, _, elapsed = run({}, stop=ciclo.at(samples=2))
    assert elapsed.steps == 2


def test_loop_state_stop_and_accumulated_logs():
    seen = []

    def log_at_zero(state, batch, elapsed):
        if elapsed.steps == 0:
            return {"metrics": {"first": 1}}

    def watch(state, batch, elapsed, loop_state: ciclo.types.LoopState):
        seen.append(dict(loop_state.accumulated_logs.get("metrics", {})))
        if loop_state.elapsed.steps == 2:
            loop_state.stop()

    after_stop = []
    _, history, elapsed = run({ciclo.every(1): [log_at_zero, watch, lambda: after_stop.append(1)]})
    assert elapsed.steps == 3
    assert seen == [{"first": 1}] * 3
    assert len(after_stop) == 2  # not run at the step that stopped
    assert len(history) == 1


def test_history_and_elapsed_resume():
    history = ciclo.history()

    def step(state):
        return ciclo.logs().add_metric("x", state), state + 1

    state, history, elapsed = ciclo.loop(0, range(10), {ciclo.every(1): step}, stop=3, history=history)
    state, history, elapsed = ciclo.loop(
        state, range(10), {ciclo.every(1): step}, stop=5, history=history, elapsed=elapsed
    )
    assert history.collect("steps", "x") == ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4])
    assert elapsed.steps == 5


def test_metadata_reaches_callbacks():
    seen = []
    ciclo.loop(0, [1], {ciclo.every(1): lambda loop_state: None}, metadata="m")
    ciclo.loop(
        0, [1], {ciclo.every(1): lambda s, b, e, loop_state: seen.append(loop_state.metadata)}, metadata="m"
    )
    assert seen == ["m"]


def test_loop_callback_objects_and_end_hooks():
    class Counter:
        def __init__(self):
            self.calls = 0
            self.ended = 0

        def __loop_callback__(self, loop_state):
            self.calls += 1
            return {"metrics": {"calls": self.calls}}, loop_state.state

        def on_end(self, loop_state, error):
            self.ended += 1
            self.error = error

    counter = Counter()
    assert isinstance(counter, ciclo.types.LoopCallback)
    _, history, _ = ciclo.loop(0, range(4), {ciclo.every(1): [counter], ciclo.every(2): [counter]})
    assert counter.calls == 6 and counter.ended == 1
    assert counter.error is None  # the loop ended by itself
    assert history.collect("calls") == [2, 3, 5, 6]


def test_end_hooks_run_for_bound_method_owners_even_on_error():
    class Owner:
        ended = False

        def hook(self, state):
            raise RuntimeError("boom")

        def on_end(self, loop_state, error):
            Owner.ended = error

    with pytest.raises(RuntimeError, match="boom") as info:
        ciclo.loop(0, range(3), {ciclo.every(1): [Owner().hook]})
    assert Owner.ended is info.value  # the hook sees what ended the loop
    assert any("Owner.hook" in note and "step 0" in note for note in info.value.__notes__)


def test_keyboard_interrupt_is_caught_and_state_returned(caplog):
    # Ctrl-C is a stop request: the step in flight finishes, and the loop returns.
    def step(state, batch):
        if batch == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return state + 1

    with caplog.at_level(logging.WARNING, logger="ciclo"):
        state, _, elapsed = ciclo.loop(0, range(10), {ciclo.every(1): step})
    assert state == 4 and elapsed.steps == 4
    assert "KeyboardInterrupt: loop stopped at step 4" in caplog.text
    with pytest.raises(KeyboardInterrupt):
        ciclo.loop(0, range(10), {ciclo.every(1): step}, catch_keyboard_interrupt=False)


def test_a_keyboard_interrupt_raised_by_code_is_not_taken_for_ctrl_c():
    # Changed in Core v5: no on_end takes an error; only a Ctrl-C (the signal) is a stop request.
    def step(state, batch):
        if batch == 3:
            raise KeyboardInterrupt
        return state + 1

    with pytest.raises(KeyboardInterrupt):
        ciclo.loop(0, range(10), {ciclo.every(1): step})
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_catching_ctrl_c_adds_a_step_end_hook_only_once_ctrl_c_arrives():
    # The guard costs no call per step: the first Ctrl-C (a stop request) adds the hook that ends the loop.
    hooks, steps = [], []

    def probe(state, elapsed, loop_state):
        hooks.append(len(loop_state._step_end))
        steps.append(elapsed.steps)
        if elapsed.steps == 2:
            os.kill(os.getpid(), signal.SIGINT)
            hooks.append(len(loop_state._step_end))
        return state + 1

    state, _, elapsed = ciclo.loop(0, range(10), {ciclo.every(1): probe})
    assert hooks == [0, 0, 0, 1] and steps == [0, 1, 2]
    assert state == elapsed.steps == 3
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_raises_forced_interrupt_at_once():
    seen = []

    def step(state, elapsed):
        seen.append(elapsed.steps)
        if elapsed.steps == 2:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            seen.append("not reached")
        return state + 1

    with pytest.raises(ForcedInterrupt):
        ciclo.loop(0, range(10), {ciclo.every(1): step})
    assert seen == [0, 1, 2]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@jax.jit
def slow_step(state, batch):
    # ~tens of ms of device work per step, so an unwanted wait on the device shows.
    x = jax.lax.fori_loop(0, 40, lambda i, x: jnp.tanh(x @ x.T @ x * 1e-3), state)
    return ciclo.logs().add_metric("corner", x[0, 0]).add_loss("mean", x.mean()), x


def test_loop_returns_before_the_device_finishes():
    # JAX dispatches asynchronously (also on CPU): if the loop, its logs merging or the
    # history read a logged value or blocked at any step, the last step would be done.
    state = jnp.full((256, 256), 0.01)
    slow_step(state, None)[1].block_until_ready()  # compile outside the measured loop
    state, history, elapsed = ciclo.loop(state, range(4), {ciclo.every(1): [slow_step]})
    assert not state.is_ready()
    assert elapsed.steps == 4 and len(history) == 4
    assert history.collect("corner")[-1] == pytest.approx(float(state[0, 0]))


class Tripwire:
    """A logged value that fails the test if anything tries to read it."""

    def _read(self, *args, **kwargs):
        raise AssertionError("a logged value was read")

    __array__ = __float__ = __int__ = __bool__ = __index__ = __format__ = _read
    item = tolist = block_until_ready = copy_to_host_async = _read


def test_loop_never_reads_logged_values():
    def step(state, batch):
        return ciclo.logs().add_metric("value", Tripwire()).add_loss("loss", Tripwire()), state + 1

    state, history, elapsed = ciclo.loop(0, range(50), {ciclo.every(1): [step], ciclo.every(5): [step]})
    assert state == 60 and len(history) == 50


def test_jitted_step_with_elapsed_argument():
    @jax.jit
    def step(state, batch, elapsed):
        return state + elapsed.steps

    state, _, _ = ciclo.loop(jnp.int32(0), range(5), {ciclo.every(1): [step]})
    assert int(state) == 10


def test_clu_periodic_action_is_adapted(monkeypatch):
    # ciclo looks clu up in sys.modules only; a stand-in module exercises the same path.
    module = types.ModuleType("clu.periodic_actions")

    class PeriodicAction:
        def __init__(self):
            self.steps = []

        def __call__(self, step, t=None):
            self.steps.append(step)
            return True

    module.PeriodicAction = PeriodicAction  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "clu.periodic_actions", module)
    action = PeriodicAction()
    ciclo.loop(0, range(3), {ciclo.every(1): [action]})
    assert action.steps == [0, 1, 2]


def test_numpy_state_and_arrays():
    state, _, _ = ciclo.loop(np.zeros(2), range(3), {ciclo.every(1): lambda state, batch: state + batch})
    assert state.tolist() == [3.0, 3.0]


def test_the_loop_never_changes_logs_a_callback_returned():
    constant = ciclo.logs().add_metric("a", 1.0)

    def first(state):
        return constant

    def second(state, batch):
        return ciclo.logs().add_metric("b", float(batch))

    def reader(state, batch, elapsed, loop_state):
        loop_state.logs.add_metric("c", 3.0)  # the step's logs, changed in place

    _, history, _ = ciclo.loop(None, [1, 2], {ciclo.every(1): [first, second, reader]})
    assert constant == {"metrics": {"a": 1.0}}
    assert history.collect("a", "b", "c") == ([1.0, 1.0], [1.0, 2.0], [3.0, 3.0])
    _, history, _ = ciclo.loop(None, [1, 2], {ciclo.every(1): [first, reader]})
    assert constant == {"metrics": {"a": 1.0}}
    assert history.collect("a", "c") == ([1.0, 1.0], [3.0, 3.0])


def test_a_function_gets_its_arguments_by_parameter_name():
    seen = []

    def by_name(elapsed, logs, loop_state, batch, state):
        seen.append((elapsed.steps, dict(logs), type(loop_state).__name__, batch, state))

    def only_elapsed(elapsed):  # was handed the state: the first positional value
        return ciclo.logs().add_metric("seen_steps", elapsed.steps)

    state, history, _ = ciclo.loop(7, [10, 11], {ciclo.every(1): [only_elapsed, by_name]})
    assert history.collect("seen_steps") == [0, 1]
    assert seen[1][0] == 1 and seen[1][2:] == ("LoopState", 11, 7)
    assert seen[1][1] == {"metrics": {"seen_steps": 1}}


def test_other_names_are_passed_by_position_as_in_ciclo_0_1():
    def train_step(params, data):
        return None, params + data

    assert ciclo.loop(0, [1, 2], {ciclo.every(1): [train_step]})[0] == 3


def test_a_known_name_in_another_position_is_refused_before_the_first_step():
    def misnamed(params, elapsed):  # positionally, `elapsed` would get the batch
        raise AssertionError("never called")

    with pytest.raises(TypeError, match=r"takes 'elapsed' as argument 2, where the loop passes 'batch'"):
        ciclo.loop(0, [1], {ciclo.every(1): [misnamed]})


@pytest.mark.parametrize(
    ("name", "right"),
    [("__loop_end__", "on_end"), ("__loop_callbak__", "__loop_callback__"), ("__loop_x__", "")],
)
def test_a_loop_dunder_that_no_loop_calls_is_refused_before_the_first_step(name, right):
    steps = []
    Old = type("Old", (), {"__call__": lambda self, state: steps.append(state), name: lambda self, *a: None})
    with pytest.raises(TypeError, match=rf"{name}, which no loop calls.*{right}"):
        ciclo.loop(0, range(3), {ciclo.every(1): [Old()]})
    with pytest.raises(TypeError, match=rf"{name}, which no loop calls"):
        ciclo.loop(0, range(3), {ciclo.every(1): [lambda state: state]}, on_end=Old())
    assert steps == []


def test_a_near_miss_of_on_end_on_a_loop_callback_object_is_warned():
    class Closer:
        def __loop_callback__(self, loop_state):
            return None

        def on_ends(self, loop_state, error): ...

    with pytest.warns(
        UserWarning, match=r"Closer.* has a method on_ends, which no loop calls.*rename it on_end"
    ):
        ciclo.loop(0, range(2), {ciclo.every(1): [Closer()]})


def test_no_class_of_ciclo_has_a_method_taken_for_a_misspelt_hook():
    from ciclo._src.engine.door import misnamed_methods

    classes = [value for value in vars(ciclo.types).values() if isinstance(value, type)]
    assert len(classes) > 30
    assert {cls.__name__: misnamed_methods(cls) for cls in classes} == {cls.__name__: () for cls in classes}


# --- the one callback type: ciclo.Callback and its lifecycle ---------------------------------------------


class Recorder(ciclo.Callback):
    def __init__(self):
        self.events = []

    def __loop_callback__(self, loop_state):
        self.events.append(("call", loop_state.elapsed.steps))

    def on_start(self, loop_state):
        self.events.append(("start", loop_state.elapsed.steps))

    def on_step_end(self, loop_state):
        self.events.append(("step_end", loop_state.elapsed.steps))  # the counts after the step

    def on_end(self, loop_state, error):
        self.events.append(("end", loop_state.elapsed.steps, error))


class RecorderObject:  # the same lifecycle, without subclassing ciclo.Callback
    __init__ = Recorder.__init__
    __loop_callback__ = Recorder.__loop_callback__
    on_start, on_step_end, on_end = Recorder.on_start, Recorder.on_step_end, Recorder.on_end


def test_a_callback_lives_start_steps_end():
    recorder = Recorder()
    ciclo.loop(0, range(5), {ciclo.every(2): recorder}, stop=3)
    assert recorder.events == [
        ("start", 0),
        ("call", 0),
        ("step_end", 1),
        ("step_end", 2),
        ("call", 2),
        ("step_end", 3),
        ("end", 3, None),
    ]


def test_lifecycle_methods_are_found_nominally():
    class Anything(ciclo.Callback):
        """Answers every attribute: a `hasattr` probe would take it for a lifecycle method."""

        def __getattr__(self, name):
            return lambda *args: pytest.fail(f"{name} called")

        def __loop_callback__(self, loop_state):
            return None

    ciclo.loop(0, range(3), {ciclo.every(1): Anything()})


def test_an_on_end_sees_the_error_which_goes_on_whatever_it_returns():
    # Changed in Core v5: `on_end` returns None; returning True no longer takes the error.
    seen = []

    class Forgive(ciclo.Callback):
        def on_end(self, loop_state, error):
            seen.append((error, loop_state.elapsed.steps))
            return True

    def fail(state, batch):
        if batch == 2:
            raise ValueError("boom")
        return state + 1

    with pytest.raises(ValueError, match="boom") as raised:
        ciclo.run_phases(
            0, range(5), [ciclo.types.Phase("p", [(ciclo.every(1), fail)])], callbacks=[Forgive()]
        )
    assert seen == [(raised.value, 2)]


@pytest.mark.parametrize("subclass", [True, False], ids=["Callback", "user's object"])
def test_a_callback_in_callbacks_and_in_a_task_lives_once(subclass):
    recorder = Recorder() if subclass else RecorderObject()
    ciclo.run_phases(
        0, range(2), [ciclo.types.Phase("p", [(ciclo.every(1), recorder)])], callbacks=[recorder]
    )
    assert [event[0] for event in recorder.events] == ["start", "call", "step_end", "call", "step_end", "end"]


def test_a_callback_whose_on_start_fails_leaves_the_started_ones_ended():
    started = Recorder()

    class Refuse(ciclo.Callback):
        def on_start(self, loop_state):
            raise ValueError("refused")

    never = Recorder()
    with pytest.raises(ValueError, match="refused"):
        ciclo.run_phases(
            0, range(3), [ciclo.types.Phase("p", [(ciclo.every(1), never)])], callbacks=[started, Refuse()]
        )
    assert [event[0] for event in started.events] == ["start", "end"]
    assert never.events == []  # its on_start never ran: nothing to end


def test_run_phases_takes_no_survival_keywords():
    parameters = set(inspect.signature(ciclo.run_phases).parameters)
    assert not parameters & {
        "backup",
        "backup_every",
        "kind",
        "catch_keyboard_interrupt",
        "on_start",
        "on_end",
    }
