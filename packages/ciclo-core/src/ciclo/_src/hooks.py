"""The hook vocabulary: the names predefined loops run callbacks under, and how they are collected.

A hook name is a string. In a loop's tasks dict it is a named schedule
(`{ciclo.on_train_step: [step]}`); on a state it names a method the loop calls
(`state.train_step`); on an object in `callbacks=[...]` it names a method the
loop registers (`keras_bar` has `on_train_batch_end`). `collect` gathers all
three for a set of names: `train_loop`, `test_loop` and `predict_loop` use it,
and so can a loop of your own built on `ciclo.run_phases`.
"""

from __future__ import annotations

import difflib
import weakref
from collections.abc import Iterable, Mapping
from typing import Any, Final

from ciclo._src.checks import warn
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

LIFECYCLE: Final = ("on_start", "on_end")
"""What every loop calls on the objects behind its callbacks: `on_start(loop_state)` once before the
first step, `on_end(loop_state, error)` once after the last."""

OBJECT_CALLBACK: Final = "__loop_callback__"
"""The method a callback object is called by at each step its schedule fires: `(loop_state)`."""

_VOCABULARY: Final = tuple(dict.fromkeys(TRAIN + TEST + PREDICT + LIFECYCLE))

_CLOSE: Final = 0.905
"""How alike (difflib's ratio) a method's name must be to a hook's to be taken for its misspelling.

`on_epoch_ends` (0.96), `on_epoch_edn` and `on_trian_end` (0.92) are;
`latest_step` (0.90 to `test_step`), `reset` (0.67 to `reset_step`), `update`
and `state_dict` (under 0.5) are not.
"""

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
        misnamed = check_method_names(callback)
        hooks = {name: getattr(callback, name, None) for name in names}
        hooks = {name: hook for name, hook in hooks.items() if callable(hook)}
        if not hooks:
            fix = "; ".join(f"{name} is not a hook: {_fix(meant)}" for name, meant in misnamed)
            raise ValueError(
                f"callback {short(callback)} has none of the hooks this loop runs: {', '.join(names)}; "
                + (fix or "put it in the tasks dict under a schedule instead")
            )
        if misnamed:
            warn_misnamed(callback, misnamed)
        for name, hook in hooks.items():
            named.setdefault(name, []).append(hook)


_MISNAMED: weakref.WeakKeyDictionary[type, tuple[tuple[str, str], ...]] = weakref.WeakKeyDictionary()
"""`misnamed_methods` of each class met: a loop is built once per call, and a test loop at each epoch."""


def misnamed_methods(cls: type) -> tuple[tuple[str, str], ...]:
    """The methods of `cls` named like a hook that no loop calls, each with the name it may have meant.

    A method is misnamed when its name is a close match of a hook name or of
    `on_start` / `on_end` without being one (`on_epoch_ends`), or when it is a
    `__loop_*__` other than `__loop_callback__` (`__loop_end__`). The name
    meant is `""` when none is close.

    Example:
        >>> from ciclo._src.hooks import misnamed_methods
        >>> class Bar:
        ...     def on_epoch_ends(self, state): ...
        ...     def __loop_end__(self, loop_state): ...
        ...     def update(self): ...
        >>> misnamed_methods(Bar)
        (('__loop_end__', 'on_end'), ('on_epoch_ends', 'on_epoch_end'))
    """
    misnamed = _MISNAMED.get(cls)
    if misnamed is None:
        misnamed = _MISNAMED[cls] = _misnamed(cls)
    return misnamed


def _misnamed(cls: type) -> tuple[tuple[str, str], ...]:
    found = []
    for name in dir(cls):
        if name in _VOCABULARY or name == OBJECT_CALLBACK:
            continue
        if name.startswith("__loop_") and name.endswith("__"):
            meant = difflib.get_close_matches(name, [OBJECT_CALLBACK], 1, 0.8) or difflib.get_close_matches(
                "on_" + name[len("__loop_") : -2], LIFECYCLE, 1, 0.8
            )
        elif name.startswith("_"):
            continue
        else:
            meant = difflib.get_close_matches(name, _VOCABULARY, 1, _CLOSE)
            if not meant:
                continue
        if callable(getattr(cls, name, None)):
            found.append((name, meant[0] if meant else ""))
    return tuple(found)


def _fix(meant: str) -> str:
    if meant:
        return f"rename it {meant}"
    return (
        f"a loop calls {OBJECT_CALLBACK}(loop_state), on_start(loop_state), on_end(loop_state, error) "
        "and the methods named in ciclo.hooks"
    )


def check_method_names(callback: Any) -> tuple[tuple[str, str], ...]:
    """Refuses a callback object with a `__loop_*__` method no loop calls; returns its other misnamed methods.

    Raises:
        TypeError: if `callback`'s class has a `__loop_*__` method other than
            `__loop_callback__` (`__loop_end__`): its author expects a call that
            never comes.
    """
    misnamed = misnamed_methods(type(callback))
    for name, meant in misnamed:
        if name.startswith("__"):
            raise TypeError(
                f"callback {short(callback)} has a method {name}, which no loop calls: {_fix(meant)}"
            )
    return misnamed


def warn_misnamed(callback: Any, misnamed: tuple[tuple[str, str], ...]) -> None:
    """Warns that the methods `misnamed` of `callback` are never called, naming the hook each may mean."""
    for name, meant in misnamed:
        warn(f"callback {short(callback)} has a method {name}, which no loop calls: {_fix(meant)}")
