"""The one door: every form of callback a user may give becomes a `ciclo.Callback` here, once.

The only place ciclo reads a user's object by the names of its methods, and
refuses or warns of a method named like a hook that no loop calls.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import sys
from collections.abc import Callable, Iterable, Mapping
from types import MethodType
from typing import TYPE_CHECKING, Any, Final, final

from ciclo._src.base.checks import signature_of, warn
from ciclo._src.base.reprs import short
from ciclo._src.base.types import StatefulCallback
from ciclo._src.engine.callback import LIFECYCLE, Callback, vars_lookup
from ciclo._src.logs.step_output import describe

if TYPE_CHECKING:
    from ciclo._src.engine.loop_state import LoopState


class _Adapted(Callback):
    """What the user gave (`source`) as a `Callback`; the lifecycle it lives is `owner`'s, if it has one."""

    def __init__(self, call: Callable[..., Any], source: Any, owner: Callback | None = None) -> None:
        self.__loop_callback__ = call  # type: ignore[method-assign]  # one call less per step
        self.source = source
        self.owner = owner

    def __repr__(self) -> str:
        return describe(self.source)


@final
class _Object(_Adapted):
    """A user's object that satisfies the protocols without subclassing `Callback`."""

    def __init__(self, obj: Any, call: Callable[[LoopState[Any]], Any] = lambda loop_state: None) -> None:
        super().__init__(call, obj)
        cls = type(obj)
        for name in LIFECYCLE:
            if callable(vars_lookup(cls, name)):
                setattr(self, name, getattr(obj, name))
        if isinstance(obj, StatefulCallback):
            self.state_dict = obj.state_dict  # type: ignore[method-assign]
            self.load_state_dict = obj.load_state_dict  # type: ignore[method-assign]

    @property
    def state_key(self) -> str:
        has_key = vars_lookup(type(self.source), "state_key") is not None
        return self.source.state_key if has_key else type(self.source).__qualname__


def _lifecycle(obj: Any) -> Callback:
    """The `Callback` that lives `obj`'s lifecycle: `obj` itself if it is one."""
    return obj if isinstance(obj, Callback) else _Object(obj)


def lifecycle_of(callback: Callback, name: str) -> bool:
    """Whether `callback` overrides the lifecycle or state method `name` (else the engine never calls it)."""
    if type(callback) is _Object:
        return name in vars(callback)
    return getattr(type(callback), name) is not getattr(Callback, name)


_ARGUMENT_NAMES: Final = ("state", "batch", "elapsed", "loop_state")

_BY_NAME: Final[dict[str, Callable[[LoopState[Any]], Any]]] = {
    "state": lambda loop_state: loop_state.state,
    "batch": lambda loop_state: loop_state.batch,
    "elapsed": lambda loop_state: loop_state.elapsed,
    "loop_state": lambda loop_state: loop_state,
    "logs": lambda loop_state: loop_state.logs,
}

# A 0.1 function taking the first N of `(state, batch, elapsed, loop_state)`.
_BY_POSITION: Final[tuple[Callable[[Callable[..., Any]], Callable[[LoopState[Any]], Any]], ...]] = (
    lambda fn: lambda loop_state: fn(),
    lambda fn: lambda loop_state: fn(loop_state.state),
    lambda fn: lambda loop_state: fn(loop_state.state, loop_state.batch),
    lambda fn: lambda loop_state: fn(loop_state.state, loop_state.batch, loop_state.elapsed),
    lambda fn: lambda loop_state: fn(loop_state.state, loop_state.batch, loop_state.elapsed, loop_state),
)


def _plain_function(fn: Callable[..., Any], owner: Callback | None = None) -> Callback:
    """`fn` as a `Callback`: by parameter name if all are names of `_BY_NAME`, else by position (0.1)."""
    signature = signature_of(fn, "by position or by name", "lambda state, batch: ...")
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
        return _Adapted(_BY_POSITION[len(_ARGUMENT_NAMES)](fn), fn, owner)
    if names and all(name in _BY_NAME for name in names) and names != list(_ARGUMENT_NAMES[: len(names)]):
        getters = tuple(_BY_NAME[name] for name in names)
        return _Adapted(lambda loop_state: fn(*(get(loop_state) for get in getters)), fn, owner)
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
    return _Adapted(_BY_POSITION[arity](fn), fn, owner)


def as_callback_list(value: Any, where: str) -> list[Callback]:
    """A callback, a list/tuple of callbacks, or None, as a list of `Callback`s: the one door in."""
    items = [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]
    try:
        return [_as_callback(item) for item in items]
    except TypeError as error:
        raise TypeError(f"in {where}: {error}") from None


def as_tasks(tasks: Any, where: str) -> list[tuple[Any, list[Callback]]]:
    """A phase's tasks (`(schedule, callbacks)` pairs or a dict) with each callback made a `Callback`."""
    pairs = []
    for item in tasks.items() if isinstance(tasks, Mapping) else tasks:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError(f"{where}: a task is a (schedule, callbacks) pair, got {short(item)}")
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
        pairs.append((schedule, as_callback_list(callbacks, f"{where}, task {short(schedule)}")))
    return pairs


def _as_callback(obj: Any) -> Callback:
    if isinstance(obj, str):
        raise TypeError(f"{short(obj)} is a string, not a callback")
    clu = sys.modules.get("clu.periodic_actions")  # never imported here: only once the user has
    if clu is not None and isinstance(obj, clu.PeriodicAction):  # called with the steps done
        return _Adapted(lambda loop_state: obj(loop_state.elapsed.steps), obj)
    misnamed = () if inspect.isroutine(obj) else check_method_names(obj)
    if isinstance(obj, Callback):  # a subclass of a user's may misspell a lifecycle method
        callback = obj
    elif vars_lookup(type(obj), "__loop_callback__") is not None:
        callback = _Object(obj, obj.__loop_callback__)
    elif not callable(obj):
        raise TypeError(
            f"{short(obj)} of type {type(obj).__name__} is not a callback: pass a callable taking "
            f"0 to 4 of {_ARGUMENT_NAMES} (or any of {tuple(_BY_NAME)} by name), or an object "
            "with __loop_callback__(loop_state)"
        )
    elif inspect.isroutine(obj):  # a method given alone lives its object's lifecycle
        callback = _plain_function(obj, _lifecycle(obj.__self__) if inspect.ismethod(obj) else None)
    else:
        callback = _Object(obj, _plain_function(obj).__loop_callback__)
    warn_misnamed(obj, misnamed)
    return callback


def owners(callbacks: Iterable[Callback]) -> list[Callback]:
    """The callbacks whose lifecycle the engine runs, each once, in order; a hook's is its object's."""
    found: dict[int, Callback] = {}
    for callback in callbacks:
        owner = callback.owner if isinstance(callback, _Adapted) and callback.owner is not None else callback
        found.setdefault(id(owner.source if isinstance(owner, _Adapted) else owner), owner)
    return list(found.values())


def by_state_key(owners: list[Callback]) -> dict[str, Callback]:
    """The stateful callbacks of `owners` by `state_key`, which must be a str that no other one has."""
    keyed: dict[str, Callback] = {}
    for owner in (o for o in owners if lifecycle_of(o, "state_dict")):
        key = owner.state_key
        if not isinstance(key, str) or not key:
            raise TypeError(f"the state_key of {short(owner)} must be a non-empty str, got {short(key)}")
        if key in keyed:
            raise ValueError(
                f"two stateful callbacks of this loop save their state under the key {short(key)}: "
                f"{short(keyed[key])} and {short(owner)}; give one of them "
                "another name= (or, for your own callback, a state_key attribute)"
            )
        keyed[key] = owner
    return keyed


def hooks_of(callback: Any, names: tuple[str, ...]) -> dict[str, Callback]:
    """The `Callback` `callback` runs under each of `names` it has a hook for: one lifecycle for all.

    Under the hooks a `Callback` declares (`hook`), else its methods named after `names`; refuses an
    object with none of them.
    """
    hook = callback.hook if isinstance(callback, Callback) else None
    declared = (hook,) if isinstance(hook, str) else tuple(hook or ())
    misnamed = check_method_names(callback, names) if hook is None else ()
    if hook is None:  # an object's methods named after hooks
        hooks = {n: getattr(callback, n) for n in names if callable(vars_lookup(type(callback), n))}
    elif isinstance(hook, Mapping):  # a method of its own under each hook it declares
        hooks = {n: MethodType(fn, callback) for n, fn in hook.items() if n in names}
    else:  # itself, under the first of its hooks the loop runs
        hooks = dict([(n, callback) for n in declared if n in names][:1])
    if not hooks:
        fix = "; ".join(f"{name} is not a hook: {_fix(meant)}" for name, meant in misnamed)
        runs = f"it runs under {' or '.join(declared)}: " if declared else ""
        raise ValueError(
            f"callback {short(callback)} has none of the hooks this loop runs: {', '.join(names)}; "
            + (fix or f"{runs}put it in the tasks dict under a schedule instead")
        )
    warn_misnamed(callback, misnamed)
    owner = _lifecycle(callback)  # wrapped once, whatever its number of hooks
    return {
        name: method if method is callback else _plain_function(method, owner)
        for name, method in hooks.items()
    }


# difflib's ratio above which a name is a hook's misspelling: `on_epoch_ends` (0.96) and
# `on_trian_end` (0.92) are; `latest_step` (0.90 to `test_step`) and `reset` (0.67) are not.
_CLOSE: Final = 0.905

# Keras' names of hooks that ciclo names otherwise, too far from ciclo's for difflib to match.
_KERAS: Final = {"on_batch_begin": "on_train_batch_begin", "on_batch_end": "on_train_batch_end"}

OBJECT_CALLBACK: Final = "__loop_callback__"


@functools.lru_cache(maxsize=512)  # a loop is built once per call, and a test loop at each epoch
def misnamed_methods(cls: type, names: tuple[str, ...] = ()) -> tuple[tuple[str, str], ...]:
    """The methods of `cls` named like a hook (of `names` or the lifecycle) or a `__loop_*__` that none is.

    Each comes with the name it may have meant, `""` if none is close.
    """
    vocabulary = (*names, *LIFECYCLE)
    found = []
    for name in dir(cls):
        if name in vocabulary or name == OBJECT_CALLBACK:
            continue
        if name.startswith("__loop_") and name.endswith("__"):
            close = difflib.get_close_matches(name, [OBJECT_CALLBACK], 1, 0.8) or difflib.get_close_matches(
                "on_" + name[len("__loop_") : -2], LIFECYCLE, 1, 0.8
            )
            meant = close[0] if close else ""
        elif name.startswith("_") or not (meant := closest_hook(name, vocabulary)):
            continue
        if callable(vars_lookup(cls, name)):
            found.append((name, meant))
    return tuple(found)


def closest_hook(name: str, vocabulary: tuple[str, ...]) -> str:
    """The hook of `vocabulary` that `name` may mean: ciclo's name for Keras' one, or a close spelling."""
    if _KERAS.get(name) in vocabulary:
        return _KERAS[name]
    return next(iter(difflib.get_close_matches(name, vocabulary, 1, _CLOSE)), "")


def _fix(meant: str) -> str:
    if meant:
        return f"rename it {meant}"
    return (
        f"a loop calls {OBJECT_CALLBACK}(loop_state), on_start(loop_state), on_end(loop_state, error) "
        "and the hook names (ciclo.on_*, ciclo.hooks.on_predict_*)"
    )


def check_method_names(callback: Any, names: tuple[str, ...] = ()) -> tuple[tuple[str, str], ...]:
    """Refuses an object with a `__loop_*__` method no loop calls; returns its other misnamed methods."""
    misnamed = misnamed_methods(type(callback), names)  # type: ignore[arg-type]  # a class is hashable
    for name, meant in misnamed:
        if name.startswith("__"):
            raise TypeError(
                f"callback {short(callback)} has a method {name}, which no loop calls: {_fix(meant)}"
            )
    return misnamed


def warn_misnamed(callback: Any, misnamed: tuple[tuple[str, str], ...]) -> None:
    for name, meant in misnamed:
        warn(f"callback {short(callback)} has a method {name}, which no loop calls: {_fix(meant)}")
