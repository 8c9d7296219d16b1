"""The hook vocabulary: the names loops run callbacks under (`ciclo.on_*`, `ciclo.hooks.on_predict_*`).

`collect` places a loop's tasks and callbacks under those names; the door (engine) knows none of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from ciclo._src.base.reprs import short
from ciclo._src.engine.callback import vars_lookup
from ciclo._src.engine.door import closest_hook, hooks_of

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
    """The callbacks of each hook name in `names`, and the rest of `tasks`: `(named, scheduled)`.

    For each name, in order: the method of that name of `state`'s class
    (called with the current state as `self`), the tasks under that name, then
    the `callbacks` placed under it: by the `hook` a `ciclo.Callback`
    declares, or by an object's method of that name (the object is wrapped
    once, as one callback with one lifecycle, whatever its number of hooks).
    `named` has every name; `scheduled` holds the tasks keyed by a schedule.

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
    if tasks is not None and not isinstance(tasks, Mapping):
        raise TypeError(f"tasks must be a dict of schedule -> callbacks, got {short(tasks)}")
    if callbacks is not None and not isinstance(callbacks, (list, tuple)):
        raise TypeError(f"callbacks must be a list of callback objects, got {short(callbacks)}")
    named: Named = {name: [] for name in names}
    scheduled: dict[Any, Any] = {}
    for key, value in (tasks or {}).items():
        if not isinstance(key, str):
            scheduled[key] = value
        elif key not in names:
            meant = closest_hook(key, names)
            raise ValueError(
                f"{loop_name} does not know the named schedule {short(key)}; valid names: {', '.join(names)}"
                + (f"; did you mean {meant}?" if meant else "")
            )
        else:
            named[key] = list(value) if isinstance(value, (list, tuple)) else [value]
    for callback in callbacks or ():
        for name, hook in hooks_of(callback, names).items():
            named[name].append(hook)
    add_state_methods(named, state, names)
    return named, scheduled


def add_state_methods(named: Named, state: Any, names: tuple[str, ...]) -> None:
    """Puts the methods of `state`'s class named in `names` first under their names."""
    for name in names:  # unbound: the loop passes the current state as `self`
        if callable(vars_lookup(type(state), name)):
            named[name].insert(0, getattr(type(state), name))
