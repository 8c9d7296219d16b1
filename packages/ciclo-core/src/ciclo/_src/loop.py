"""The loop language: `ciclo.loop` runs callbacks on schedules over a dataset."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import sys
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Generic

from ciclo._src.batches import BatchSizeFn
from ciclo._src.elapsed import Clock, Elapsed, PeriodLike, to_period
from ciclo._src.logs import History, Logs, LogsLike
from ciclo._src.types import CallbackOutput, S, Tasks

_log = logging.getLogger("ciclo")

_EMPTY: LogsLike = MappingProxyType({})

_ARGUMENT_NAMES = ("state", "batch", "elapsed", "loop_state")


@dataclasses.dataclass(eq=False)
class LoopState(Generic[S]):
    """Everything a callback object can see and change while a loop runs.

    Attributes:
        state: the current state.
        batch: the current batch.
        history: the `History` the loop commits to.
        elapsed: the `Elapsed` of the current step.
        logs: the logs of the current step so far.
        accumulated_logs: every entry logged since the loop started, latest value
            of each (monitors such as early stopping read test metrics here).
        metadata: whatever was passed as `metadata` to the loop.
        stop_iteration: set to True (or call `stop()`) to end the loop after the
            current callback.
    """

    state: S
    batch: Any
    history: History
    elapsed: Elapsed
    logs: Logs
    accumulated_logs: Logs
    metadata: Any = None
    stop_iteration: bool = False

    def stop(self) -> None:
        """Ends the loop once the current callback returns."""
        self.stop_iteration = True


Invoker = Callable[[LoopState[Any]], CallbackOutput[Any]]


@dataclasses.dataclass(frozen=True, eq=False)
class _Callback:
    """A callback in the form the loop calls: `invoke(loop_state) -> (logs, state)`."""

    invoke: Invoker
    source: Any

    def describe(self) -> str:
        return _describe(self.source)


def _describe(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    return f"{name}" if isinstance(name, str) else repr(obj)


def standardize_output(output: Any, state: Any, source: Any) -> CallbackOutput[Any]:
    """Normalizes a callback's return value to `(logs, state)`.

    Accepted forms: `(logs, state)` (either may be None), `logs` (a dict),
    `state` (anything else), or `None`.
    """
    if output is None:
        return _EMPTY, state
    if type(output) is tuple:
        if len(output) != 2:
            raise ValueError(
                f"callback {_describe(source)} returned a tuple of length {len(output)}; "
                "a callback returns (logs, state), logs, state or None"
            )
        logs, new_state = output
        return (_EMPTY if logs is None else logs), (state if new_state is None else new_state)
    if isinstance(output, dict):
        return output, state
    return _EMPTY, output


def _positional_arity(fn: Callable[..., Any]) -> int:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"cannot read the signature of callback {fn!r}; wrap it in a function "
            "such as `lambda state, batch: ...`"
        ) from error
    positional = required = 0
    variadic = False
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            positional += 1
            required += parameter.default is parameter.empty
        elif parameter.kind is parameter.VAR_POSITIONAL:
            variadic = True
        elif parameter.kind is parameter.KEYWORD_ONLY and parameter.default is parameter.empty:
            raise TypeError(
                f"callback {_describe(fn)} has a required keyword-only argument "
                f"{parameter.name!r}; the loop passes only positional arguments "
                f"{_ARGUMENT_NAMES}"
            )
    if required > len(_ARGUMENT_NAMES):
        raise TypeError(
            f"callback {_describe(fn)} requires {required} positional arguments, but the "
            f"loop passes at most {len(_ARGUMENT_NAMES)}: {', '.join(_ARGUMENT_NAMES)}"
        )
    return len(_ARGUMENT_NAMES) if variadic else min(positional, len(_ARGUMENT_NAMES))


def _function_invoker(fn: Callable[..., Any]) -> Invoker:
    arity = _positional_arity(fn)
    if arity == 0:
        return lambda ls: standardize_output(fn(), ls.state, fn)
    if arity == 1:
        return lambda ls: standardize_output(fn(ls.state), ls.state, fn)
    if arity == 2:
        return lambda ls: standardize_output(fn(ls.state, ls.batch), ls.state, fn)
    if arity == 3:
        return lambda ls: standardize_output(fn(ls.state, ls.batch, ls.elapsed), ls.state, fn)
    return lambda ls: standardize_output(fn(ls.state, ls.batch, ls.elapsed, ls), ls.state, fn)


def _periodic_action_invoker(action: Any) -> Invoker:
    def invoke(ls: LoopState[Any]) -> CallbackOutput[Any]:
        action(ls.elapsed.steps)
        return _EMPTY, ls.state

    return invoke


def _is_periodic_action(obj: Any) -> bool:
    # Look clu up only if the user already imported it: ciclo never imports clu.
    module = sys.modules.get("clu.periodic_actions")
    return module is not None and isinstance(obj, module.PeriodicAction)


def as_callback(obj: Any) -> _Callback:
    """Turns a callback object or function into the form the loop calls.

    Raises:
        TypeError: if `obj` is not a callback: not callable, or requiring more
            arguments than the loop passes.
    """
    if isinstance(obj, _Callback):
        return obj
    hook = getattr(type(obj), "__loop_callback__", None)
    if hook is not None:
        return _Callback(obj.__loop_callback__, obj)
    if _is_periodic_action(obj):
        return _Callback(_periodic_action_invoker(obj), obj)
    if isinstance(obj, str):
        raise TypeError(f"{obj!r} is a string, not a callback")
    if not callable(obj):
        raise TypeError(
            f"{obj!r} of type {type(obj).__name__} is not a callback: pass a callable taking "
            f"0 to 4 of {_ARGUMENT_NAMES}, or an object with __loop_callback__(loop_state)"
        )
    return _Callback(_function_invoker(obj), obj)


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


def compile_tasks(tasks: Tasks) -> list[tuple[Callable[[Elapsed], bool], list[_Callback]]]:
    """Validates `tasks` and turns it into (schedule, callbacks) pairs, in dict order."""
    if not isinstance(tasks, Mapping):
        raise TypeError(f"tasks must be a dict of schedule -> callbacks, got {tasks!r}")
    compiled = []
    for schedule, callbacks in tasks.items():
        if isinstance(schedule, str):
            raise ValueError(
                f"named schedule {schedule!r} is only understood by ciclo.train_loop, "
                "test_loop and predict_loop; ciclo.loop takes schedules such as ciclo.every(1)"
            )
        if not callable(schedule):
            raise TypeError(
                f"task key {schedule!r} is not a schedule: use a callable elapsed -> bool "
                "such as ciclo.every(1)"
            )
        compiled_callbacks = as_callback_list(callbacks, f"tasks[{schedule!r}]")
        if compiled_callbacks:
            compiled.append((schedule, compiled_callbacks))
    return compiled


def end_hooks(callback_lists: Iterable[list[_Callback]]) -> list[Callable[[LoopState[Any]], Any]]:
    """The `__loop_end__` hooks of the callbacks' objects, each object once."""
    hooks: list[Callable[[LoopState[Any]], Any]] = []
    seen: set[int] = set()
    for callbacks in callback_lists:
        for callback in callbacks:
            # A bound method such as `bar.on_train_batch_end` ends with its object.
            owner = getattr(callback.source, "__self__", callback.source)
            hook = getattr(owner, "__loop_end__", None)
            if hook is not None and id(owner) not in seen:
                seen.add(id(owner))
                hooks.append(hook)
    return hooks


def run_callbacks(loop_state: LoopState[Any], callbacks: list[_Callback]) -> None:
    """Calls `callbacks` in order, merging their logs into the step's and the accumulated logs.

    Stops early when a callback stops the loop. An error raised by a callback gets
    a note naming the callback and the step.
    """
    step_logs, accumulated = loop_state.logs, loop_state.accumulated_logs
    for callback in callbacks:
        try:
            new_logs, loop_state.state = callback.invoke(loop_state)
        except Exception as error:
            _annotate(error, callback, loop_state.elapsed)
            raise
        if new_logs:
            step_logs.merge(new_logs)
            accumulated.merge(new_logs)
        if loop_state.stop_iteration:
            break


def _annotate(error: BaseException, callback: _Callback, elapsed: Elapsed) -> None:
    note = f"raised by callback {callback.describe()} at step {elapsed.steps}"
    add_note = getattr(error, "add_note", None)  # Python >= 3.11
    if add_note is not None:
        add_note(note)


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
) -> tuple[S, History, Elapsed]:
    """Runs `tasks` over `dataset`: at each step, the callbacks of each schedule that fires.

    At each step the loop goes through `tasks` in dict order and, for each
    schedule that fires, calls its callbacks in list order. Each callback may
    return new logs (merged into the step's logs) and a new state. Steps that
    logged anything are committed to the history. The loop never waits for the
    device: logged arrays stay on it until they are shown or collected.

    Args:
        state: the initial state (any pytree).
        dataset: an iterable of batches.
        tasks: `{schedule: callback or [callbacks]}`. A callback is an object with
            `__loop_callback__(loop_state)`, or a callable taking 0 to 4 of
            `(state, batch, elapsed, loop_state)` and returning `(logs, state)`,
            `logs`, `state` or `None`.
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
    stop_period = to_period(stop)
    schedule_callbacks = compile_tasks(tasks)
    start_callbacks = as_callback_list(on_start, "on_start")
    end_callbacks = as_callback_list(on_end, "on_end")
    hooks = end_hooks([start_callbacks, end_callbacks, *(cbs for _, cbs in schedule_callbacks)])
    if history is None:
        history = History()
    elif not isinstance(history, History):
        raise TypeError(f"history must be a ciclo.History, got {history!r}")

    clock = Clock(elapsed, batch_size_fn)
    accumulated = Logs()
    loop_state: LoopState[S] = LoopState(
        state=state,
        batch=None,
        history=history,
        elapsed=clock.now(),
        logs=Logs(),
        accumulated_logs=accumulated,
        metadata=metadata,
    )
    try:
        iterator = iter(dataset)
    except TypeError:
        raise TypeError(f"dataset must be an iterable of batches, got {dataset!r}") from None
    pending_start = start_callbacks
    try:
        while True:
            now = clock.now()
            if stop_period is not None and now >= stop_period:
                break
            try:
                batch = next(iterator)
            except StopIteration:
                break
            loop_state.elapsed = now
            loop_state.batch = batch
            step_logs = loop_state.logs = Logs()
            if pending_start:
                run_callbacks(loop_state, pending_start)
                pending_start = []
            for schedule, callbacks in schedule_callbacks:
                if schedule(now):
                    run_callbacks(loop_state, callbacks)
                    if loop_state.stop_iteration:
                        break
            if step_logs:
                history.commit(now, step_logs)
            clock.advance(batch)
            if loop_state.stop_iteration:
                break

        loop_state.elapsed = clock.now()
        loop_state.logs = Logs()
        run_callbacks(loop_state, end_callbacks)
    except KeyboardInterrupt:
        if not catch_keyboard_interrupt:
            raise
        _log.warning("KeyboardInterrupt: loop stopped at step %d", clock.steps)
    finally:
        loop_state.elapsed = clock.now()
        for hook in hooks:
            hook(loop_state)
    return loop_state.state, history, loop_state.elapsed
