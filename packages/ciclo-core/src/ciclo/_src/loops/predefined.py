"""`ciclo.loop`, `train_loop`, `test_loop` and `predict_loop`: `run_phases` with phases named by hooks."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Literal, TypedDict, final

from typing_extensions import Unpack

from ciclo._src.base.batches import BatchSizeFn
from ciclo._src.base.checks import check_bool, check_positive
from ciclo._src.base.elapsed import Elapsed, Period, PeriodLike
from ciclo._src.base.reprs import short
from ciclo._src.base.schedules import Every, at_step_end, every
from ciclo._src.base.types import Evaluable, Placed, Predictable, S, Trainable
from ciclo._src.callbacks._ema import SwapEMAWeights
from ciclo._src.callbacks._monitor import MemberHistory
from ciclo._src.callbacks._recompiles import watch_recompiles
from ciclo._src.callbacks._throughput import watch_steps
from ciclo._src.callbacks._training_options import watch_training_options
from ciclo._src.callbacks._watchdog import Watchdog, loop_watchdog
from ciclo._src.data.prefetch import prefetch_to_device
from ciclo._src.data.steps_per_execution import group_steps
from ciclo._src.engine.callback import Callback, Tasks
from ciclo._src.engine.door import as_callback_list
from ciclo._src.engine.loop_state import LoopState
from ciclo._src.engine.phases import Phase, run_phases
from ciclo._src.logs.logs import History
from ciclo._src.logs.step_output import step_output
from ciclo._src.loops.evaluation import AggregationLike, RunningLosses, epoch_test
from ciclo._src.loops.hooks import (
    PREDICT,
    TEST,
    TRAIN,
    Named,
    add_state_methods,
    collect,
    on_epoch_end,
    on_reset_step,
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
from ciclo._src.state.preflight import preflight_check


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
        watchdog: a `ciclo.watchdog(...)`: end the process with its exit code
            when no step commits in time (docs/resume.md, "Hangs: the watchdog").
    """

    stop: PeriodLike | None
    history: History | None
    elapsed: Elapsed | None
    catch_keyboard_interrupt: bool
    metadata: Any
    batch_size_fn: BatchSizeFn | None
    backup: Backup | str | os.PathLike[str] | None
    watchdog: Watchdog | None


_SETTINGS: Final = frozenset(LoopSettings.__optional_keys__)


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
    unknown = sorted(set(settings) - _SETTINGS)
    if unknown:
        raise TypeError(
            f"{kind} got the unknown keyword(s) {short(unknown)}: besides those of its signature, "
            f"a loop takes {sorted(_SETTINGS)} (ciclo.types.LoopSettings)"
        )
    # Begin callbacks run at the first step (not again in a run resumed past it), end ones after the last.
    catch_keyboard_interrupt = settings.get("catch_keyboard_interrupt", True)
    check_bool(catch_keyboard_interrupt, "catch_keyboard_interrupt")
    backup, elapsed = settings.get("backup"), settings.get("elapsed")
    saver = None if backup is None else BackupCallback(backup, kind=kind, default_every=backup_every)
    # The watchdog first: it watches the backup's restore too, and writes its file beside the backups.
    callbacks: list[Callback] = [*loop_watchdog(settings.get("watchdog"), saver), *([saver] if saver else [])]
    if catch_keyboard_interrupt:
        callbacks.append(CatchInterrupt())
    callbacks.append(MemberHistory())
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
    names, protocol = (TEST, Evaluable) if prefix == "test" else (PREDICT, Predictable)
    named, scheduled = collect(names, tasks, state=state, callbacks=callbacks, loop_name=loop_name)
    _check_runs_something(prefix, state, named, scheduled, protocol)
    running_losses = [RunningLosses(settings.get("batch_size_fn"))] if prefix == "test" and running else []
    phases = [
        Phase(f"{prefix}_batch_begin", [(every(1), _get(named, f"on_{prefix}_batch_begin"))]),
        Phase(
            f"{prefix}_step",
            [(every(1), _get(named, f"{prefix}_step", f"on_{prefix}_step") + running_losses)],
        ),
        Phase("tasks", scheduled),
        Phase(f"{prefix}_batch_end", [(every(1), _get(named, f"on_{prefix}_batch_end"))]),
    ]
    begin = _get(named, f"on_{prefix}_begin", reset_step, on_reset_step)  # predict has no reset_step
    return _run(loop_name, state, dataset, phases, begin, _get(named, f"on_{prefix}_end"), settings)


def _check_runs_something(prefix: str, state: Any, named: Named, scheduled: Any, protocol: type) -> None:
    if isinstance(state, protocol) or scheduled or any(named.values()):
        return
    methods = "test_step and reset_step" if protocol is Evaluable else f"{prefix}_step"
    raise TypeError(
        f"{prefix}_loop has no step to run: the state ({type(state).__name__}) has no "
        f"{methods} method (see ciclo.types.{protocol.__name__}), and no callback was given "
        f'under "{prefix}_step" or {"ciclo.hooks" if prefix == "predict" else "ciclo"}.on_{prefix}_step'
    )


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

    Each step goes through `tasks` in dict order and, for each schedule that
    fires, calls its callbacks in list order; steps that logged anything are
    committed to the history. The tasks are one `ciclo.types.Phase` of
    `ciclo.run_phases` (docs/guide.md).

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
    if not isinstance(tasks, Mapping):
        raise TypeError(f"tasks must be a dict of schedule -> callbacks, got {short(tasks)}")
    for callbacks in tasks.values():
        watch_steps(callbacks)
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
    preflight: bool = False,
    device_memory: int | None = None,
    **settings: Unpack[LoopSettings],
) -> tuple[S, History, Elapsed]:
    """A training loop with epochs and an evaluation loop at the end of each epoch.

    Each step runs `on_train_batch_begin`, `train_step` and `on_train_step`,
    the scheduled tasks, at an epoch's end `reset_step`, the test loop and
    `on_epoch_end`, then `on_train_batch_end` (docs/loops.md).

    Args:
        state: a `ciclo.types.Trainable`, or any state with the step given in
            `tasks`; its `train_step`, `test_step`, ... methods are registered.
        dataset: the training batches.
        tasks: `{named schedule or schedule: callbacks}`.
        callbacks: objects whose named hooks (`on_epoch_end`, ...) are registered.
        test_dataset: a zero-argument function returning fresh test batches,
            called at the end of every epoch.
        epoch_duration: steps (int) or `Period` per epoch; needed for
            `test_dataset`, `reset_step` and `on_epoch_end`.
        test_duration: stop each test loop after this period.
        test_name: suffix of the test entries (`accuracy_test`).
        inner_loop_kwargs: passed to `ciclo.inner_loop` for the test loop.
        test_aggregation: how the test entries become one value each, for all
            or by entry or collection (`ciclo.inner_loop`'s `aggregation`).
        test_with_ema: evaluate with the EMA of the weights (`ema_decay=`).
        steps_per_execution: training steps per dispatch, as one compiled
            `jax.lax.scan` over `ciclo.stacked` groups that never cross an
            epoch's end or `stop`; `"auto"` measures it (docs/performance.md).
        prefetch: training batches (or groups) put on their devices ahead
            (`ciclo.prefetch_to_device`); 0 or None: none.
        max_skipped_steps: under loss scaling, stop once this many steps in a
            row were skipped (docs/recipes.md, "Mixed precision").
        preflight: print `ciclo.preflight`'s report of the managed train step
            before step 0 (docs/strategies.md, "Will it fit? Preflight").
        device_memory: bytes per device: stop before step 0, with an error,
            if the train step's estimate (`ciclo.preflight`) is larger.
        **settings: the loop settings (`ciclo.types.LoopSettings`; a backup is
            made at each epoch's end by default).

    Raises:
        TypeError: if the state is not a `ciclo.types.Trainable` and `tasks` hold no step.
        ValueError: for a `prefetch`, `steps_per_execution` or `max_skipped_steps` out of range, or a
            train step that would need more than `device_memory`.

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
    stop = Period.of(settings.get("stop"), name="stop")
    epoch = Period.of(epoch_duration, name="epoch_duration")
    test_period = Period.of(test_duration, name="test_duration")
    check_positive(epoch, "epoch_duration", "pass the number of steps per epoch, e.g. epoch_duration=100")
    check_positive(test_period, "test_duration", "pass test_duration=None to test on every test batch")
    check_bool(test_with_ema, "test_with_ema")
    # The EMA swap and the watch of the state's training options are callbacks as the user's are.
    ours = [
        *([SwapEMAWeights()] if test_with_ema else []),
        *watch_training_options(state, max_skipped_steps),
    ]
    given = [] if callbacks is None else callbacks
    every_callback = [*given, *ours] if isinstance(given, (list, tuple)) else given  # else refused by collect
    named, scheduled = collect(
        tuple(dict.fromkeys(TRAIN + TEST)), tasks, callbacks=every_callback, loop_name="train_loop"
    )
    # The test loop registers the state's own test methods itself: hand it only the user's.
    test_tasks = {name: named[name] for name in TEST if name not in TRAIN}
    test_settings: LoopSettings = {
        "stop": test_period,
        "catch_keyboard_interrupt": False,
        "metadata": settings.get("metadata"),
        "batch_size_fn": settings.get("batch_size_fn"),
    }
    evaluate = epoch_test(
        test_dataset,
        # The test losses per batch: the inner loop reduces them as its aggregation says.
        lambda current, data: _step_loop(
            "test", current, data, test_tasks, None, test_settings, running=False
        ),
        name=test_name,
        bounded=test_period is not None,
        inner_loop_kwargs=inner_loop_kwargs,
        aggregation=test_aggregation,
    )
    # Asked for explicitly; a state's own `reset_step` method only runs when there are epochs.
    if epoch is None and (evaluate is not None or _get(named, reset_step, on_reset_step, on_epoch_end)):
        raise ValueError(
            "test_dataset, reset_step and on_epoch_end callbacks run at the end of each epoch: "
            "pass epoch_duration (steps or a ciclo.types.Period)"
        )
    add_state_methods(named, state, TRAIN)
    at_epoch_end = [*_get(named, reset_step, on_reset_step), *([evaluate] if evaluate else [])]
    at_epoch_end += _get(named, on_epoch_end)
    _check_runs_something("train", state, named, scheduled, Trainable)
    step_callbacks = _get(named, train_step, on_train_step)
    elapsed = settings.get("elapsed")
    batches, before_step, after_step = group_steps(
        dataset,
        steps_per_execution,
        epoch=epoch,
        stop=stop,
        start=0 if elapsed is None else elapsed.steps,
        batch_size_fn=settings.get("batch_size_fn"),
        state=state,
        steps=step_callbacks,
    )
    prefetched = None
    if prefetch is not None and prefetch != 0:
        # After the grouping: each group is placed whole, as the fused step takes it.
        strategy = state.strategy if isinstance(state, Placed) else None
        batches = prefetched = prefetch_to_device(batches, prefetch, strategy)
    watch_steps(step_callbacks)
    phases = [
        Phase("train_batch_begin", [(every(1), before_step + _get(named, on_train_batch_begin))]),
        Phase("train_step", [(every(1), step_callbacks + after_step)]),
        Phase("tasks", scheduled),
    ]
    if epoch is not None:
        # The epoch ends after the step that completes it: checked on the counts after the step.
        phases.append(Phase("epoch_end", [(at_step_end(Every(epoch, offset=epoch)), at_epoch_end)]))
    phases.append(Phase("train_batch_end", [(every(1), _get(named, on_train_batch_end))]))
    # The managed training steps count their compiles and warn of a recompile while the loop runs.
    begin = [
        *preflight_check(step_callbacks, report=preflight, device_memory=device_memory),
        *_get(named, on_train_begin),
        watch_recompiles(step_callbacks),
    ]
    try:
        # By default, a backup at each epoch's end.
        return _run("train_loop", state, batches, phases, begin, _get(named, on_train_end), settings, epoch)
    finally:
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
    """An evaluation loop: `test_step` on each batch, after `reset_step` at the start (docs/loops.md).

    Args:
        state: a `ciclo.types.Evaluable`, or any state with the step given in `tasks`.
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

    Args:
        state: a `ciclo.types.Predictable`, or any state with the step given in `tasks`.
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
