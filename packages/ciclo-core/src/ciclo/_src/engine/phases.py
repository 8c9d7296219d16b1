"""The loop engine: `run_phases` calls `ciclo.Callback`s (made by `ciclo._src.engine.door`) over a dataset."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from time import perf_counter
from typing import Any, cast, final

from ciclo._src.base.batches import BatchSizeFn, GlobalRows, Stacked, steps_of
from ciclo._src.base.batches import count as count_batch
from ciclo._src.base.compile_cache import start as start_compile_cache
from ciclo._src.base.elapsed import Clock, Elapsed, Period, PeriodLike, make_elapsed, only_steps
from ciclo._src.base.reprs import short
from ciclo._src.base.schedules import AtStepEnd, Every, next_boundary
from ciclo._src.base.types import S
from ciclo._src.data.position import dataset_ended, dataset_raised, iterate_dataset
from ciclo._src.engine.callback import Callback, Tasks
from ciclo._src.engine.door import as_callback_list, as_tasks, by_state_key, lifecycle_of, owners
from ciclo._src.engine.loop_state import LoopState as LoopState
from ciclo._src.logs.logs import History, Logs, StackedLogs
from ciclo._src.logs.step_output import describe, step_output
from ciclo._src.state.managed import AbstractManagedState
from ciclo._src.strategies._registry import processes_per_batch


@final
@dataclasses.dataclass(frozen=True)
class Phase:
    """A named group of tasks that runs at each step, after the phases before it.

    At each step, each task `(schedule, callbacks)` in order runs its callbacks
    when its schedule fires (a schedule wrapped in `ciclo.at_step_end`: on the
    counts that include the step).

    Attributes:
        name: names the phase in errors.
        tasks: `(schedule, callback or list of callbacks)` pairs, or a dict of them.

    Example:
        >>> import ciclo
        >>> phase = ciclo.types.Phase("train", [(ciclo.every(1), lambda state: state + 1)])
        >>> ciclo.run_phases(0, range(3), [phase])[0]
        3
    """

    name: str
    tasks: Sequence[tuple[Any, Any]] | Tasks


@dataclasses.dataclass(eq=False)
class _Task:
    """`boundary`: an `Every` in steps, due at `due`; `after`: checked on the counts after the step."""

    check: Callable[[Elapsed], bool] | None
    after: bool
    callbacks: list[Callback]
    boundary: tuple[int, int] | None = None
    due: int = 0


def _run_callbacks(loop_state: LoopState[Any], callbacks: list[Callback]) -> None:
    for callback in callbacks:
        try:
            out = callback.__loop_callback__(loop_state)
            if out is None:
                new_logs = None  # step_output's answers for the common outputs, without the call
            elif (
                type(out) is tuple
                and len(out) == 2
                and type(out[0]) is Logs
                and type(out[1]) is type(loop_state.state)
            ):
                new_logs, loop_state.state = out
            else:
                new_logs, loop_state.state = step_output(out, loop_state.state, callback)
        except Exception as error:
            error.add_note(f"raised by callback {describe(callback)} at step {loop_state.elapsed.steps}")
            raise
        if new_logs:
            if type(new_logs) is StackedLogs and type(loop_state.batch) is Stacked:
                loop_state._per_step = Logs(loop_state._per_step).merge(new_logs.per_step)
            logs = loop_state._logs
            if not logs:  # held as it came, a callback's own object: copied before a merge into it
                loop_state._logs, loop_state._owns_logs = new_logs, False
            elif loop_state._owns_logs:
                cast(Logs, logs).merge(new_logs)
            else:
                loop_state._logs, loop_state._owns_logs = Logs(logs).merge(new_logs), True
        if loop_state.stop_iteration:
            return


def _run_end_hooks(ends: list[Callback], loop_state: LoopState[Any], error: BaseException | None) -> None:
    """Calls each `on_end`; the first error one raises goes on once all ran."""
    loop_state._elapsed, loop_state._logs, loop_state._in_step = loop_state._clock.now(), None, False
    failed: BaseException | None = None
    for callback in ends:
        try:
            callback.on_end(loop_state, error or failed)
        except BaseException as raised:  # noqa: BLE001 - re-raised once the other callbacks ran
            failed = failed or raised
    if failed is not None:
        raise failed


def run_phases(
    state: S,
    dataset: Iterable[Any],
    phases: Sequence[Phase],
    *,
    callbacks: Any = None,
    stop: PeriodLike | None = None,
    history: History | None = None,
    elapsed: Elapsed | None = None,
    metadata: Any = None,
    batch_size_fn: BatchSizeFn | None = None,
) -> tuple[S, History, Elapsed]:
    """The loop engine: runs the `Phase`s in order at each step; returns `(state, history, elapsed)`.

    `ciclo.loop` and the predefined loops are this engine with their own phases.
    The lifecycle of `callbacks` wraps the tasks': their `on_start` run first, their `on_end` last.

    Args:
        state: the initial state (any pytree).
        dataset: an iterable of batches.
        phases: the `ciclo.types.Phase`s of a step, in the order they run.
        callbacks: the run's own callbacks (`ciclo.backup(...).callback(...)`, say).
        stop: stop at this `Period` or number of steps (else at the dataset's end).
        history: commit to this `History` instead of a new one.
        elapsed: resume counting from this `Elapsed`.
        metadata: any value, available to callbacks as `loop_state.metadata`.
        batch_size_fn: counts a batch's samples (default: its leading dimension).

    Example:
        >>> import ciclo
        >>> phases = [ciclo.types.Phase("add", [(ciclo.every(1), lambda state: state + 1)]),
        ...           ciclo.types.Phase("double", [(ciclo.every(2), lambda state: state * 2)])]
        >>> ciclo.run_phases(0, range(4), phases)[0]
        9
    """
    stop_period = Period.of(stop, name="stop")
    if stop_period == Period(steps=0):
        raise ValueError(
            "stop=0 would run no step: pass the number of steps to run (>= 1), a period such as "
            "ciclo.at(samples=...), or stop=None to run until the dataset ends"
        )
    if not isinstance(phases, Sequence) or not all(isinstance(phase, Phase) for phase in phases):
        raise TypeError(f"phases must be a list of ciclo.types.Phase, got {short(phases)}")
    tasks = []
    for phase in phases:
        for schedule, compiled in as_tasks(phase.tasks, f"phase {short(phase.name)}"):
            after = type(schedule) is AtStepEnd
            inner = schedule.schedule if after else schedule
            boundary = inner.step_boundary() if type(inner) is Every else None
            if boundary == (1, 0) and not after and inner.offset is None:
                boundary, inner = None, None  # every step: no schedule to check
            if compiled:
                tasks.append(_Task(inner if boundary is None else None, after, compiled, boundary))
    # The run's own callbacks wrap the tasks': they start before them and end after them.
    outer = owners(as_callback_list(callbacks, "callbacks"))
    lifecycle = owners([*outer, *(c for t in tasks for c in t.callbacks)])
    starts = [o for o in lifecycle if lifecycle_of(o, "on_start")]
    ends = [o for o in [*lifecycle[len(outer) :], *outer] if lifecycle_of(o, "on_end")]
    if history is not None and not isinstance(history, History):
        raise TypeError(f"history must be a ciclo.types.History, got {short(history)}")
    loop_state: LoopState[S] = LoopState(state, history=history, metadata=metadata)
    processes = processes_per_batch(state.strategy) if isinstance(state, AbstractManagedState) else 1
    if batch_size_fn is None and processes > 1:  # counts are global: each process feeds its part
        batch_size_fn = GlobalRows(processes)
    loop_state._clock, loop_state._stop = Clock(elapsed, batch_size_fn), stop_period
    loop_state._iterator = iterate_dataset(dataset)
    loop_state._callback_objects = by_state_key(lifecycle)
    loop_state._step_end = [o.on_step_end for o in lifecycle if lifecycle_of(o, "on_step_end")]
    start_compile_cache()  # once per process: a rerun reads the programs of this one back
    for index, callback in enumerate(starts):
        try:
            callback.on_start(loop_state)  # a backup restores here: the state, counts, iterator may change
        except BaseException as error:
            _run_end_hooks([o for o in ends if any(o is s for s in starts[:index])], loop_state, error)
            raise
    try:
        if not loop_state.stop_iteration:
            _run_steps(tasks, loop_state)
    except BaseException as error:
        _run_end_hooks(ends, loop_state, error)
        raise
    else:
        _run_end_hooks(ends, loop_state, None)
    return loop_state.state, loop_state.history, loop_state.elapsed


def _run_steps(tasks: list[_Task], loop_state: LoopState[Any]) -> None:
    """The steps; one before `quiet_until` (no scheduled task due) runs `every_step` alone."""
    stop = loop_state._stop
    steps_only = None if stop is None else only_steps(stop)
    by_steps = steps_only is not None
    stop_count, stop_at = (steps_only, None) if by_steps else (math.inf, stop)
    append, history = loop_state.history.append, loop_state.history
    clock, iterator, step_end = loop_state._clock, loop_state._iterator, loop_state._step_end
    first, origin = clock.steps, clock.origin
    every_step = [c for t in tasks if t.check is None and t.boundary is None for c in t.callbacks]
    for task in tasks:
        if task.boundary is not None:  # before the step, a boundary at `steps` fires; after it, past it
            task.due = next_boundary(clock.steps - 1 + task.after, *task.boundary)
    quiet_until: float = 0
    loop_state._in_step = True  # but in the step-end hooks
    while True:
        steps = clock.steps
        if steps >= stop_count or (stop_at is not None and clock.now() >= stop_at):
            return
        try:
            batch = next(iterator)
        except StopIteration:
            dataset_ended(steps, first, stop_count if by_steps else stop)
            return
        except Exception as error:
            dataset_raised(error, steps, first)
            raise
        loop_state.batch, loop_state._elapsed, loop_state._logs = batch, None, None
        if steps < quiet_until and type(batch) is not Stacked:
            _run_callbacks(loop_state, every_step)
        else:  # every task; `quiet_until`: the step count before which none scheduled is due
            before = after = None
            after_steps, quiet_until = steps + steps_of(batch), math.inf
            for task in tasks:
                if task.boundary is not None:
                    count = after_steps if task.after else steps
                    fires = count >= task.due
                    if fires:
                        task.due = next_boundary(count, *task.boundary)
                    quiet_until = min(quiet_until, task.due - task.after)
                    if not fires:
                        continue
                elif task.check is not None:
                    quiet_until = 0
                if task.after:
                    if after is None:
                        before = loop_state.elapsed
                        after_samples = before.samples + count_batch(batch, clock.batch_size_fn)[1]
                        after = make_elapsed(after_steps, after_samples, before.time, before.date_start)
                    if task.check is not None and not task.check(after):
                        continue
                    loop_state._elapsed = after
                    _run_callbacks(loop_state, task.callbacks)
                    loop_state._elapsed = before
                elif task.check is None or task.check(loop_state.elapsed):
                    _run_callbacks(loop_state, task.callbacks)
                if loop_state.stop_iteration:
                    break
        step_logs = loop_state._logs
        if step_logs:
            now, samples = loop_state._elapsed, clock.samples
            time = perf_counter() - origin if now is None else now.time
            per_step = loop_state._per_step
            if per_step is not None:  # a fused group: its first steps' rows, then the last's
                rows, size = batch.steps - 1, batch.samples // batch.steps
                history.append_steps(steps, samples, time, per_step, rows, size)
                steps, samples, loop_state._per_step = steps + rows, samples + rows * size, None
            append(steps, samples, time, step_logs)
        clock.advance(batch)
        if step_end:  # the hooks see the counts after it; `request_stop` adds one
            loop_state._elapsed, loop_state._in_step = None, False
            for hook in step_end:
                hook(loop_state)
            loop_state._in_step = True
        if loop_state.stop_iteration:
            return
