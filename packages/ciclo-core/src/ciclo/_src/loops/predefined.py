"""Predefined loops: `train_loop`, `test_loop` and `predict_loop`.

Each is `run_phases` with phases built from the hook vocabulary of
`ciclo.hooks`: named schedules in the tasks dict (`{ciclo.on_train_step:
[step]}`), the state's own methods (`state.train_step`, ...) and the hooks of
the objects in `callbacks=[...]` (`keras_bar` has `on_train_batch_end`,
`checkpoint` and `early_stopping` have `on_epoch_end`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Literal, TypedDict, final

from typing_extensions import Unpack

from ciclo._src.base.batches import BatchSizeFn, stacked
from ciclo._src.base.checks import DataWarning, TestData, check_bool, check_positive
from ciclo._src.base.elapsed import Elapsed, Period, PeriodLike
from ciclo._src.base.reprs import short
from ciclo._src.base.schedules import Every, at_step_end, every
from ciclo._src.base.types import Evaluable, Predictable, S, Trainable
from ciclo._src.callbacks._ema import SwapEMAWeights
from ciclo._src.callbacks._throughput import Throughput
from ciclo._src.callbacks._training_options import TrainingOptionsWatch
from ciclo._src.data.prefetch import prefetch_to_device
from ciclo._src.engine.callback import Callback, Tasks
from ciclo._src.engine.door import (
    Named,
    add_callbacks,
    add_state_methods,
    as_callback_list,
    collect,
    split_tasks,
)
from ciclo._src.engine.loop_state import LoopState
from ciclo._src.engine.phases import Phase, run_phases
from ciclo._src.logs.logs import History
from ciclo._src.logs.step_output import step_output
from ciclo._src.loops.auto_steps import AUTO, AutoSteps, signature
from ciclo._src.loops.evaluation import AggregationLike, RunningLosses, inner_loop
from ciclo._src.loops.hooks import (
    PREDICT,
    TEST,
    TRAIN,
    on_epoch_end,
    on_predict_begin,
    on_reset_step,
    on_test_begin,
    on_train_batch_begin,
    on_train_batch_end,
    on_train_begin,
    on_train_end,
    on_train_step,
    reset_step,
    train_step,
)
from ciclo._src.resume.backup import Backup, BackupCallback
from ciclo._src.resume.signals import CatchInterrupt
from ciclo._src.state.managed import AbstractManagedState, ManagedStep


def _get(named: Named, *names: str) -> list[Any]:
    return [callback for name in names for callback in named.get(name, [])]


@final
class _AtEnd(Callback):
    """Runs a loop's end callbacks (`on_train_end`, ...) once its steps ended by themselves."""

    def __init__(self, callbacks: list[Any]) -> None:
        self.callbacks = as_callback_list(callbacks, "the end callbacks")
        self.ran_no_step = False

    def on_start(self, loop_state: LoopState[Any], /) -> None:
        self.ran_no_step = loop_state.stop_iteration  # a finished run restored: it has ended already

    def on_end(self, loop_state: LoopState[Any], error: BaseException | None, /) -> None:
        if error is not None or self.ran_no_step:
            return
        for callback in self.callbacks:
            _, loop_state.state = step_output(
                callback.__loop_callback__(loop_state), loop_state.state, callback
            )


_ONCE: Final = Period(steps=2**62)


class LoopSettings(TypedDict, total=False):
    """The keywords every loop takes: `ciclo.loop`, `train_loop`, `test_loop` and `predict_loop`.

    One definition for the four (they take them as `**settings`), and one docstring:

    Attributes:
        stop: stop when this `Period` (or number of steps) is reached; otherwise
            when the dataset ends or a callback stops the loop.
        history: commit to this `History` instead of a new one.
        elapsed: resume counting from this `Elapsed`.
        catch_keyboard_interrupt: on Ctrl-C, stop after the step in flight and
            return what was computed so far instead of raising (default True).
        metadata: any value, available to callbacks as `loop_state.metadata`.
        batch_size_fn: counts the samples of a batch (default: the leading
            dimension of its first array leaf).
        backup: a directory or `ciclo.backup(directory, every=...)`: back up the
            run (`train_loop`: at each epoch's end by default; else every 1000
            steps), at its end and on SIGTERM, and resume from the backup found
            there (see `ciclo.backup`).
    """

    stop: PeriodLike | None
    history: History | None
    elapsed: Elapsed | None
    catch_keyboard_interrupt: bool
    metadata: Any
    batch_size_fn: BatchSizeFn | None
    backup: Backup | str | os.PathLike[str] | None


_SETTINGS: Final = frozenset(LoopSettings.__optional_keys__)


def _check_settings(loop_name: str, settings: LoopSettings) -> None:
    unknown = sorted(set(settings) - _SETTINGS)
    if unknown:
        raise TypeError(
            f"{loop_name} got the unknown keyword(s) {short(unknown)}: besides those of its signature, "
            f"a loop takes {sorted(_SETTINGS)} (ciclo.types.LoopSettings)"
        )


def _run(
    kind: str,
    state: S,
    dataset: Iterable[Any],
    phases: list[Phase],
    begin: list[Any],
    end: list[Any],
    settings: LoopSettings,
    backup_every: Any = None,
) -> tuple[S, History, Elapsed]:
    # Begin callbacks run at the first step (not again in a run resumed past it), end ones after the last.
    catch_keyboard_interrupt = settings.get("catch_keyboard_interrupt", True)
    check_bool(catch_keyboard_interrupt, "catch_keyboard_interrupt")
    backup, elapsed = settings.get("backup"), settings.get("elapsed")
    callbacks: list[Callback] = []
    if backup is not None:
        callbacks.append(BackupCallback(backup, kind=kind, default_every=backup_every))
    if catch_keyboard_interrupt:
        callbacks.append(CatchInterrupt())
    if begin or end:
        first = Every(_ONCE, offset=Period(steps=0 if elapsed is None else int(elapsed.steps)))
        phases = [Phase("begin", [(first, [_AtEnd(end), *begin])]), *phases]
    return run_phases(
        state,
        dataset,
        phases,
        callbacks=callbacks,
        stop=settings.get("stop"),
        history=settings.get("history"),
        elapsed=elapsed,
        metadata=settings.get("metadata"),
        batch_size_fn=settings.get("batch_size_fn"),
    )


def _step_loop(
    prefix: Literal["test", "predict"],
    state: S,
    dataset: Iterable[Any],
    tasks: Tasks | None,
    callbacks: list[Any] | None,
    settings: LoopSettings,
    *,
    running: bool = True,
) -> tuple[S, History, Elapsed]:
    """`test_loop` or `predict_loop`; `train_loop`'s evaluation keeps losses per batch (`running=False`)."""
    loop_name = f"{prefix}_loop"
    _check_settings(loop_name, settings)
    names, protocol = (TEST, Evaluable) if prefix == "test" else (PREDICT, Predictable)
    named, scheduled = collect(names, tasks, state=state, callbacks=callbacks, loop_name=loop_name)
    steps = (f"{prefix}_step", f"on_{prefix}_step")
    _check_runs_something(state, named, scheduled, protocol, loop_name, steps)
    running_losses = [RunningLosses(settings.get("batch_size_fn"))] if prefix == "test" and running else []
    phases = [
        Phase(f"{prefix}_batch_begin", [(every(1), _get(named, f"on_{prefix}_batch_begin"))]),
        Phase(f"{prefix}_step", [(every(1), _get(named, *steps) + running_losses)]),
        Phase("tasks", scheduled),
        Phase(f"{prefix}_batch_end", [(every(1), _get(named, f"on_{prefix}_batch_end"))]),
    ]
    begin = (
        _get(named, on_test_begin, reset_step, on_reset_step)
        if prefix == "test"
        else _get(named, on_predict_begin)
    )
    return _run(loop_name, state, dataset, phases, begin, _get(named, f"on_{prefix}_end"), settings)


def _check_runs_something(
    state: Any,
    named: Named,
    scheduled: Mapping[Any, Any],
    protocol: type,
    loop_name: str,
    steps: tuple[str, ...],
) -> None:
    if isinstance(state, protocol) or scheduled or any(named.values()):
        return
    methods = "test_step and reset_step" if protocol is Evaluable else steps[0]
    raise TypeError(
        f"{loop_name} has no step to run: the state ({type(state).__name__}) has no "
        f"{methods} method (see ciclo.types.{protocol.__name__}), and no callback was given "
        f"under {' or '.join(f'ciclo.hooks.{name}' for name in steps)}"
    )


def _steps_per_execution(value: Any) -> int | Literal["auto"]:
    if isinstance(value, str) and value == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f'steps_per_execution must be a positive int or "auto" (measured), got {short(value)}'
        )
    return value


def _group_bounds(
    epoch: Period | None, stop: Period | None, elapsed: Elapsed | None
) -> tuple[int | None, int, int | None]:
    """`(align, start, total)` of the groups: cut at every epoch end and at `stop`, from the resumed step."""
    for name, period in (("epoch_duration", epoch), ("stop", stop)):
        if period is not None and (period.steps is None or period != Period(steps=period.steps)):
            raise ValueError(
                f"steps_per_execution cuts its groups at the epoch ends and at stop, so {name} must be "
                f"a number of steps, got {short(period)}"
            )
    start = 0 if elapsed is None else elapsed.steps
    total = None if stop is None or stop.steps is None else max(stop.steps - start, 0)
    return (None if epoch is None else epoch.steps), start, total


def _watch_training_options(named: Named, state: Any, max_skipped_steps: Any, stop: Period | None) -> None:
    scaling = isinstance(state, AbstractManagedState) and state.loss_scale is not None
    if max_skipped_steps is not None and (
        isinstance(max_skipped_steps, bool) or not isinstance(max_skipped_steps, int) or max_skipped_steps < 1
    ):
        raise ValueError(f"max_skipped_steps must be None or an int >= 1, got {short(max_skipped_steps)}")
    if max_skipped_steps is not None and not scaling:
        raise ValueError(
            f"max_skipped_steps={short(max_skipped_steps)} counts the steps a loss scale skips, and this "
            "state has none: it applies to a managed state created with precision='16-mixed'"
        )
    if not isinstance(state, AbstractManagedState) or not (scaling or state.options.accumulate_steps > 1):
        return
    watch = TrainingOptionsWatch(
        loss_scaling=scaling,
        accumulate_steps=state.options.accumulate_steps,
        max_skipped_steps=max_skipped_steps,
        stop_steps=stop.steps if stop is not None and stop == Period(steps=stop.steps) else None,
    )
    named.setdefault(on_train_batch_end, []).append(watch)


def _watch_steps(callbacks: Any) -> None:
    """Tells each `ciclo.throughput` in a task's `callbacks` the steps before it, whose FLOPs it reads."""
    if not isinstance(callbacks, (list, tuple)):
        return
    for index, callback in enumerate(callbacks):
        if isinstance(callback, Throughput):
            callback.watch(callbacks[:index])


def loop(
    state: S,
    dataset: Iterable[Any],
    tasks: Tasks,
    *,
    on_start: Any = None,
    on_end: Any = None,
    **settings: Unpack[LoopSettings],
) -> tuple[S, History, Elapsed]:
    """Runs `tasks` over `dataset`: at each step, the callbacks of each schedule that fires.

    At each step the loop goes through `tasks` in dict order and, for each
    schedule that fires, calls its callbacks in list order. Each callback may
    return new logs (merged into the step's logs) and a new state. Steps that
    logged anything are committed to the history. The loop never waits for the
    device: logged arrays stay on it until they are shown or collected.

    `loop` is the dict front-end of the engine, `ciclo.run_phases`: the tasks
    form one `ciclo.types.Phase`.

    Args:
        state: the initial state (any pytree).
        dataset: an iterable of batches.
        tasks: `{schedule: callback or [callbacks]}`. A callback is an object with
            `__loop_callback__(loop_state)`, or a callable taking 0 to 4 of
            `(state, batch, elapsed, loop_state)`. Both return `(logs, state)`,
            `logs`, `state` or `None` (no logs, the state unchanged).
        on_start: callback(s) run once, before the first step's tasks.
        on_end: callback(s) run once after the last step.
        **settings: the loop settings (`ciclo.types.LoopSettings`).

    Returns:
        `(state, history, elapsed)`: the final state, the history of logs, and
        the `Elapsed` after the last step.

    Example:
        >>> import ciclo
        >>> def train_step(state, batch):
        ...     state = state + batch
        ...     return ciclo.logs().add_metric("total", state), state
        >>> state, history, elapsed = ciclo.loop(0, range(10), {ciclo.every(1): [train_step]}, stop=4)
        >>> state, elapsed.steps, history.collect("total")
        (6, 4, [0, 1, 3, 6])
    """
    _check_settings("loop", settings)
    if not isinstance(tasks, Mapping):
        raise TypeError(f"tasks must be a dict of schedule -> callbacks, got {short(tasks)}")
    for callbacks in tasks.values():
        _watch_steps(callbacks)
    return _run(
        "loop",
        state,
        dataset,
        [Phase("tasks", tasks)],
        as_callback_list(on_start, "on_start"),
        as_callback_list(on_end, "on_end"),
        settings,
    )


def train_loop(
    state: S,
    dataset: Iterable[Any],
    tasks: Tasks | None = None,
    *,
    callbacks: list[Any] | None = None,
    test_dataset: Callable[[], Iterable[Any]] | None = None,
    epoch_duration: PeriodLike | None = None,
    test_duration: PeriodLike | None = None,
    test_name: str = "test",
    inner_loop_kwargs: Mapping[str, Any] | None = None,
    test_aggregation: AggregationLike | None = None,
    test_with_ema: bool = False,
    steps_per_execution: int | Literal["auto"] = 1,
    prefetch: int | None = None,
    max_skipped_steps: int | None = None,
    **settings: Unpack[LoopSettings],
) -> tuple[S, History, Elapsed]:
    """A training loop with epochs and an evaluation loop at the end of each epoch.

    Each step runs these phases in order: `on_train_batch_begin`;
    `train_step` and `on_train_step`; the scheduled tasks of `tasks` (e.g.
    `ciclo.every(20)`); after the step that completes an epoch, `reset_step`
    / `on_reset_step`, the test loop over `test_dataset()` (a `ciclo.test_loop`
    whose logs are renamed with the `_test` suffix and reduced to one value
    per entry, see `test_aggregation`), and `on_epoch_end`; finally `on_train_batch_end` (where
    progress bars go, so they show everything logged in the step).
    `on_train_begin` and `on_train_end` run once. It is `ciclo.run_phases`
    with these phases: build your own loop the same way.

    Args:
        state: the initial state: a `ciclo.types.Trainable` (a `train_step` method),
            or any state with the step given in `tasks`. Its `train_step`,
            `test_step`, `reset_step` (and other named) methods are registered
            automatically.
        dataset: the training batches.
        tasks: `{named schedule or schedule: callbacks}`.
        callbacks: objects whose named hooks (`on_train_batch_end`,
            `on_epoch_end`, ...) are registered by name.
        test_dataset: a zero-argument function returning a fresh iterable of
            test batches (called at the end of every epoch).
        epoch_duration: steps (int) or `Period` per epoch; needed for
            `test_dataset`, `reset_step` and `on_epoch_end`.
        test_duration: stop each test loop after this period (default: when
            `test_dataset()` is exhausted).
        test_name: suffix of the test entries (`accuracy_test`).
        inner_loop_kwargs: passed to `ciclo.inner_loop` for the test loop.
        test_aggregation: how the test loop's entries become one value each,
            per entry (`{"accuracy": "mean", "top2": "last"}`), per collection
            or for all; entries it does not name follow the rules of
            `ciclo.inner_loop` (running metrics keep their last value, per-batch
            ones are averaged weighted by samples).
        test_with_ema: evaluate with the EMA of the weights (a state created
            with `ema_decay=`): adds `ciclo.swap_ema_weights()` to `callbacks`.
        steps_per_execution: run this many training steps per dispatch, as one
            compiled `jax.lax.scan` (Keras' `steps_per_execution`): the batches
            are grouped with `ciclo.stacked`, cut so that no group crosses an
            epoch's end or `stop`. Epochs, test loops and the history still see
            every step; other scheduled tasks and progress bars run once per
            group. The `train_step` must take `ciclo.types.Stacked` batches (managed
            steps and `ciclo.fuse`d steps do). `"auto"` measures the best power of
            two on the first steps and logs it as `performance.steps_per_execution`
            (docs/performance.md, "Measured steps per dispatch").
        prefetch: put this many training batches (or groups) on their devices
            ahead of the step that takes them (`ciclo.prefetch_to_device`, with a
            managed state's strategy); a backup still resumes at the first batch
            the loop did not take (docs/data.md). 0 or None: no prefetch.
        max_skipped_steps: under loss scaling (`precision="16-mixed"`), stop the
            loop with a warning once this many steps in a row were skipped for
            gradients that were not finite (docs/recipes.md, "Mixed precision").
        **settings: the loop settings (`ciclo.types.LoopSettings`; a backup is
            made at each epoch's end by default).

    Returns:
        `(state, history, elapsed)`.

    Raises:
        TypeError: if nothing would train: the state is not a `ciclo.types.Trainable`
            and `tasks` hold no step.
        ValueError: if `prefetch` is not an int >= 0 or None, `steps_per_execution`
            not an int >= 1 or `"auto"` (or, when it groups, `epoch_duration` or
            `stop` is not a number of steps), or `max_skipped_steps` is not None
            or an int >= 1 for a state with loss scaling.

    Example:
        >>> import ciclo
        >>> def train_step(state, batch):
        ...     return ciclo.logs().add_metric("seen", state + 1), state + 1
        >>> def test_step(state, batch):
        ...     return ciclo.logs().add_metric("batch", batch)
        >>> state, history, elapsed = ciclo.train_loop(
        ...     0,
        ...     range(100),
        ...     {ciclo.on_train_step: [train_step], ciclo.on_test_step: [test_step]},
        ...     test_dataset=lambda: [1.0, 2.0, 3.0],
        ...     epoch_duration=5,
        ...     stop=10,
        ... )
        >>> state, history.collect("steps", "batch_test")
        (10, ([4, 9], [2.0, 2.0]))
    """
    _check_settings("train_loop", settings)
    stop, batch_size_fn = Period.of(settings.get("stop"), name="stop"), settings.get("batch_size_fn")
    names = tuple(dict.fromkeys(TRAIN + TEST))
    named, scheduled = split_tasks(tasks, names, "train_loop")
    add_callbacks(
        named, [*(callbacks or []), SwapEMAWeights()] if test_with_ema is True else callbacks, names
    )
    # The test loop registers the state's own test methods itself: hand it only the user's.
    test_tasks = {name: named[name] for name in TEST if name in named and name not in TRAIN}
    # Asked for explicitly; a state's own `reset_step` method only runs when there are epochs.
    epoch_tasks = _get(named, reset_step, on_reset_step, on_epoch_end)
    add_state_methods(named, state, TRAIN)
    epoch = Period.of(epoch_duration, name="epoch_duration")
    test_period = Period.of(test_duration, name="test_duration")
    check_positive(epoch, "epoch_duration", "pass the number of steps per epoch, e.g. epoch_duration=100")
    check_positive(test_period, "test_duration", "pass test_duration=None to test on every test batch")
    if test_dataset is not None and not callable(test_dataset):
        raise TypeError(
            f"test_dataset must be a zero-argument function returning the test batches, "
            f"e.g. `test_dataset=lambda: get_test_batches()`; got {short(test_dataset)}"
        )
    if epoch is None and (test_dataset is not None or epoch_tasks):
        raise ValueError(
            "test_dataset, reset_step and on_epoch_end callbacks run at the end of each epoch: "
            "pass epoch_duration (steps or a ciclo.types.Period)"
        )
    if not isinstance(test_name, str):
        raise TypeError(f"test_name must be a string, got {short(test_name)}")
    check_bool(test_with_ema, "test_with_ema")
    _check_runs_something(state, named, scheduled, Trainable, "train_loop", (train_step, on_train_step))
    _watch_training_options(named, state, max_skipped_steps, stop)
    steps = _steps_per_execution(steps_per_execution)
    auto = None
    if steps != 1:
        align, start, total = _group_bounds(epoch, stop, settings.get("elapsed"))
        if isinstance(steps, str):
            auto = AutoSteps(
                align=align,
                start=start,
                total=total,
                batch_size_fn=batch_size_fn,
                signature=signature(state, _get(named, train_step, on_train_step)),
            )
            dataset = auto.groups(dataset)
        else:
            dataset = stacked(
                dataset, steps, batch_size_fn=batch_size_fn, align=align, start=start, total=total
            )
    prefetched = None
    if prefetch is not None and prefetch != 0:
        # After the grouping: each group is placed whole, as the fused step takes it.
        strategy = state.strategy if isinstance(state, AbstractManagedState) else None
        dataset = prefetched = prefetch_to_device(dataset, prefetch, strategy)

    # Auto times each dispatch from before the step's first callback to after its last one.
    timed = ([auto.before_step], [auto.after_dispatch]) if auto is not None else ([], [])
    step_callbacks = _get(named, train_step, on_train_step)
    _watch_steps(step_callbacks)
    phases = [
        Phase("train_batch_begin", [(every(1), timed[0] + _get(named, on_train_batch_begin))]),
        Phase("train_step", [(every(1), step_callbacks + timed[1])]),
        Phase("tasks", scheduled),
    ]
    if epoch is not None:
        at_epoch_end = _get(named, reset_step, on_reset_step)
        if test_dataset is not None:
            make_test_dataset = TestData(test_dataset, bounded=test_period is not None)
            kwargs: dict[str, Any] = dict(inner_loop_kwargs or {})
            if test_aggregation is not None:
                if "aggregation" in kwargs:
                    raise TypeError("pass test_aggregation or inner_loop_kwargs['aggregation'], not both")
                kwargs["aggregation"] = test_aggregation

            def run_test(current: Any) -> tuple[Any, History, Elapsed]:
                data = make_test_dataset()
                with warnings.catch_warnings():
                    # A test set shorter than test_duration is no news; an empty one is warned below.
                    warnings.simplefilter("ignore", DataWarning)
                    # The test losses per batch: the inner loop reduces them as its aggregation says.
                    test_settings: LoopSettings = {
                        "stop": test_period,
                        "catch_keyboard_interrupt": False,
                        "metadata": settings.get("metadata"),
                        "batch_size_fn": batch_size_fn,
                    }
                    result = _step_loop("test", current, data, test_tasks, None, test_settings, running=False)
                if result[2].steps == 0:
                    warnings.warn(
                        f"a test pass yielded no batch: test_dataset() returned {type(data).__name__} "
                        f"{data!r:.60} with nothing in it; return the test batches (fresh on each call)",
                        DataWarning,
                        stacklevel=2,
                    )
                return result

            at_epoch_end.append(inner_loop(test_name, run_test, **kwargs))
        at_epoch_end += _get(named, on_epoch_end)
        # The epoch ends after the step that completes it: checked on the counts after the step.
        phases.append(Phase("epoch_end", [(at_step_end(Every(epoch, offset=epoch)), at_epoch_end)]))
    phases.append(Phase("train_batch_end", [(every(1), _get(named, on_train_batch_end))]))
    # The managed training steps count their compiles in the logs and warn of a recompile while
    # the loop runs, at no cost to a step that does not compile.
    watched = [callback for callback in step_callbacks if isinstance(callback, ManagedStep)]
    for step in watched:
        step.watch_recompiles(True)
    try:
        return _run(
            "train_loop",
            state,
            dataset,
            phases,
            _get(named, on_train_begin),
            _get(named, on_train_end),
            settings,
            backup_every=epoch,  # by default, a backup at each epoch's end
        )
    finally:
        for step in watched:
            step.watch_recompiles(False)
        if prefetched is not None:
            prefetched.close()  # the batches read ahead go back to a source that can take them


def test_loop(
    state: S,
    dataset: Iterable[Any],
    tasks: Tasks | None = None,
    *,
    callbacks: list[Any] | None = None,
    **settings: Unpack[LoopSettings],
) -> tuple[S, History, Elapsed]:
    """An evaluation loop: `test_step` on each batch, after `reset_step` at the start.

    Each step runs `on_test_batch_begin`, `test_step`, `on_test_step`, the
    scheduled tasks, then `on_test_batch_end`. `on_test_begin`, `reset_step`
    and `on_reset_step` run before the first step; `on_test_end` after the last.

    Args:
        state: a `ciclo.types.Evaluable` (`test_step` and `reset_step` methods), or
            any state with the step given in `tasks`.
        dataset: the test batches.
        tasks: `{named schedule or schedule: callbacks}`.
        callbacks: objects whose named test hooks are registered by name.
        **settings: the loop settings (`ciclo.types.LoopSettings`).

    Raises:
        TypeError: if the state is not a `ciclo.types.Evaluable` and `tasks` hold no step.

    Example:
        >>> import ciclo
        >>> def test_step(state, batch):
        ...     return ciclo.logs().add_metric("error", abs(batch - state))
        >>> _, history, _ = ciclo.test_loop(2.0, [1.0, 2.0, 4.0], {ciclo.on_test_step: [test_step]})
        >>> history.collect("error")
        [1.0, 0.0, 2.0]
    """
    return _step_loop("test", state, dataset, tasks, callbacks, settings)


# Not a test: keeps pytest from collecting `test_loop` from modules that import it.
test_loop.__test__ = False  # type: ignore[attr-defined]


def predict_loop(
    state: S,
    dataset: Iterable[Any],
    tasks: Tasks | None = None,
    *,
    callbacks: list[Any] | None = None,
    **settings: Unpack[LoopSettings],
) -> tuple[S, History, Elapsed]:
    """An inference loop: `predict_step` on each batch; collect outputs from the history.

    Each step runs `on_predict_batch_begin`, `predict_step`, `on_predict_step`,
    the scheduled tasks, then `on_predict_batch_end`; `on_predict_begin` and
    `on_predict_end` run once.

    Args:
        state: a `ciclo.types.Predictable` (a `predict_step` method), or any state
            with the step given in `tasks`.
        dataset: the batches to predict.
        tasks: as in `ciclo.test_loop`, with the predict hooks.
        callbacks: as in `ciclo.test_loop`, placed under the predict hooks.
        **settings: the loop settings (`ciclo.types.LoopSettings`).

    Raises:
        TypeError: if the state is not a `ciclo.types.Predictable` and `tasks` hold no step.

    Example:
        >>> import ciclo
        >>> def predict_step(state, batch):
        ...     return ciclo.logs().add_output("doubled", 2 * batch)
        >>> _, history, _ = ciclo.predict_loop(None, [1, 2, 3], {ciclo.hooks.on_predict_step: [predict_step]})
        >>> history.collect("doubled")
        [2, 4, 6]
    """
    return _step_loop("predict", state, dataset, tasks, callbacks, settings)
