"""The hook vocabulary: the names predefined loops run callbacks under, and how they are collected.

A hook name is a string. In a loop's tasks dict it is a named schedule
(`{ciclo.on_train_step: [step]}`); on a state it names a method the loop calls
(`state.train_step`); on an object in `callbacks=[...]` it names a method the
loop registers (`keras_bar` has `on_train_batch_end`). `collect` gathers all
three for a set of names: `train_loop`, `test_loop` and `predict_loop` use it,
and so can a loop of your own built on `ciclo.run_phases`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from ciclo._src.reprs import short

on_train_step: Final = "on_train_step"
train_step: Final = "train_step"
on_reset_step: Final = "on_reset_step"
reset_step: Final = "reset_step"
on_train_begin: Final = "on_train_begin"
on_train_end: Final = "on_train_end"
on_epoch_end: Final = "on_epoch_end"
on_train_batch_begin: Final = "on_train_batch_begin"
on_train_batch_end: Final = "on_train_batch_end"
on_test_step: Final = "on_test_step"
test_step: Final = "test_step"
on_test_batch_begin: Final = "on_test_batch_begin"
on_test_batch_end: Final = "on_test_batch_end"
on_test_begin: Final = "on_test_begin"
on_test_end: Final = "on_test_end"
on_predict_step: Final = "on_predict_step"
predict_step: Final = "predict_step"
on_predict_batch_begin: Final = "on_predict_batch_begin"
on_predict_batch_end: Final = "on_predict_batch_end"
on_predict_begin: Final = "on_predict_begin"
on_predict_end: Final = "on_predict_end"

# What each predefined loop understands; the order is only that of error messages.
TRAIN: Final = (
    on_train_step,
    train_step,
    on_reset_step,
    reset_step,
    on_train_begin,
    on_train_end,
    on_epoch_end,
    on_train_batch_begin,
    on_train_batch_end,
)
TEST: Final = (
    on_test_step,
    test_step,
    on_reset_step,
    reset_step,
    on_test_batch_begin,
    on_test_batch_end,
    on_test_begin,
    on_test_end,
)
PREDICT: Final = (
    on_predict_step,
    predict_step,
    on_predict_batch_begin,
    on_predict_batch_end,
    on_predict_begin,
    on_predict_end,
)

Named = dict[str, list[Any]]


def collect(
    names: Iterable[str],
    tasks: Mapping[Any, Any] | None = None,
    *,
    state: Any = None,
    callbacks: Iterable[Any] | None = None,
    loop_name: str = "this loop",
) -> tuple[Named, dict[Any, Any]]:
    """The callbacks of each hook name in `names`, and the rest of `tasks`.

    For each name, in this order: the method of that name of `state`'s class
    (unbound, so the loop passes the current state as `self`), the tasks given
    under that name in `tasks`, then the methods of that name of the objects
    in `callbacks`. A string key of `tasks` not in `names`, or a callback
    object with none of the names, is refused.

    Args:
        names: the hook names the loop runs.
        tasks: `{hook name or schedule: callbacks}`, as a loop receives it.
        state: the loop's initial state, whose methods named in `names` are hooks.
        callbacks: objects whose methods named in `names` are hooks.
        loop_name: the loop's name, for error messages.

    Returns:
        `(named, scheduled)`: `{name: [callbacks]}` with every name of `names`
        present, and the entries of `tasks` keyed by a schedule.

    Example:
        >>> import ciclo
        >>> class Printer:
        ...     def on_validate_step(self, state, batch):
        ...         print("validated", batch)
        >>> named, scheduled = ciclo.hooks.collect(
        ...     ["validate_step", "on_validate_step"], {ciclo.every(2): []}, callbacks=[Printer()]
        ... )
        >>> [len(named[name]) for name in ("validate_step", "on_validate_step")], len(scheduled)
        ([0, 1], 1)
    """
    names = tuple(names)
    named, scheduled = split_tasks(tasks, names, loop_name)
    add_callbacks(named, callbacks, names)
    add_state_methods(named, state, names)
    return {name: named.get(name, []) for name in names}, scheduled


def split_tasks(
    tasks: Mapping[Any, Any] | None, names: tuple[str, ...], loop_name: str
) -> tuple[Named, dict[Any, Any]]:
    """Splits `tasks` into named tasks (validated against `names`) and scheduled tasks."""
    if tasks is None:
        return {}, {}
    if not isinstance(tasks, Mapping):
        raise TypeError(f"tasks must be a dict of schedule -> callbacks, got {short(tasks)}")
    named: Named = {}
    scheduled: dict[Any, Any] = {}
    for key, callbacks in tasks.items():
        if isinstance(key, str):
            if key not in names:
                raise ValueError(
                    f"{loop_name} does not know the named schedule {short(key)}; valid names: "
                    f"{', '.join(names)}"
                )
            named[key] = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
        else:
            scheduled[key] = callbacks
    return named, scheduled


def add_state_methods(named: Named, state: Any, names: tuple[str, ...]) -> None:
    """Puts the methods of `state`'s class named in `names` first under their names."""
    state_type = type(state)
    for name in names:
        # The unbound method, so that the loop passes the *current* state as `self`.
        method = getattr(state_type, name, None)
        if method is not None and callable(method):
            named.setdefault(name, []).insert(0, method)


def add_callbacks(named: Named, callbacks: Iterable[Any] | None, names: tuple[str, ...]) -> None:
    """Appends the methods of each object of `callbacks` named in `names` under their names."""
    if callbacks is None:
        return
    if not isinstance(callbacks, (list, tuple)):
        raise TypeError(f"callbacks must be a list of callback objects, got {short(callbacks)}")
    for callback in callbacks:
        hooks = {name: getattr(callback, name, None) for name in names}
        hooks = {name: hook for name, hook in hooks.items() if callable(hook)}
        if not hooks:
            raise ValueError(
                f"callback {short(callback)} has none of the hooks this loop runs: {', '.join(names)}; "
                "put it in the tasks dict under a schedule instead"
            )
        for name, hook in hooks.items():
            named.setdefault(name, []).append(hook)
