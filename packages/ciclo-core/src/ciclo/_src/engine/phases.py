"""The loop engine: ordered phases of `(schedule, callbacks)` over a dataset.

`run_phases` is the one engine: `ciclo.loop` is its dict front-end, and
`train_loop`, `test_loop` and `predict_loop` are phases built from the same
public pieces (`Phase`, `at_step_end`, `run_phases`), as a user's own loop is.
It calls `ciclo.Callback`s only (the door, `ciclo._src.engine.door`, makes them)
and knows no backup, signal or hook name: those are callbacks too.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from time import perf_counter
from typing import Any, cast, final

from ciclo._src.base.batches import BatchSizeFn, Stacked, count, is_stacked, steps_of
from ciclo._src.base.elapsed import Clock, Elapsed, Period, PeriodLike, make_elapsed, to_period
from ciclo._src.base.reprs import short
from ciclo._src.base.schedules import AtStepEnd, Every, next_boundary
from ciclo._src.base.types import S
from ciclo._src.data.position import dataset_ended, dataset_raised, iterate_dataset
from ciclo._src.engine.callback import Callback, Tasks
from ciclo._src.engine.door import as_callback_list, lifecycle_of, owners
from ciclo._src.engine.loop_state import LoopState as LoopState
from ciclo._src.engine.loop_state import keyed_callbacks
from ciclo._src.logs.logs import History, Logs, StackedLogs
from ciclo._src.logs.step_output import describe, step_output


@final
@dataclasses.dataclass(frozen=True)
class Phase:
    """A named group of tasks that runs at each step, after the phases before it.

    Each task is `(schedule, callbacks)`: at each step, for each task in order,
    when the schedule fires, its callbacks run in order. A schedule wrapped in
    `ciclo.at_step_end` is checked on the counts that include the step.

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
    """A compiled task: how its schedule is checked, and its callbacks.

    A schedule `Every` in steps alone (the usual `every(N)`, and the epoch ends
    of `train_loop`) is checked on the step counter: `boundary` is its
    `(period, offset)`, and `due` the count at which it next fires (set when
    the loop starts). `check` is any other schedule, called with an `Elapsed`;
    a task with neither fires at every step.
    """

    check: Callable[[Elapsed], bool] | None
    after_step: bool
    callbacks: list[Callback]
    boundary: tuple[int, int] | None = None
    due: int = 0

    def start(self, steps: int) -> None:
        """Sets `due` for a loop whose counter starts at `steps` (before its first step)."""
        if self.boundary is not None:
            # Before the step, a boundary at `steps` itself fires; after it, only those past `steps`.
            self.due = next_boundary(steps if self.after_step else steps - 1, *self.boundary)


def _compile_phase(phase: Phase) -> list[_Task]:
    if not isinstance(phase, Phase):
        raise TypeError(f"phases must be ciclo.types.Phase objects, got {short(phase)}")
    items = phase.tasks.items() if isinstance(phase.tasks, Mapping) else phase.tasks
    tasks = []
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError(
                f"phase {short(phase.name)}: a task is a (schedule, callbacks) pair, got {short(item)}"
            )
        schedule, callbacks = item
        if isinstance(schedule, str):
            raise ValueError(
                f"named schedule {short(schedule)} is only understood by ciclo.train_loop, "
                "test_loop and predict_loop; ciclo.loop takes schedules such as ciclo.every(1)"
            )
        if not callable(schedule):
            raise TypeError(
                f"task key {short(schedule)} is not a schedule: use a callable elapsed -> bool "
                "such as ciclo.every(1)"
            )
        compiled = as_callback_list(callbacks, f"phase {short(phase.name)}, task {short(schedule)}")
        if not compiled:
            continue
        after = type(schedule) is AtStepEnd
        inner = schedule.schedule if after else schedule
        boundary = inner.step_boundary() if type(inner) is Every else None
        if boundary == (1, 0) and not after and inner.offset is None:
            tasks.append(_Task(None, after, compiled))  # every step: no schedule to check
            continue
        tasks.append(_Task(inner if boundary is None else None, after, compiled, boundary))
    return tasks


def _annotate(error: BaseException, callback: Callback, loop_state: LoopState[Any]) -> None:
    where = f" at step {loop_state.elapsed.steps}" if loop_state._now or loop_state._elapsed else ""
    error.add_note(f"raised by callback {describe(callback)}{where}")


def _run_callbacks(loop_state: LoopState[Any], callbacks: list[Callback]) -> None:
    """Calls `callbacks` in order, merging their logs into the step's logs.

    The hot path of every loop. A callback's output is normalised by
    `step_output`; the usual `(logs, state)` pair skips the call.
    """
    for callback in callbacks:
        try:
            out = callback.__loop_callback__(loop_state)
        except Exception as error:
            _annotate(error, callback, loop_state)
            raise
        if out is None:
            new_logs = None  # no logs, the state unchanged: what step_output would say, without the call
        elif (
            type(out) is tuple
            and len(out) == 2
            and type(out[0]) is Logs
            and type(out[1]) is type(loop_state.state)
        ):
            new_logs, loop_state.state = out  # what step_output would return, without the call
        else:
            try:
                new_logs, loop_state.state = step_output(out, loop_state.state, callback)
            except (TypeError, ValueError) as error:
                _annotate(error, callback, loop_state)
                raise
        if new_logs:
            if type(new_logs) is StackedLogs:
                _hold_steps(loop_state, new_logs)
            logs = loop_state._logs
            if not logs:
                # Held as it came (a callback's own object): copied before anything is merged into it.
                loop_state._logs = new_logs
                loop_state._owns_logs = False
            else:
                if not loop_state._owns_logs:
                    logs = loop_state._logs = Logs(logs)
                    loop_state._owns_logs = True
                cast(Logs, logs).merge(new_logs)
        if loop_state.stop_iteration:
            return


def _hold_steps(loop_state: LoopState[Any], logs: StackedLogs) -> None:
    """Keeps a fused group's per-step logs: the history gets an entry per step of the group."""
    if not is_stacked(loop_state.batch):
        return  # a step that stacks logs of its own: its last step's logs stand for the step
    held = loop_state._per_step
    loop_state._per_step = logs.per_step if held is None else Logs(held).merge(logs.per_step)


def _commit(history: History, loop_state: LoopState[Any], clock: Clock, logs: Any) -> None:
    now = loop_state._elapsed
    if now is None:
        steps, samples, time = clock.steps, clock.samples, clock.seconds()
    else:
        steps, samples, time = now.steps, now.samples, now.time
    per_step = loop_state._per_step
    if per_step is not None:
        group: Stacked[Any] = loop_state.batch
        rows, batch_size = group.steps - 1, group.samples // group.steps
        history.append_steps(steps, samples, time, per_step, rows, batch_size)
        steps, samples = steps + rows, samples + rows * batch_size
        loop_state._per_step = None
    history.append(steps, samples, time, logs)


def _after_step(before: Elapsed, batch: Any, batch_size_fn: BatchSizeFn) -> Elapsed:
    steps, samples = count(batch, batch_size_fn)
    return make_elapsed(before.steps + steps, before.samples + samples, before.time, before.date_start)


@dataclasses.dataclass
class _Plan:
    """A loop's callbacks, compiled once when it is built: its tasks and the lifecycle methods to call."""

    tasks: list[_Task]
    start_hooks: list[Callback]
    step_end_hooks: list[Callable[[LoopState[Any]], None]]
    end_hooks: list[Callback]
    stateful: dict[str, Any]
    every_step: list[Callback]
    """The callbacks of the tasks that fire at every step, in order: all a quiet step runs."""

    def start(self, steps: int) -> float:
        """Sets each task's next boundary for a loop starting at `steps`; returns `quiet_until()`."""
        for task in self.tasks:
            task.start(steps)
        return self.quiet_until()

    def quiet_until(self) -> float:
        """The step count before which no step runs a scheduled task (0 with a schedule of another kind).

        A task checked after the step fires at the step that ends at its boundary,
        which starts one count before it.
        """
        until = math.inf
        for task in self.tasks:
            if task.boundary is not None:
                until = min(until, task.due - 1 if task.after_step else task.due)
            elif task.check is not None:
                return 0
        return until

    @classmethod
    def build(cls, phases: Sequence[Phase], callbacks: Any) -> _Plan:
        if isinstance(phases, Phase) or not isinstance(phases, Sequence):
            raise TypeError(f"phases must be a list of ciclo.types.Phase, got {short(phases)}")
        tasks = [task for phase in phases for task in _compile_phase(phase)]
        # The run's own callbacks wrap the tasks': they start before them and end after them.
        outer = owners(as_callback_list(callbacks, "callbacks"))
        inner = owners(callback for task in tasks for callback in task.callbacks)
        inner = [callback for callback in inner if all(callback is not o for o in outer)]
        lifecycle = [*outer, *inner]
        return cls(
            tasks,
            [o for o in lifecycle if lifecycle_of(o, "on_start")],
            [o.on_step_end for o in lifecycle if lifecycle_of(o, "on_step_end")],
            [o for o in [*inner, *outer] if lifecycle_of(o, "on_end")],
            keyed_callbacks(o for o in lifecycle if lifecycle_of(o, "state_dict")),
            [
                callback
                for task in tasks
                if task.check is None and task.boundary is None
                for callback in task.callbacks
            ],
        )

    def run_start_hooks(self, loop_state: LoopState[Any]) -> None:
        """Runs every `on_start`; if one raises, those that ran get `on_end(loop_state, error)`."""
        for index, callback in enumerate(self.start_hooks):
            try:
                callback.on_start(loop_state)
            except BaseException as error:
                started = self.start_hooks[:index]
                _run_end_hooks([o for o in self.end_hooks if any(o is s for s in started)], loop_state, error)
                raise


def _run_end_hooks(
    callbacks: list[Callback], loop_state: LoopState[Any], error: BaseException | None
) -> bool:
    """Calls `on_end(loop_state, error)` of each of `callbacks` (loggers flush, checkpoints finish).

    `error` is what ended the loop (None when it ended by itself). Returns
    whether one of them returned True: the loop then returns normally (as a
    context manager's `__exit__`). The first error a callback raises is
    what the callbacks after it see (a backup then claims no finished run),
    and is raised once every callback ran.
    """
    loop_state._elapsed, loop_state._logs, loop_state._ended = loop_state._clock.now(), None, True
    failed: BaseException | None = None
    taken = False
    for callback in callbacks:
        try:
            taken = bool(callback.on_end(loop_state, error or failed)) or taken
        except BaseException as raised:  # noqa: BLE001 - re-raised once the other callbacks ran
            failed = failed or raised
    if failed is not None:
        raise failed
    return taken


def _check_stop(stop: PeriodLike | None) -> Period | None:
    period = to_period(stop)
    if period is not None and period == Period(steps=0):
        raise ValueError(
            "stop=0 would run no step: pass the number of steps to run (>= 1), a period such as "
            "ciclo.at(samples=...), or stop=None to run until the dataset ends"
        )
    return period


def _as_history(history: History | None) -> History:
    if history is None:
        return History()
    if not isinstance(history, History):
        raise TypeError(f"history must be a ciclo.types.History, got {short(history)}")
    return history


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
    """The loop engine: at each step of `dataset`, runs the `ciclo.types.Phase`s in order.

    `ciclo.loop`, the predefined loops and a loop of your own (a GAN alternating
    two phases, say) are this engine with their own phases.

    The life of a run: every `ciclo.Callback`'s `on_start(loop_state)` (those
    of `callbacks` first), the steps, each followed by every
    `on_step_end(loop_state)`, then every `on_end(loop_state, error)` (those
    of `callbacks` last). A callback that stops the loop in `on_start` (a
    backup of a finished run) leaves no step to run.

    Args:
        state: the initial state (any pytree).
        dataset: an iterable of batches.
        phases: the `ciclo.types.Phase`s of a step, in the order they run.
        callbacks: the run's own callbacks, whose lifecycle wraps the tasks':
            `ciclo.backup(...).callback(...)`, say.
        stop: stop at this `Period` or number of steps (else at the dataset's end).
        history: commit to this `History` instead of a new one.
        elapsed: resume counting from this `Elapsed`.
        metadata: any value, available to callbacks as `loop_state.metadata`.
        batch_size_fn: counts a batch's samples (default: its leading dimension).

    Returns:
        `(state, history, elapsed)` after the last step.

    Example:
        >>> import ciclo
        >>> def discriminator_step(state, batch):
        ...     return ciclo.logs().add_metric("d", batch), state
        >>> def generator_step(state, batch):
        ...     return ciclo.logs().add_metric("g", batch), state + 1
        >>> state, history, elapsed = ciclo.run_phases(
        ...     0,
        ...     range(4),
        ...     [
        ...         ciclo.types.Phase("discriminator", [(ciclo.every(1), discriminator_step)]),
        ...         ciclo.types.Phase("generator", [(ciclo.every(2), generator_step)]),
        ...     ],
        ... )
        >>> state, history.collect("d"), history.collect("g")
        (2, [0, 1, 2, 3], [0, 2])
    """
    stop_period = _check_stop(stop)
    plan = _Plan.build(phases, callbacks)
    clock = Clock(elapsed, batch_size_fn)
    loop_state: LoopState[S] = LoopState(state, history=_as_history(history), metadata=metadata)
    loop_state._clock, loop_state._now, loop_state._stop = clock, clock.now, stop_period
    loop_state._dataset, loop_state._iterator = dataset, iterate_dataset(dataset)
    loop_state._callback_objects, loop_state._step_end = plan.stateful, plan.step_end_hooks
    plan.run_start_hooks(loop_state)  # a backup restores here: the state, counts, iterator may change
    try:
        if not loop_state.stop_iteration:
            _run_steps(plan, loop_state, stop_period)
    except BaseException as error:
        if not _run_end_hooks(plan.end_hooks, loop_state, error):
            raise
    else:
        _run_end_hooks(plan.end_hooks, loop_state, None)
    loop_state._elapsed = loop_state._clock.now()
    return loop_state.state, loop_state.history, loop_state.elapsed


def _run_steps(plan: _Plan, loop_state: LoopState[Any], stop: Period | None) -> None:
    """The steps: draws each batch, runs the tasks, commits the logs, runs the step-end hooks.

    The hot path of every loop. A step before which no scheduled task is due
    (`plan.quiet_until`, on the step counter) runs the callbacks of the tasks
    that fire at every step (`plan.every_step`) with no schedule checked and no
    `Elapsed` built; other steps go through `_run_tasks`.
    """
    # Only a stop in steps alone is checked on the counters; other periods need an Elapsed.
    steps_only = stop is not None and (stop.samples, stop.time, stop.date) == (None, None, None)
    stop_steps = stop.steps if steps_only else None  # type: ignore[union-attr]
    stop_at = None if stop is None or stop_steps is not None else stop
    stop_count = math.inf if stop_steps is None else stop_steps
    append, history = loop_state.history.append, loop_state.history
    clock, iterator, drawn = loop_state._clock, loop_state._iterator, loop_state._drawn
    first_drawn, tasks, every_step, step_end = drawn, plan.tasks, plan.every_step, loop_state._step_end
    quiet_until = plan.start(clock.steps)
    origin = clock.origin
    try:
        while True:
            steps = clock.steps
            if steps >= stop_count or (stop_at is not None and clock.now() >= stop_at):
                return
            try:
                batch = next(iterator)
            except StopIteration:
                dataset_ended(drawn - first_drawn, steps, stop if stop_steps is None else stop_steps)
                return
            except Exception as error:
                dataset_raised(error, steps, drawn - first_drawn)
                raise
            drawn += 1
            loop_state.batch = batch
            loop_state._elapsed = None
            loop_state._logs = None  # whether the loop owns the logs is set with them (`_run_callbacks`)
            stacked = type(batch) is Stacked
            if steps < quiet_until and not stacked:
                _run_callbacks(loop_state, every_step)
            else:
                _run_tasks(tasks, loop_state, clock, batch)
                quiet_until = plan.quiet_until()
            step_logs = loop_state._logs
            if step_logs:
                if loop_state._per_step is None and loop_state._elapsed is None:
                    append(steps, clock.samples, perf_counter() - origin, step_logs)
                else:
                    _commit(history, loop_state, clock, step_logs)
            clock.advance(batch)
            if step_end:
                loop_state._drawn, loop_state._elapsed = drawn, None  # the hooks see the counts after it
                for hook in step_end:
                    hook(loop_state)
            if loop_state.stop_iteration:
                return
    finally:
        loop_state._drawn = drawn


def _run_tasks(tasks: list[_Task], loop_state: LoopState[Any], clock: Clock, batch: Any) -> None:
    """One step's tasks: those whose schedule fires, on the counts before the step (at_step_end: after)."""
    before: Elapsed | None = None
    steps = clock.steps
    after_steps = steps + steps_of(batch)
    for task in tasks:
        if task.boundary is not None:
            count = after_steps if task.after_step else steps
            if count < task.due:
                continue
            task.due = next_boundary(count, *task.boundary)
        if task.after_step:
            if before is None:
                before = loop_state.elapsed
            after = _after_step(before, batch, clock.batch_size_fn)
            if task.check is not None and not task.check(after):
                continue
            loop_state._elapsed = after
            _run_callbacks(loop_state, task.callbacks)
            loop_state._elapsed = before
        else:
            if task.check is not None and not task.check(loop_state.elapsed):
                continue
            _run_callbacks(loop_state, task.callbacks)
        if loop_state.stop_iteration:
            return
