"""A catalogue of wrong usages: each gets, before any long work, an error or a warning naming the fix.

Each case is `(description, wrong usage, expected exception or warning type,
regex, at_most)`. The regex is matched against the message and its notes; it
names the problem and what to do. `at_most` bounds how many steps ran before
the error (0: refused before the first step). Every case runs in a thread
with a hard timeout, so a usage that hangs fails instead of blocking the
suite. Each row of docs/bad_inputs.md is the case of its name (its mistake cell),
whose message must say each of the row's quotes (tests/support/bad_inputs_page.py).
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import warnings
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support import bad_inputs_page as page
from support.training import LinearClassifier

import ciclo

TIMEOUT = 120.0  # seconds: generous on a loaded machine; a hang fails the case

ran: list[int] = []  # steps that ran in the current case


def step(state: int, batch: Any) -> tuple[ciclo.types.Logs, int]:
    ran.append(1)
    return ciclo.logs().add_metric("x", 1.0), state + 1


def dict_step(state: dict[str, int], batch: Any) -> tuple[ciclo.types.Logs, dict[str, int]]:
    ran.append(1)
    return ciclo.logs().add_metric("x", 1.0), {"n": state["n"] + 1}


def evaluate(state: Any, batch: Any) -> ciclo.types.Logs:
    return ciclo.logs().add_metric("t", batch)


TRAIN = {ciclo.on_train_step: step, ciclo.on_test_step: evaluate}


def loop(tasks: Any = None, **kwargs: Any) -> Any:
    kwargs.setdefault("dataset", range(5))
    return ciclo.loop(0, kwargs.pop("dataset"), {ciclo.every(1): step} if tasks is None else tasks, **kwargs)


def loop_dict_state(*callbacks: Callable[..., Any]) -> Any:
    return ciclo.loop({"n": 0}, range(5), {ciclo.every(1): [dict_step, *callbacks]})


def train(**kwargs: Any) -> Any:
    kwargs.setdefault("dataset", range(6))
    return ciclo.train_loop(0, kwargs.pop("dataset"), kwargs.pop("tasks", TRAIN), **kwargs)


def failing_dataset() -> Any:
    yield 1
    yield 2
    raise OSError("cannot read shard 3")


def shared_test_generator() -> Any:
    batches = iter([1.0, 2.0])
    return train(test_dataset=lambda: batches, epoch_duration=2)


def f(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, named `f` in messages, as the page's quotes name a user's function."""
    fn.__qualname__ = "f"
    return fn


class Obj:
    def __repr__(self) -> str:
        return "obj"  # as the page's quotes name a user's object


class NoHooks(Obj):
    pass


class MisspeltHook(Obj):
    def on_epoch_ends(self, state: Any) -> None: ...


class KerasHook(Obj):
    def on_batch_end(self, state: Any, batch: Any) -> None: ...


class MisspeltBesideAHook(Obj):
    def on_train_batch_end(self, state: Any, batch: Any) -> None: ...

    def on_train_ends(self, state: Any) -> None: ...


class OldLoopEnd(Obj):
    def __loop_callback__(self, loop_state: Any) -> None: ...

    def __loop_end__(self, loop_state: Any) -> None: ...


def model_state(inputs: Any = None, **kwargs: Any) -> ciclo.types.ModelState:
    return ciclo.create_model_state(
        LinearClassifier(),
        inputs=jnp.zeros((1, 8)) if inputs is None else inputs,
        tx=kwargs.pop("tx", optax.sgd(0.1)),
        losses=kwargs.pop("losses", {"loss": optax.softmax_cross_entropy_with_integer_labels}),
        **kwargs,
    )


X = np.ones((4, 8), np.float32)
Y = np.array([0, 1, 2, 0], np.int32)


def saved(tmp_path: Any) -> Any:
    checkpoint = ciclo.checkpoint(tmp_path / "ck")
    checkpoint.save(1, model_state())
    checkpoint.wait()
    return tmp_path / "ck"


def backup_of_another_model(tmp_path: Any) -> Any:
    tasks = {ciclo.every(1): lambda state, batch: state.train_step(batch)}
    ciclo.loop(model_state(), [(X, Y)] * 3, tasks, backup=tmp_path / "bk")
    other = model_state(inputs=jnp.zeros((1, 5)))
    return ciclo.loop(other, [(np.ones((4, 5), np.float32), Y)] * 3, tasks, backup=tmp_path / "bk")


def unwritable(tmp_path: Any) -> Any:
    if os.geteuid() == 0:
        pytest.skip(
            "running as root, which writes to a directory without write permission: no refusal to see"
        )
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    return ciclo.checkpoint(locked / "ck")


def not_an_export(tmp_path: Any) -> Any:
    pytest.importorskip("flatbuffers")  # jax.export's, the export extra
    (tmp_path / "model.jax").write_text('{"params": [1, 2, 3]}')
    return ciclo.load_exported(tmp_path / "model.jax")


def a_fifo(tmp_path: Any) -> Any:
    pytest.importorskip("flatbuffers")
    os.mkfifo(tmp_path / "pipe")
    return ciclo.load_exported(tmp_path / "pipe")


class PredictionsOnly(LinearClassifier):
    def apply(self, *args: Any, **kwargs: Any) -> Any:
        return super().apply(*args, **kwargs)[0]


def file_path(tmp_path: Any) -> str:
    path = tmp_path / "a_file"
    path.write_text("not a directory")
    return str(path)


CASES: list[tuple[str, Callable[[Any], Any], type, str, int | None]] = [
    # loop and stop
    ("`stop=0`", lambda p: loop(stop=0), ValueError, r"stop=0 would run no step.*stop=None", 0),
    ("`stop=-1`", lambda p: loop(stop=-1), ValueError, r"stop must be >= 0 steps, got -1: pass a count", 0),
    ("train_loop stop=-1", lambda p: train(dataset=[1], stop=-1), ValueError, r"stop must be >= 0 steps", 0),
    (
        '`stop="10"`',
        lambda p: loop(stop="10"),
        TypeError,
        r"got '10'; pass the int stop=10, not the string",
        0,
    ),
    (
        "`stop=1.5`",
        lambda p: loop(stop=1.5),
        TypeError,
        r"stop must be an int .* got 1.5; pass a count of steps",
        0,
    ),
    (
        "`tasks` as a list",
        lambda p: ciclo.loop(0, range(3), [step]),
        TypeError,
        r"tasks must be a dict of schedule",
        0,
    ),
    (
        "a dataset that is not iterable",
        lambda p: loop(dataset=42),
        TypeError,
        r"dataset must be an iterable of batches",
        0,
    ),
    (
        "the whole arrays `(X, Y)` (or one batch, or a dict of arrays) as the dataset",
        lambda p: ciclo.train_loop(model_state(), (X, Y)),
        TypeError,
        r"the dataset is a tuple of 2 arrays with one leading size \(float32\[4, 8\], int32\[4\]\).*"
        r"ciclo.batches\(\(X, Y\), batch_size=32\)",
        0,
    ),
    (
        "a named schedule in `ciclo.loop`",
        lambda p: loop({ciclo.on_train_step: step}),
        ValueError,
        r"only understood by ciclo.train_loop.*such as ciclo.every\(1\)",
        0,
    ),
    ("`history={}`", lambda p: loop(history={}), TypeError, r"history must be a ciclo.types.History", 0),
    ("`elapsed=5`", lambda p: loop(elapsed=5), TypeError, r"elapsed must be a ciclo.types.Elapsed", 0),
    (
        "an empty dataset",
        lambda p: loop(dataset=[]),
        ciclo.types.DataWarning,
        r"yielded no batch.*create a fresh one",
        0,
    ),
    (
        "a dataset that raises midway",
        lambda p: loop(dataset=failing_dataset()),
        OSError,
        r"cannot read shard 3[\s\S]*raised by the dataset when the loop asked for the batch of step 2",
        2,
    ),
    (
        "the same with `prefetch=3`",
        lambda p: train(tasks={ciclo.on_train_step: step}, dataset=failing_dataset(), prefetch=3),
        OSError,
        r"cannot read shard 3[\s\S]*raised by the dataset when the loop asked for the batch of step 2",
        2,
    ),
    (
        'a batch leaf no device holds, with `prefetch=` (`{"x": x, "name": "abc"}`)',
        lambda p: train(
            tasks={ciclo.on_train_step: step},
            dataset=[{"x": X}] * 3 + [{"x": X, "name": "abc"}],
            prefetch=2,
        ),
        TypeError,
        r"cannot put batch 3 .* its leaf \['name'\] is a str \('abc'\), not a number or an array of numbers"
        r"[\s\S]*the batch of step 3",
        3,
    ),
    (
        "a dataset that ends before `stop`",
        lambda p: loop(dataset=range(3), stop=10),
        ciclo.types.DataWarning,
        r"dataset ended after 3 steps, before stop=10.*longer or repeating dataset.*or a smaller stop",
        3,
    ),
    # schedules
    (
        "`every(0)`, `every(-5)`",
        lambda p: ciclo.every(0),
        ValueError,
        r"every\(steps=0\): the interval must be a positive int",
        0,
    ),
    ("every(-5)", lambda p: ciclo.every(-5), ValueError, r"positive int, such as every\(steps=1\)", 0),
    (
        '`every(steps=1.5)`, `every("10")`',
        lambda p: ciclo.every(steps=1.5),
        TypeError,
        r"positive int number of steps, such as",
        0,
    ),
    (
        "every('10')",
        lambda p: ciclo.every("10"),
        TypeError,
        r"every\(steps='10'\).*such as every\(steps=10\)",
        0,
    ),
    (
        "`every()`",
        lambda p: ciclo.every(),
        ValueError,
        r"every\(\) needs one of steps=, samples= or time=",
        0,
    ),
    ("`every(time=0)`", lambda p: ciclo.every(time=0), ValueError, r"positive, such as every\(time=60\)", 0),
    (
        "`at_step_end(5)`, `every(2) & 5`",
        lambda p: ciclo.at_step_end(5),
        TypeError,
        r"a schedule must be callable as schedule\(elapsed\) -> bool, got 5",
        0,
    ),
    ("schedule & 5", lambda p: ciclo.every(2) & 5, TypeError, r"a schedule must be callable", 0),
    (
        "`piecewise(s, {None: s2})`",
        lambda p: ciclo.piecewise(ciclo.every(1), {None: ciclo.every(2)}),
        TypeError,
        r"a piecewise key must be an int \(steps\) or a ciclo.types.Period, got None",
        0,
    ),
    # callbacks
    (
        "a callback with 5 required arguments",
        lambda p: loop({ciclo.every(1): f(lambda a, b, c, d, e: None)}),
        TypeError,
        r"requires 5 positional arguments, but the loop passes at most 4: state, batch, elapsed, loop_state",
        0,
    ),
    (
        "a required keyword-only argument",
        lambda p: loop({ciclo.every(1): f(lambda state, *, lr: state)}),
        TypeError,
        r"required keyword-only argument 'lr'; the loop passes only positional",
        0,
    ),
    (
        "a callback that is not callable (`42`)",
        lambda p: loop({ciclo.every(1): 42}),
        TypeError,
        r"is not a callback: pass a callable",
        0,
    ),
    (
        "returning a 3-tuple",
        lambda p: loop({ciclo.every(1): [step, f(lambda state: (None, state, 1))]}),
        ValueError,
        r"returned a tuple of length 3; a step or callback returns \(logs, state\)",
        1,
    ),
    (
        "callback returning an int for a dict state",
        lambda p: loop_dict_state(lambda state: 3),
        TypeError,
        r"returned 3 of type int where the loop expects the state \(dict\).*or None to keep the state",
        1,
    ),
    (
        "returning `3`, `0.5` or a list for a dict state",
        lambda p: loop_dict_state(f(lambda state: 0.5)),
        TypeError,
        r"f returned 0.5 of type float where the loop expects the state"
        r"[\s\S]*raised by callback f at step 0",
        1,
    ),
    (
        "callback returning a list for a dict state",
        lambda p: loop_dict_state(lambda state: [1, 2]),
        TypeError,
        r"returned \[1, 2\] of type list where the loop expects the state",
        1,
    ),
    (
        "a step returning `(state, logs)`",
        lambda p: loop(
            {ciclo.every(1): f(lambda state, batch: (state + 1, ciclo.logs().add_metric("x", batch)))}
        ),
        TypeError,
        r"it looks like \(state, logs\): swap them to return \(logs, state\)",
        0,
    ),
    (
        "dict state returned (state, logs) swapped",
        lambda p: ciclo.loop(
            {"n": 0}, range(3), {ciclo.every(1): lambda s, b: (s, ciclo.logs().add_metric("x", b))}
        ),
        TypeError,
        r"swap them to return \(logs, state\)",
        0,
    ),
    (
        'flat logs `{"loss": 1.0}`',
        lambda p: loop({ciclo.every(1): f(lambda state, batch: ({"loss": 1.0}, state))}),
        TypeError,
        r"collection 'loss' holds 1.0; logs map collection -> \{entry: value\}",
        0,
    ),
    (
        "a string as a metric or loss",
        lambda p: loop({ciclo.every(1): lambda state, batch: (ciclo.logs().add_metric("note", "ok"), state)}),
        TypeError,
        r"metrics.note is the str 'ok': metrics and losses must be numbers or arrays.*add_output",
        0,
    ),
    (
        "dict logs holding a string",
        lambda p: loop({ciclo.every(1): lambda state, batch: ({"losses": {"loss": "0.1"}}, state)}),
        TypeError,
        r"logged the str '0.1' as losses.loss; metrics and losses must be numbers or arrays",
        0,
    ),
    (
        'a dict as a metric or loss (`{"metrics": {"per": {"a": 1.0}}}`), which no bar or logger would show',
        lambda p: loop({ciclo.every(1): f(lambda state, batch: ({"metrics": {"per": {"a": 1.0}}}, state))}),
        TypeError,
        r"logged the dict \{'a': 1.0\} as metrics.per; metrics and losses must be numbers or arrays "
        r"\(log each of the dict's values as an entry of its own, e.g. add_metric\('per/key', value\)\)",
        0,
    ),
    (
        "a dict as a metric",
        lambda p: ciclo.logs().add_metric("per", {"a": 1.0}),
        TypeError,
        r"metrics.per is the dict \{'a': 1.0\}: metrics and losses must be numbers or arrays",
        0,
    ),
    (
        "an unknown named schedule",
        lambda p: train(tasks={"on_train_stp": step}),
        ValueError,
        r"train_loop does not know the named schedule 'on_train_stp'; valid names: on_train_step",
        0,
    ),
    (
        "`callbacks=[obj]` with no hook",
        lambda p: train(tasks={ciclo.on_train_step: step}, callbacks=[NoHooks()]),
        ValueError,
        r"has none of the hooks this loop runs.*put it in the tasks dict under a schedule",
        0,
    ),
    (
        "`callbacks=[obj]` whose only hook is misspelt (`on_epoch_ends`)",
        lambda p: train(tasks={ciclo.on_train_step: step}, callbacks=[MisspeltHook()], epoch_duration=2),
        ValueError,
        r"has none of the hooks this loop runs.*on_epoch_ends is not a hook: rename it on_epoch_end",
        0,
    ),
    (
        "a Keras hook name (`on_batch_end`, `on_batch_begin`)",
        lambda p: train(tasks={ciclo.on_train_step: step}, callbacks=[KerasHook()]),
        ValueError,
        r"on_batch_end is not a hook: rename it on_train_batch_end",
        0,
    ),
    (
        "a misspelt hook beside real ones (`on_train_ends`)",
        lambda p: train(tasks={ciclo.on_train_step: step}, callbacks=[MisspeltBesideAHook()]),
        UserWarning,
        r"has a method on_train_ends, which no loop calls: rename it on_train_end",
        None,
    ),
    (
        "a `__loop_*__` method other than `__loop_callback__` (`__loop_end__`)",
        lambda p: loop({ciclo.every(1): [step, OldLoopEnd()]}),
        TypeError,
        r"has a method __loop_end__, which no loop calls: rename it on_end",
        0,
    ),
    ("`keras_bar(total=0)`", lambda p: ciclo.keras_bar(total=0), ValueError, r"total must be > 0", 0),
    ("`ciclo.fuse(42)`", lambda p: ciclo.fuse(42), TypeError, r"fuse takes a step function", 0),
    ('`fuse(step, donate="yes")`', lambda p: ciclo.fuse(step, donate="yes"), TypeError, r"donate must be", 0),
    (
        '`throughput(peak_flops=float("inf"))`',
        lambda p: ciclo.throughput(peak_flops=float("inf")),
        ValueError,
        r"peak_flops must be a positive number, finite .* got inf",
        0,
    ),
    ("nothing to train", lambda p: train(tasks={}), TypeError, r"train_loop has no step to run", 0),
    # train_loop: epochs and test data
    (
        "`epoch_duration=0`",
        lambda p: train(epoch_duration=0, test_dataset=lambda: [1.0]),
        ValueError,
        r"epoch_duration is zero.*pass the number of steps per epoch",
        0,
    ),
    (
        "`test_duration=0`",
        lambda p: train(epoch_duration=2, test_dataset=lambda: [1.0], test_duration=0),
        ValueError,
        r"test_duration is zero.*test_duration=None",
        0,
    ),
    (
        "`test_dataset=[...]` (not callable)",
        lambda p: train(epoch_duration=2, test_dataset=[1.0, 2.0]),
        TypeError,
        r"test_dataset must be a zero-argument function.*lambda",
        0,
    ),
    (
        "`test_dataset` without `epoch_duration`",
        lambda p: train(test_dataset=lambda: [1.0]),
        ValueError,
        r"run at the end of each epoch: pass epoch_duration",
        0,
    ),
    (
        "`test_dataset` returning one shared generator",
        lambda p: shared_test_generator(),
        ValueError,
        r"returned the same iterator as for the previous test pass.*fresh iterable each call",
        4,
    ),
    (
        "`test_dataset=lambda: itertools.cycle(batches)`",
        lambda p: train(epoch_duration=2, test_dataset=lambda: itertools.cycle([1.0, 2.0])),
        ValueError,
        r"endless itertools.cycle: the test pass would never end.*test_duration=N",
        2,
    ),
    (
        "test_dataset=lambda: itertools.repeat(batch)",
        lambda p: train(epoch_duration=2, test_dataset=lambda: itertools.repeat(1.0)),
        ValueError,
        r"endless itertools.repeat.*test_duration=N",
        2,
    ),
    (
        "an empty test set",
        lambda p: train(epoch_duration=2, test_dataset=lambda: []),
        ciclo.types.DataWarning,
        r"a test pass yielded no batch.*return the test batches",
        6,
    ),
    (
        '`steps_per_execution=0`, `"Auto"`',
        lambda p: train(steps_per_execution=0),
        ValueError,
        r"steps_per_execution must be an int >= 1",
        0,
    ),
    ("`test_name=5`", lambda p: train(test_name=5), TypeError, r"test_name must be a string", 0),
    # a monitored key that is never logged: an error at the first check, listing what is logged
    (
        '`early_stopping("accuracy")`, not logged',
        lambda p: train(epoch_duration=2, callbacks=[ciclo.early_stopping("accuracy")]),
        KeyError,
        r"monitors 'accuracy', which is not in the logs; present: \['metrics.x'\]",
        2,
    ),
    (
        '`checkpoint(dir, monitor="accuracy")`',
        lambda p: train(epoch_duration=2, callbacks=[ciclo.checkpoint(p / "ck", monitor="accuracy")]),
        KeyError,
        r"monitor 'accuracy' not found in the logs at step 2; present: \['metrics.x'\]",
        2,
    ),
    (
        '`terminate_on_nan("loss")`',
        lambda p: loop({ciclo.every(1): [step, ciclo.terminate_on_nan("loss", check_every=3)]}),
        KeyError,
        r"monitors \['loss'\], none of which was logged in 3 steps; present now: \['metrics.x'\]",
        3,
    ),
    (
        '`early_stopping(mode="maximize")`',
        lambda p: ciclo.early_stopping("acc", mode="maximize"),
        ValueError,
        r"mode must be 'auto', 'min' or 'max'",
        0,
    ),
    (
        "`early_stopping(patience=-1)`",
        lambda p: ciclo.early_stopping("loss", patience=-1),
        ValueError,
        r"patience must be an int >= 0",
        0,
    ),
    # checkpoints and backups
    (
        "a checkpoint or backup directory under a file",
        lambda p: ciclo.checkpoint(os.path.join(file_path(p), "ck")),
        NotADirectoryError,
        r"checkpoint directory .* cannot be created: .*a_file is a file.*directory you can write to",
        0,
    ),
    (
        "checkpoint directory that is a file",
        lambda p: ciclo.checkpoint(file_path(p)),
        NotADirectoryError,
        r"checkpoint directory .*a_file is a file, not a directory; pass a path",
        0,
    ),
    (
        "backup directory under a file",
        lambda p: loop(backup=os.path.join(file_path(p), "bk")),
        NotADirectoryError,
        r"backup directory .* cannot be created: .*a_file is a file",
        0,
    ),
    (
        "`checkpoint(keep=0)`",
        lambda p: ciclo.checkpoint(p / "ck", keep=0),
        ValueError,
        r"keep must be an int >= 1 \(or None",
        0,
    ),
    (
        "`backup(keep=1)`",
        lambda p: ciclo.backup(p / "bk", keep=1),
        ValueError,
        r"keep must be an int >= 2",
        0,
    ),
    (
        "`restore_checkpoint` of a missing directory",
        lambda p: ciclo.restore_checkpoint(p / "missing", {"w": jnp.zeros(3)}),
        FileNotFoundError,
        r"checkpoint directory .*missing does not exist",
        0,
    ),
    (
        "a directory without write permission",
        lambda p: unwritable(p),
        PermissionError,
        r"is not writable by this process; pass a path to a directory",
        0,
    ),
    (
        "restoring a checkpoint into another shape",
        lambda p: ciclo.restore_checkpoint(saved(p), model_state(inputs=jnp.zeros((1, 5)))),
        ValueError,
        r"params/w: the checkpoint holds shape \(8, 3\) float32, the target has shape \(5, 3\)",
        0,
    ),
    (
        "... into another structure",
        lambda p: ciclo.restore_checkpoint(saved(p), {"a": jnp.zeros(3)}),
        ValueError,
        r"\n  a: in the target .* but not in the checkpoint",
        0,
    ),
    (
        "a backup directory of another model",
        lambda p: backup_of_another_model(p),
        ValueError,
        r"the backup at step 3 in .* does not match the target state[\s\S]*another directory",
        None,
    ),
    # managed states and strategies
    (
        "`inputs=(1, 8)` to `create_model_state` or `create_flax_state`",
        lambda p: model_state(inputs=(1, 8)),
        TypeError,
        r"inputs=\(1, 8\) looks like a shape: inputs must be an example batch, "
        r"e.g. inputs=jnp.zeros\(\(1, 8\)\)",
        0,
    ),
    (
        "a model built from sample inputs (a linen module, a `ciclo.types.ModelAdapter`) without `inputs`",
        lambda p: ciclo.create_model_state(LinearClassifier(), tx=optax.sgd(0.1)),
        TypeError,
        r"needs sample `inputs` to initialise the model",
        0,
    ),
    (
        "`strategy=42`",
        lambda p: model_state(strategy=42),
        TypeError,
        r"42 is not a strategy: it has no create.*see ciclo.strategies.Strategy",
        0,
    ),
    (
        '`strategy="jitt"`',
        lambda p: model_state(strategy="jitt"),
        ValueError,
        r"unknown strategy 'jitt'; known strategies: .*jit",
        0,
    ),
    (
        '`tx="adam"`',
        lambda p: model_state(tx="adam"),
        TypeError,
        r"tx must be an optax optimizer \(e.g. optax.adam",
        0,
    ),
    (
        "`losses=[fn]`",
        lambda p: model_state(losses=[optax.l2_loss]),
        TypeError,
        r"losses must be a dict of name -> function",
        0,
    ),
    (
        "test batches of another shape",
        lambda p: ciclo.train_loop(
            model_state(),
            [(X, Y)] * 4,
            test_dataset=lambda: [(np.ones((4, 5), np.float32), Y)],
            epoch_duration=2,
        ),
        TypeError,
        r"the model failed on inputs float32\[4, 5\]: give every step .* batches shaped like"
        r"[\s\S]*raised by callback ModelState.test_step at step 0",
        2,
    ),
    (
        "labels of the wrong dtype",
        lambda p: ciclo.train_loop(model_state(), [(X, Y.astype(np.float32))] * 4),
        TypeError,
        r"loss 'loss' failed on preds float32\[4, 3\] and target float32\[4\].*need int labels"
        r"[\s\S]*raised by callback ModelState.train_step at step 0",
        1,
    ),
    (
        "a bound step in ciclo.loop failing",
        lambda p: (
            (s := model_state())
            and ciclo.loop(s, [(X, Y.astype(np.float32))], {ciclo.every(1): s.train_step})
        ),
        TypeError,
        r"need int labels[\s\S]*raised by callback ModelState.train_step at step 0",
        1,
    ),
    (
        "a batch of Python lists (`(x.tolist(), y.tolist())`)",
        lambda p: ciclo.train_loop(model_state(), [(X.tolist(), Y.tolist())] * 4),
        TypeError,
        r"batch leaf \[0\] is a Python list \(\[\[1.0, .*jax takes as 32 separate numbers.*np.asarray",
        0,
    ),
    (
        "a metric that calls `float(x)` or `x.item()`",
        lambda p: ciclo.train_loop(
            model_state(
                metrics={"acc": f(lambda preds, target: float(jnp.mean(preds.argmax(-1) == target)))}
            ),
            [(X, Y)] * 4,
        ),
        TypeError,
        r"(?s)turned a traced array into a Python or numpy value \(ConcretizationTypeError\): return a jax "
        r"array, e.g. jnp.mean\(x\), not float\(x\).*raised by metric 'acc'",
        0,
    ),
    (
        "a metric that returns a Python number (`return 0.5`)",
        lambda p: ciclo.train_loop(model_state(metrics={"acc": f(lambda preds: 0.5)}), [(X, Y)] * 4),
        TypeError,
        r"(?s)returned 0.5 \(a float\), not a jax array: return a jax array.*raised by metric 'acc'",
        0,
    ),
    (
        'a loss that returns a string (`return "mse"`)',
        lambda p: ciclo.train_loop(model_state(losses={"loss": lambda preds: "mse"}), [(X, Y)] * 4),
        TypeError,
        r"loss 'loss' returned 'mse' \(a str\), not a jax array: return a jax array",
        0,
    ),
    (
        "a batch dict without input keys",
        lambda p: ciclo.train_loop(model_state(), [{"features": X, "y": Y}]),
        KeyError,
        r"a batch given as a mapping needs the keys",
        1,
    ),
    (
        'a batch leaf a step cannot take (`{"x": x, "name": "abc"}`)',
        lambda p: ciclo.train_loop(model_state(), [{"x": X, "y": Y, "name": "abc"}]),
        TypeError,
        r"batch leaf \['name'\] is a str \('abc'\), not a number or an array of numbers, which a step cannot",
        0,
    ),
    (
        '`ciclo.export(state, x, path, batch_polymorphic="yes")`',
        lambda p: ciclo.export(model_state(), X, p / "model.jax", batch_polymorphic="yes"),
        TypeError,
        r"batch_polymorphic must be True or False, got 'yes'",
        0,
    ),
    (
        "`ciclo.load_exported` of a file `ciclo.export` did not write (empty, JSON, pickle), or one cut or "
        "damaged since",
        lambda p: not_an_export(p),
        ValueError,
        r"model.jax is not a ciclo export, or it is damaged",
        0,
    ),
    (
        "`ciclo.load_exported` of a FIFO, a directory or a device",
        lambda p: a_fifo(p),
        ValueError,
        r"pipe is not a ciclo export: it is not a regular file",
        0,
    ),
    (
        "an adapter whose `apply` returns the predictions alone (`ciclo.testing.check_adapter`)",
        lambda p: ciclo.testing.check_adapter(PredictionsOnly(), inputs=X),
        AssertionError,
        r"clause 'protocol' failed: apply returned Array\(",
        0,
    ),
]


def _run(fn: Callable[[], Any]) -> tuple[BaseException | None, list[warnings.WarningMessage]]:
    """Runs `fn` in a thread with a hard timeout; returns what it raised and warned."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            fn()
        except BaseException as error:  # noqa: BLE001 - handed back to the test
            outcome["error"] = error

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        thread.join(TIMEOUT)
    if thread.is_alive():
        pytest.fail(f"did not return within {TIMEOUT} s (a hang)")
    return outcome.get("error"), caught


def _nameable(kind: type) -> bool:
    """Whether a user can catch `kind` by a documented name: a builtin, public ciclo type, other library's."""
    if not kind.__module__.startswith("ciclo"):
        return True
    return any(vars(module).get(kind.__name__) is kind for module in (ciclo, ciclo.types, ciclo.managed))


def _message(error: BaseException) -> str:
    return "\n".join([str(error), *getattr(error, "__notes__", [])])


@pytest.mark.parametrize(
    ("name", "usage", "expected", "pattern", "at_most"),
    [pytest.param(*case, id=case[0]) for case in CASES],
)
def test_bad_input(
    name: str, usage: Callable[[Any], Any], expected: type, pattern: str, at_most: int | None, tmp_path: Any
) -> None:
    ran.clear()
    error, caught = _run(lambda: usage(tmp_path))
    if isinstance(error, pytest.skip.Exception):
        raise error
    if issubclass(expected, Warning):
        assert error is None, f"raised {error!r} instead of warning"
        messages = [str(w.message) for w in caught if issubclass(w.category, expected)]
        assert messages, f"no {expected.__name__}; warnings: {[str(w.message) for w in caught]}"
        message = next((m for m in messages if re.search(pattern, m)), "")
        assert message, messages
    else:
        assert error is not None, f"no error (warnings: {[str(w.message) for w in caught]})"
        assert isinstance(error, expected), f"{type(error).__name__}: {_message(error)}"
        assert _nameable(type(error)), f"{type(error)} is a private type: raise a builtin or a public one"
        message = _message(error)
        assert re.search(pattern, message), message
        assert len(message) <= 2000, message[:500]
    if name in page.rows():  # the page quotes this case: each quote must be the code's words
        page.check(name, message)
    if at_most is not None:
        assert len(ran) <= at_most, f"{len(ran)} steps ran before the error"


def test_each_row_of_the_page_is_a_case() -> None:
    # docs/bad_inputs.md's rows are named by their mistake, and so is the case that raises each.
    framework = page.FRAMEWORK_ROWS  # raised by tests/adapters/flax/test_bad_inputs.py
    assert set(page.rows()) - framework <= {case[0] for case in CASES}
    assert framework <= set(page.rows())


def test_the_catalogue_has_at_least_40_distinct_cases() -> None:
    names = [case[0] for case in CASES]
    assert len(set(names)) == len(names) >= 40


def test_a_float_state_may_be_replaced_by_a_float() -> None:
    # The rule refuses a value of another kind than the state, not a number for a number state.
    state, _, _ = ciclo.loop(0.0, range(3), {ciclo.every(1): lambda state: state + 0.5})
    assert state == 1.5


def test_a_test_stream_bounded_by_test_duration_may_be_shared() -> None:
    stream = itertools.count()  # endless, but each pass takes test_duration batches of it
    _, history, _ = ciclo.train_loop(
        0,
        range(4),
        {
            ciclo.on_train_step: step,
            ciclo.on_test_step: lambda state, batch: ciclo.logs().add_metric("t", float(batch)),
        },
        test_dataset=lambda: stream,
        test_duration=2,
        epoch_duration=2,
    )
    assert history.collect("t_test") == [0.5, 2.5]


def test_out_of_range_labels_are_caught_by_terminate_on_nan(caplog: Any) -> None:
    # Labels beyond the model's classes give a NaN loss, which no cheap check sees before the step;
    # terminate_on_nan (in callbacks=) stops the run within check_every steps and names step and entry.
    guard = ciclo.terminate_on_nan("loss", check_every=2)
    state, history, elapsed = ciclo.train_loop(
        model_state(), [(X, np.array([0, 7, 2, 0], np.int32))] * 20, callbacks=[guard]
    )
    assert np.isnan(history.collect("loss")[0])
    assert (guard.step, guard.entry, elapsed.steps) == (0, "loss", 2)
    assert "'loss' is NaN or infinite at step 0" in caplog.text


def test_a_bad_restore_keeps_the_checkpoint(tmp_path: Any) -> None:
    saved = model_state()
    checkpoint = ciclo.checkpoint(tmp_path / "ck")
    checkpoint.save(1, saved)
    checkpoint.wait()
    files = sorted(
        os.path.relpath(os.path.join(d, f), tmp_path) for d, _, fs in os.walk(tmp_path) for f in fs
    )
    other = model_state(inputs=jnp.zeros((1, 5)))
    with pytest.raises(
        ValueError,
        match=r"params/w: the checkpoint holds shape \(8, 3\) float32, the target has shape \(5, 3\)",
    ):
        ciclo.restore_checkpoint(tmp_path / "ck", other)
    with pytest.raises(ValueError, match=r"\n  a: in the target .* but not in the checkpoint"):
        ciclo.restore_checkpoint(tmp_path / "ck", {"a": jnp.zeros(3)})
    after = sorted(
        os.path.relpath(os.path.join(d, f), tmp_path) for d, _, fs in os.walk(tmp_path) for f in fs
    )
    assert after == files
    restored = ciclo.restore_checkpoint(tmp_path / "ck", saved)
    np.testing.assert_array_equal(restored.params["w"], saved.params["w"])


def test_a_backup_of_another_model_is_refused_and_kept(tmp_path: Any) -> None:
    tasks = {ciclo.every(1): lambda state, batch: state.train_step(batch)}
    trained, _, _ = ciclo.loop(model_state(), [(X, Y)] * 3, tasks, backup=tmp_path / "bk")
    files = sorted(
        os.path.relpath(os.path.join(d, f), tmp_path) for d, _, fs in os.walk(tmp_path) for f in fs
    )
    other = model_state(inputs=jnp.zeros((1, 5)))
    with pytest.raises(
        ValueError,
        match=r"the backup at step 3 in .* does not match the target state[\s\S]*\n  params/w: "
        r"the backup holds shape \(8, 3\) float32, the target has shape \(5, 3\)[\s\S]*another directory",
    ):
        ciclo.loop(other, [(np.ones((4, 5), np.float32), Y)] * 3, tasks, backup=tmp_path / "bk")
    after = sorted(
        os.path.relpath(os.path.join(d, f), tmp_path) for d, _, fs in os.walk(tmp_path) for f in fs
    )
    assert after == files
    resumed, _, elapsed = ciclo.loop(model_state(), [(X, Y)] * 3, tasks, backup=tmp_path / "bk")
    assert elapsed.steps == 3
    np.testing.assert_array_equal(resumed.params["w"], trained.params["w"])


_BATCHES = [(np.zeros((8, 64), np.float32), np.zeros(8, np.int32)) for _ in range(200)]


@pytest.mark.parametrize(
    "misuse",
    [
        # The error quoted the whole list: 434,046 characters.
        lambda: ciclo.train_loop(
            0, _BATCHES, {ciclo.on_train_step: lambda state: state}, test_dataset=_BATCHES, stop=2
        ),
        lambda: ciclo.loop(0, _BATCHES, {ciclo.every(1): [_BATCHES]}),
        lambda: ciclo.loop(0, _BATCHES, {ciclo.every(1): [lambda state: state]}, stop=_BATCHES),
        lambda: ciclo.loop(_BATCHES, _BATCHES, {ciclo.every(1): [lambda state: 0.5]}, stop=1),
    ],
    ids=["test_dataset", "callback", "stop", "callback_result"],
)
def test_no_error_quotes_a_200_batch_list_at_length(misuse) -> None:
    with pytest.raises((TypeError, ValueError)) as info:
        misuse()
    message = "\n".join([str(info.value), *getattr(info.value, "__notes__", [])])
    assert len(message) <= 2000, message[:300]
    assert "ndarray of shape (8, 64) and dtype float32" in message or "list" in message
