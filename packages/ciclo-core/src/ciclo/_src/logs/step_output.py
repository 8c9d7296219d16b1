"""The one rule for what a step or a callback returns, used by the loop, managed steps and fused steps."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, TypeVar

import jax
import numpy as np

from ciclo._src.base.reprs import short
from ciclo._src.logs.logs import NOT_NUMERIC, NUMERIC_COLLECTIONS, Logs, LogsLike, StackedLogs, numeric_remedy

S = TypeVar("S")

NO_LOGS: LogsLike = MappingProxyType({})
"""The logs of a callback that logged nothing (shared, read-only)."""


def describe(obj: Any) -> str:
    """A short name for a callback or step in error messages: its qualified name, else its repr.

    A step bound to its state (`functools.partial`) is named as the step: a managed step by its repr,
    `ModelState.train_step`, as the recompile warning names it.
    """
    if type(obj) is functools.partial:
        obj = obj.func
    name = getattr(obj, "__qualname__", None)
    return name if isinstance(name, str) else short(obj)


def _is_value(x: Any) -> bool:
    return isinstance(x, (int, float, complex, np.ndarray, np.generic, jax.Array))


def check_logs(logs: Any, source: Any) -> None:
    """Raises if `logs` (a plain mapping) is not `{collection: {entry: value}}`, or a text or dict metric."""
    for collection, entries in logs.items():
        if not isinstance(entries, Mapping):
            raise TypeError(
                f"{describe(source)} returned logs whose collection {short(collection)} holds "
                f"{short(entries)}; "
                "logs map collection -> {entry: value}, e.g. {'metrics': {'accuracy': acc}} "
                "(build them with ciclo.logs().add_metric(name, value))"
            )
        if collection in NUMERIC_COLLECTIONS:
            for name, value in entries.items():
                if isinstance(value, NOT_NUMERIC):
                    raise TypeError(
                        f"{describe(source)} logged the {type(value).__name__} {short(value)} as "
                        f"{collection}.{name}; metrics and losses must be numbers or arrays "
                        f"({numeric_remedy(name, value)})"
                    )


def check_new_state(new_state: Any, state: Any, source: Any) -> None:
    """Raises unless `new_state` is of `state`'s type (a sub/base class), both are values, or `state` None."""
    old_type = type(state)
    if type(new_state) is old_type or state is None:
        return
    if isinstance(new_state, old_type) or isinstance(state, type(new_state)):
        return
    if _is_value(new_state) and _is_value(state):
        return
    raise TypeError(
        f"{describe(source)} returned {_short(new_state)} where the loop expects the state "
        f"({old_type.__name__}); a step or callback returns (logs, state), logs, the new state (of the "
        "same type as the current one) or None. Return (logs, state) to log a value, or None to keep "
        "the state"
    )


def _short(value: Any) -> str:
    return f"{short(value, 60)} of type {type(value).__name__}"


def step_output(output: Any, state: S, source: Any) -> tuple[LogsLike, S]:
    """Normalises what a step or callback returned to `(logs, state)`.

    The forms, for functions and callback objects alike:

    - `None`: no logs, the state unchanged;
    - `(logs, state)`: either may be `None` (no logs; the state unchanged);
    - a mapping (`ciclo.types.Logs` or a dict): logs, the state unchanged;
    - anything else: the new state, with no logs.

    Anything else (`check_new_state`, `check_logs`, a swapped pair) raises, naming `source`.
    """
    if output is None:
        return NO_LOGS, state
    if type(output) is tuple:
        if len(output) != 2:
            raise ValueError(
                f"{describe(source)} returned a tuple of length {len(output)}; a step or callback "
                "returns (logs, state), logs, state or None"
            )
        logs, new_state = output
        if logs is None:
            logs = NO_LOGS
        elif type(logs) is not Logs and type(logs) is not StackedLogs:
            if not isinstance(logs, Mapping) or isinstance(new_state, Logs):
                swapped = isinstance(new_state, Logs) or (
                    isinstance(new_state, Mapping) and not isinstance(state, Mapping)
                )
                raise TypeError(
                    f"{describe(source)} returned a pair whose first element is {_short(logs)}, "
                    "not logs: a step or callback returns (logs, state)"
                    + (
                        "; it looks like (state, logs): swap them to return (logs, state)"
                        if swapped
                        else "; to return a tuple as the state, return (None, state)"
                    )
                )
            check_logs(logs, source)
        if new_state is None:
            return logs, state
        check_new_state(new_state, state, source)
        return logs, new_state
    if isinstance(output, Mapping):
        if type(output) is not Logs and type(output) is not StackedLogs:
            check_logs(output, source)
        return output, state
    check_new_state(output, state, source)
    return NO_LOGS, output
