"""The loop engine: ordered phases of `(schedule, callbacks)` over a dataset, and `ciclo.loop`.

`run_phases` is the one engine: `ciclo.loop` is its dict front-end, and
`train_loop`, `test_loop` and `predict_loop` are phases built from the same
public pieces (`Phase`, `at_step_end`, `run_phases`), as a user's own loop is.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import signal
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, cast, final

from ciclo._src.backup import (
    Backup,
    Preempted,
    Session,
    SignalGuard,
    as_backup,
    iterator_state,
    position_dataset,
)
from ciclo._src.batches import BatchSizeFn, Stacked, count, is_stacked, steps_of
from ciclo._src.checks import DataWarning
from ciclo._src.elapsed import Clock, Elapsed, Period, PeriodLike, make_elapsed, to_period
from ciclo._src.logs import History, Logs, StackedLogs
from ciclo._src.loop_state import LoopState as LoopState
from ciclo._src.loop_state import keyed_callbacks
from ciclo._src.reprs import short
from ciclo._src.schedules import Every, ScheduleBase
from ciclo._src.step_output import describe, step_output
from ciclo._src.types import S, Schedule, StatefulCallback, Tasks

_log = logging.getLogger("ciclo")

_ARGUMENT_NAMES = ("state", "batch", "elapsed", "loop_state")

_OBJECT: Final = 5
"""The calling convention of a callback object: `obj.__loop_callback__(loop_state)`."""


@final
@dataclasses.dataclass(frozen=True, eq=False)
class AtStepEnd(ScheduleBase):
    """A schedule checked after the step, on the counts that include it; see `ciclo.at_step_end`."""

    schedule: Schedule

    def __call__(self, elapsed: Elapsed) -> bool:
        return bool(self.schedule(elapsed))


def at_step_end(schedule: Schedule) -> AtStepEnd:
    """Checks `schedule` after the step, on the counts that include the step's batch.

    A plain schedule sees the `Elapsed` from before the step (steps completed
    so far). An epoch ends *after* the step that completes it, so epoch-end
    work is scheduled `at_step_end(ciclo.every(steps_per_epoch))`: with 10
    steps per epoch it runs after steps 10, 20, ... (its callbacks see
    `elapsed.steps == 10`), never at step 0. Place such a task after the
    phase that runs the step.

    Example:
        >>> import ciclo
        >>> def train_step(state, batch):
        ...     return state + 1
        >>> def epoch_end(state, batch, elapsed):
        ...     return ciclo.logs().add_metric("epoch_end_at", elapsed.steps)
        >>> _, history, _ = ciclo.run_phases(
        ...     0,
        ...     range(7),
        ...     [
        ...         ciclo.Phase("train", [(ciclo.every(1), train_step)]),
        ...         ciclo.Phase("epoch", [(ciclo.at_step_end(ciclo.every(3)), epoch_end)]),
        ...     ],
        ... )
        >>> history.collect("epoch_end_at")
        [3, 6]
    """
    if not callable(schedule):
        raise TypeError(f"at_step_end needs a schedule (elapsed -> bool), got {short(schedule)}")
    return AtStepEnd(schedule)


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
        >>> phase = ciclo.Phase("train", [(ciclo.every(1), lambda state: state + 1)])
        >>> ciclo.run_phases(0, range(3), [phase])[0]
        3
    """

    name: str
    tasks: Sequence[tuple[Any, Any]] | Tasks


@dataclasses.dataclass(frozen=True, eq=False)
class _Callback:
    """A callback in the form the engine calls it: `kind` says which arguments `fn` takes."""

    kind: int  # 0 to 4 positional arguments of (state, batch, elapsed, loop_state), or _OBJECT
    fn: Callable[..., Any]
    source: Any

    def describe(self) -> str:
        return describe(self.source)


_BY_NAME: Final[dict[str, Callable[[LoopState[Any]], Any]]] = {
    "state": lambda loop_state: loop_state.state,
    "batch": lambda loop_state: loop_state.batch,
    "elapsed": lambda loop_state: loop_state.elapsed,
    "loop_state": lambda loop_state: loop_state,
    "logs": lambda loop_state: loop_state.logs,
}
"""What a plain function's parameter gets, by its name."""


def _plain_function(fn: Callable[..., Any]) -> _Callback:
    """`fn` in the form the engine calls: its arguments chosen by parameter name, else by position.

    A function whose positional parameters all have names of `_BY_NAME`
    (`def log(elapsed, logs)`) gets those values. Any other gets the first of
    `(state, batch, elapsed, loop_state)` positionally, as in ciclo 0.1
    (`def step(params, batch)`), unless one of its names would then get
    another value: that is refused.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"cannot read the signature of callback {short(fn)}; wrap it in a function "
            "such as `lambda state, batch: ...`"
        ) from error
    names: list[str] = []
    required = 0
    variadic = False
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            names.append(parameter.name)
            required += parameter.default is parameter.empty
        elif parameter.kind is parameter.VAR_POSITIONAL:
            variadic = True
        elif parameter.kind is parameter.KEYWORD_ONLY and parameter.default is parameter.empty:
            raise TypeError(
                f"callback {describe(fn)} has a required keyword-only argument "
                f"{short(parameter.name)}; the loop passes only positional arguments "
                f"{_ARGUMENT_NAMES}"
            )
    if variadic:
        return _Callback(len(_ARGUMENT_NAMES), fn, fn)
    if names and all(name in _BY_NAME for name in names) and names != list(_ARGUMENT_NAMES[: len(names)]):
        getters = tuple(_BY_NAME[name] for name in names)
        return _Callback(_OBJECT, lambda loop_state: fn(*(get(loop_state) for get in getters)), fn)
    if required > len(_ARGUMENT_NAMES):
        raise TypeError(
            f"callback {describe(fn)} requires {required} positional arguments, but the "
            f"loop passes at most {len(_ARGUMENT_NAMES)}: {', '.join(_ARGUMENT_NAMES)}"
        )
    arity = min(len(names), len(_ARGUMENT_NAMES))
    for index, name in enumerate(names[:arity]):
        if name in _BY_NAME and name != _ARGUMENT_NAMES[index]:
            raise TypeError(
                f"callback {describe(fn)} takes {short(name)} as argument {index + 1}, where the loop "
                f"passes {short(_ARGUMENT_NAMES[index])}: name every parameter after what it gets "
                f"({', '.join(_BY_NAME)}) to have them passed by name, or none of them"
            )
    return _Callback(arity, fn, fn)


def _is_periodic_action(obj: Any) -> bool:
    # Look clu up only if the user already imported it: ciclo never imports clu.
    module = sys.modules.get("clu.periodic_actions")
    return module is not None and isinstance(obj, module.PeriodicAction)


def _periodic_action(action: Any) -> Callable[[LoopState[Any]], None]:
    def invoke(loop_state: LoopState[Any]) -> None:
        action(loop_state.elapsed.steps)

    return invoke


def as_callback(obj: Any) -> _Callback:
    """Turns a callback object or function into the form the engine calls.

    Raises:
        TypeError: if `obj` is not a callback: not callable, or requiring more
            arguments than the loop passes.
    """
    if isinstance(obj, _Callback):
        return obj
    if getattr(type(obj), "__loop_callback__", None) is not None:
        return _Callback(_OBJECT, obj.__loop_callback__, obj)
    if _is_periodic_action(obj):
        return _Callback(_OBJECT, _periodic_action(obj), obj)
    if isinstance(obj, str):
        raise TypeError(f"{short(obj)} is a string, not a callback")
    if not callable(obj):
        raise TypeError(
            f"{short(obj)} of type {type(obj).__name__} is not a callback: pass a callable taking "
            f"0 to 4 of {_ARGUMENT_NAMES} (or any of {tuple(_BY_NAME)} by name), or an object "
            "with __loop_callback__(loop_state)"
        )
    return _plain_function(obj)


def as_callback_list(value: Any, where: str) -> list[_Callback]:
    """A callback, a list/tuple of callbacks, or None, as a list of `_Callback`s."""
    if value is None:
        return []
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    callbacks = []
    for item in items:
        try:
            callbacks.append(as_callback(item))
        except TypeError as error:
            raise TypeError(f"in {where}: {error}") from None
    return callbacks


@dataclasses.dataclass(eq=False)
class _Task:
    """A compiled task: `check` is None for a schedule that fires at every step."""

    check: Callable[[Elapsed], bool] | None
    after_step: bool
    callbacks: list[_Callback]
    # (period, offset) of an at_step_end `Every` in steps alone: checked on the step counter,
    # with no Elapsed built (train_loop's epoch end, at every step).
    steps_boundary: tuple[int, int] | None = None


def _steps_boundary(schedule: Any) -> tuple[int, int] | None:
    if type(schedule) is not Every or not _steps_only(schedule.period):
        return None
    offset = schedule.offset
    if offset is not None and not _steps_only(offset):
        return None
    return schedule.period.steps, (0 if offset is None else offset.steps)  # type: ignore[return-value]


def _steps_only(period: Period) -> bool:
    return period.steps is not None and period == Period(steps=period.steps)


def _boundaries_upto(steps: int, offset: int, period: int) -> int:
    return 0 if steps < offset else (steps - offset) // period + 1


def _fires_every_step(schedule: Any) -> bool:
    return type(schedule) is Every and schedule.period.steps == 1 and schedule.offset is None


def _compile_phase(phase: Phase) -> list[_Task]:
    if not isinstance(phase, Phase):
        raise TypeError(f"phases must be ciclo.Phase objects, got {short(phase)}")
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
        check = None if _fires_every_step(inner) else inner
        tasks.append(_Task(check, after, compiled, _steps_boundary(inner) if after else None))
    return tasks


def _owners(callbacks: Iterable[_Callback]) -> list[Any]:
    """The objects behind the callbacks, each once: a bound method `bar.on_train_batch_end` is `bar`."""
    owners: list[Any] = []
    seen: set[int] = set()
    for callback in callbacks:
        owner = getattr(callback.source, "__self__", callback.source)
        if id(owner) not in seen:
            seen.add(id(owner))
            owners.append(owner)
    return owners


def _annotate(error: BaseException, callback: _Callback, loop_state: LoopState[Any]) -> None:
    where = f" at step {loop_state.elapsed.steps}" if loop_state._now or loop_state._elapsed else ""
    add_note = getattr(error, "add_note", None)  # Python >= 3.11
    if add_note is not None:
        add_note(f"raised by callback {callback.describe()}{where}")


def _run_callbacks(loop_state: LoopState[Any], callbacks: list[_Callback]) -> None:
    """Calls `callbacks` in order, merging their logs into the step's logs.

    The hot path of every loop. A callback's output is normalised by
    `step_output`; the usual `(logs, state)` pair skips the call.
    """
    batch = loop_state.batch
    for callback in callbacks:
        kind, fn = callback.kind, callback.fn
        try:
            if kind == 2:
                out = fn(loop_state.state, batch)
            elif kind == _OBJECT:
                out = fn(loop_state)
            elif kind == 1:
                out = fn(loop_state.state)
            elif kind == 0:
                out = fn()
            elif kind == 3:
                out = fn(loop_state.state, batch, loop_state.elapsed)
            else:
                out = fn(loop_state.state, batch, loop_state.elapsed, loop_state)
        except Exception as error:
            _annotate(error, callback, loop_state)
            raise
        if (
            type(out) is tuple
            and len(out) == 2
            and type(out[0]) is Logs
            and type(out[1]) is type(loop_state.state)
        ):
            new_logs, loop_state.state = out  # what step_output would return, without the call
        else:
            try:
                new_logs, loop_state.state = step_output(out, loop_state.state, callback.source)
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


def _annotate_dataset_error(error: BaseException, steps: int, drawn: int) -> None:
    add_note = getattr(error, "add_note", None)  # Python >= 3.11
    if add_note is not None:
        add_note(
            f"raised by the dataset when the loop asked for the batch of step {steps} "
            f"({drawn} batches drawn before it in this run); the loop stopped there"
        )


def _warn_dataset_ended(drawn: int, steps: int, stop: Any) -> None:
    """Warns when the dataset yielded nothing, or ran out before `stop`."""
    if drawn == 0:
        warnings.warn(
            "the dataset yielded no batch, so the loop ran no step; check the dataset (an iterator or "
            "generator already used by an earlier loop is empty: create a fresh one for each loop)",
            DataWarning,
            stacklevel=4,
        )
    elif stop is not None:
        warnings.warn(
            f"the dataset ended after {steps} steps, before stop={short(stop)}: the loop stopped there; "
            "pass a longer or repeating dataset (one that repeats for several epochs), or a smaller stop",
            DataWarning,
            stacklevel=4,
        )


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


def run_phases(
    state: S,
    dataset: Iterable[Any],
    phases: Sequence[Phase],
    *,
    stop: PeriodLike | None = None,
    on_start: Any = None,
    on_end: Any = None,
    history: History | None = None,
    elapsed: Elapsed | None = None,
    catch_keyboard_interrupt: bool = True,
    metadata: Any = None,
    batch_size_fn: BatchSizeFn | None = None,
    backup: Backup | str | os.PathLike[str] | None = None,
    backup_every: Any = None,
) -> tuple[S, History, Elapsed]:
    """The loop engine: runs `phases` in order at each step of `dataset`.

    At each step, each phase runs its tasks in order: the callbacks of each
    schedule that fires (see `ciclo.Phase`). Each callback may return new logs
    (merged into the step's logs) and a new state. Steps that logged anything
    are committed to the history. The loop never waits for the device: logged
    arrays stay on it until they are shown or collected.

    `ciclo.loop`, `train_loop`, `test_loop` and `predict_loop` are all this
    engine with their own phases; a loop of your own (a GAN alternating a
    discriminator phase and a generator phase, say) is built the same way.

    Args:
        state: the initial state (any pytree).
        dataset: an iterable of batches.
        phases: the `ciclo.Phase`s of a step, in the order they run.
        stop: stop when this `Period` (or number of steps) is reached; otherwise
            when the dataset ends or a callback stops the loop.
        on_start: callback(s) run once, before the first step's phases (not again
            when the run resumes from a backup taken after its first step).
        on_end: callback(s) run once after the last step.
        history: commit to this `History` instead of a new one.
        elapsed: resume counting from this `Elapsed`.
        catch_keyboard_interrupt: on Ctrl-C, finish the step in flight, stop and
            return what was computed so far instead of raising (a second
            Ctrl-C raises at once).
        metadata: any value, available to callbacks as `loop_state.metadata`.
        batch_size_fn: counts the samples of a batch (default: leading dimension
            of its first array leaf).
        backup: a directory or `ciclo.backup(...)`: save what the loop needs to
            resume, and resume from it when it holds a backup (see `ciclo.backup`).
        backup_every: how often to back up when `backup` does not say (a number
            of steps, a `Period` or a schedule; default 1000 steps).

    Returns:
        `(state, history, elapsed)`: the final state, the history of logs, and
        the `Elapsed` after the last step.

    Raises:
        ciclo.Preempted: after saving the backup on SIGTERM (or on SIGINT with
            `ciclo.backup(..., sigint=True)`).

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
        ...         ciclo.Phase("discriminator", [(ciclo.every(1), discriminator_step)]),
        ...         ciclo.Phase("generator", [(ciclo.every(2), generator_step)]),
        ...     ],
        ... )
        >>> state, history.collect("d"), history.collect("g")
        (2, [0, 1, 2, 3], [0, 2])
    """
    stop_period = to_period(stop)
    if stop_period is not None and stop_period == Period(steps=0):
        raise ValueError(
            "stop=0 would run no step: pass the number of steps to run (>= 1), a period such as "
            "ciclo.at(samples=...), or stop=None to run until the dataset ends"
        )
    if isinstance(phases, Phase) or not isinstance(phases, Sequence):
        raise TypeError(f"phases must be a list of ciclo.Phase, got {short(phases)}")
    tasks = [task for phase in phases for task in _compile_phase(phase)]
    start_callbacks = as_callback_list(on_start, "on_start")
    end_callbacks = as_callback_list(on_end, "on_end")
    if history is None:
        history = History()
    elif not isinstance(history, History):
        raise TypeError(f"history must be a ciclo.History, got {short(history)}")

    every_callback = [callback for task in tasks for callback in task.callbacks]
    owners = _owners([*start_callbacks, *every_callback, *end_callbacks])
    start_hooks = [hook for hook in (getattr(owner, "__loop_start__", None) for owner in owners) if hook]
    end_hooks = [hook for hook in (getattr(owner, "__loop_end__", None) for owner in owners) if hook]
    stateful = keyed_callbacks(owner for owner in owners if isinstance(owner, StatefulCallback))
    try:
        iterator = iter(dataset)
    except TypeError:
        raise TypeError(f"dataset must be an iterable of batches, got {short(dataset)}") from None

    spec = as_backup(backup)
    session = None if spec is None else Session(spec, backup_every)
    restored = None
    if session is not None:
        try:
            restored = session.restore(state)
        except BaseException:
            session.close()
            raise
        if restored is not None:
            state, elapsed = restored.state, restored.elapsed
            history.load_host(restored.history)
            _log.info("resumed from the backup at step %d in %s", restored.step, spec.directory)  # type: ignore[union-attr]
            if restored.finished:
                session.close()
                return state, history, elapsed

    clock = Clock(elapsed, batch_size_fn)
    size_fn = clock.batch_size_fn
    loop_state: LoopState[S] = LoopState(state, history=history, metadata=metadata)
    loop_state._now = clock.now
    loop_state._callback_objects = stateful
    drawn = 0  # batches taken from the dataset: its position, for backups
    try:
        if restored is not None:
            loop_state.restore_callback_states(restored.callbacks)
            iterator = position_dataset(iterator, dataset, restored)
            drawn = restored.position
        for hook in start_hooks:  # each refuses what it can know before the first step
            hook(loop_state)
    except BaseException:
        if session is not None:
            session.close()
        raise
    guard = SignalGuard(
        sigterm=session is not None, sigint=catch_keyboard_interrupt or (spec is not None and spec.sigint)
    )
    watch = guard.active

    def save(*, finished: bool, wait: bool) -> None:
        assert session is not None
        session.save(
            loop_state.state,
            clock.now(),
            history,
            loop_state.callback_states(),
            drawn,
            iterator_state(iterator),
            finished=finished,
            wait=wait,
        )

    if session is not None and restored is None:
        # A backup of the start: a run killed before its first periodic backup resumes as a
        # resumed run too (its checkpoint callbacks then know the checkpoints are their own).
        save(finished=False, wait=False)

    # Only a stop in steps alone is checked on the counters; other periods need an Elapsed.
    stop_steps = stop_period.steps if stop_period is not None else None
    stop_by_steps_only = stop_period is not None and (
        stop_period.samples is None and stop_period.time is None and stop_period.date is None
    )
    # A run resumed after its first step does not run them again: the backed-up state is what they made
    # (test_loop's reset_step would zero the metrics accumulated before the backup).
    pending_start = start_callbacks if restored is None or restored.step == 0 else []
    append = history.append
    first_drawn, exhausted = drawn, False
    try:
        while True:
            if stop_period is not None:
                if stop_by_steps_only:
                    if clock.steps >= stop_steps:  # type: ignore[operator]
                        break
                elif clock.now() >= stop_period:
                    break
            try:
                batch = next(iterator)
            except StopIteration:
                exhausted = True
                break
            except Exception as error:
                _annotate_dataset_error(error, clock.steps, drawn - first_drawn)
                raise
            drawn += 1
            loop_state.batch = batch
            loop_state._elapsed = None
            loop_state._logs = None
            loop_state._owns_logs = False
            if pending_start:
                _run_callbacks(loop_state, pending_start)
                pending_start = []
            before: Elapsed | None = None
            for task in tasks:
                if task.after_step:
                    boundary = task.steps_boundary
                    if boundary is not None:
                        period, offset = boundary
                        done = clock.steps + steps_of(batch)
                        if _boundaries_upto(done, offset, period) <= _boundaries_upto(
                            clock.steps, offset, period
                        ):
                            continue
                    if before is None:
                        before = loop_state.elapsed
                    after = _after_step(before, batch, size_fn)
                    if boundary is None and task.check is not None and not task.check(after):
                        continue
                    loop_state._elapsed = after
                    _run_callbacks(loop_state, task.callbacks)
                    loop_state._elapsed = before
                else:
                    if task.check is not None and not task.check(loop_state.elapsed):
                        continue
                    _run_callbacks(loop_state, task.callbacks)
                if loop_state.stop_iteration:
                    break
            step_logs = loop_state._logs
            if step_logs:
                if loop_state._per_step is None and loop_state._elapsed is None:
                    append(clock.steps, clock.samples, clock.seconds(), step_logs)
                else:
                    _commit(history, loop_state, clock, step_logs)
            clock.advance(batch)
            if loop_state.stop_iteration:
                break
            if watch and guard.requested(clock.steps):
                signum = guard.signum
                if session is not None and (signum != signal.SIGINT or spec.sigint):  # type: ignore[union-attr]
                    save(finished=False, wait=True)
                    raise Preempted(signum, clock.steps)  # type: ignore[arg-type]
                raise KeyboardInterrupt
            if session is not None and session.due(clock.steps, clock.now):
                save(finished=False, wait=False)

        if exhausted:
            _warn_dataset_ended(drawn - first_drawn, clock.steps, stop)
        loop_state._elapsed = clock.now()
        loop_state._logs = None
        loop_state._ended = True
        _run_callbacks(loop_state, end_callbacks)
        if session is not None:
            save(finished=True, wait=True)
    except KeyboardInterrupt:
        # A second Ctrl-C (during a preemption save, say) is the user insisting: it is never caught.
        if not catch_keyboard_interrupt or guard.forced:
            raise
        _log.warning("KeyboardInterrupt: loop stopped at step %d", clock.steps)
    finally:
        loop_state._elapsed = clock.now()
        loop_state._ended = True
        try:
            for hook in end_hooks:
                hook(loop_state)
        finally:
            try:
                if session is not None:
                    session.close()
            finally:
                # Released last: a Ctrl-C while the end hooks or the last save finish only sets the flag.
                guard.release()
    return loop_state.state, history, loop_state.elapsed


def loop(
    state: S,
    dataset: Iterable[Any],
    tasks: Tasks,
    *,
    stop: PeriodLike | None = None,
    on_start: Any = None,
    on_end: Any = None,
    history: History | None = None,
    elapsed: Elapsed | None = None,
    catch_keyboard_interrupt: bool = True,
    metadata: Any = None,
    batch_size_fn: BatchSizeFn | None = None,
    backup: Backup | str | os.PathLike[str] | None = None,
) -> tuple[S, History, Elapsed]:
    """Runs `tasks` over `dataset`: at each step, the callbacks of each schedule that fires.

    At each step the loop goes through `tasks` in dict order and, for each
    schedule that fires, calls its callbacks in list order. Each callback may
    return new logs (merged into the step's logs) and a new state. Steps that
    logged anything are committed to the history. The loop never waits for the
    device: logged arrays stay on it until they are shown or collected.

    `loop` is the dict front-end of the engine, `ciclo.run_phases`: the tasks
    form one `ciclo.Phase`.

    Args:
        state: the initial state (any pytree).
        dataset: an iterable of batches.
        tasks: `{schedule: callback or [callbacks]}`. A callback is an object with
            `__loop_callback__(loop_state)`, or a callable taking 0 to 4 of
            `(state, batch, elapsed, loop_state)`. Both return `(logs, state)`,
            `logs`, `state` or `None` (no logs, the state unchanged).
        stop: stop when this `Period` (or number of steps) is reached; otherwise
            when the dataset ends or a callback stops the loop.
        on_start: callback(s) run once, before the first step's tasks.
        on_end: callback(s) run once after the last step.
        history: commit to this `History` instead of a new one.
        elapsed: resume counting from this `Elapsed`.
        catch_keyboard_interrupt: on Ctrl-C, stop and return what was computed so
            far instead of raising.
        metadata: any value, available to callbacks as `loop_state.metadata`.
        batch_size_fn: counts the samples of a batch (default: leading dimension
            of its first array leaf).
        backup: a directory or `ciclo.backup(directory, every=...)`: back up
            (every 1000 steps by default, at the end and on SIGTERM) and resume
            from the backup found there.

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
    return run_phases(
        state,
        dataset,
        [Phase("tasks", tasks)],
        stop=stop,
        on_start=on_start,
        on_end=on_end,
        history=history,
        elapsed=elapsed,
        catch_keyboard_interrupt=catch_keyboard_interrupt,
        metadata=metadata,
        batch_size_fn=batch_size_fn,
        backup=backup,
    )
