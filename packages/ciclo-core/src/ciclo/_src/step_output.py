"""The one rule for what a step or a callback returns, used by the loop, managed steps and fused steps."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from ciclo._src.logs import LogsLike

S = TypeVar("S")

NO_LOGS: LogsLike = MappingProxyType({})
"""The logs of a callback that logged nothing (shared, read-only)."""


def describe(obj: Any) -> str:
    """A short name for a callback or step in error messages: its qualified name, else its repr."""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    return name if isinstance(name, str) else repr(obj)


def step_output(output: Any, state: S, source: Any) -> tuple[LogsLike, S]:
    """Normalises what a step or callback returned to `(logs, state)`.

    The forms, for functions and callback objects alike:

    - `None`: no logs, the state unchanged;
    - `(logs, state)`: either may be `None` (no logs; the state unchanged);
    - a mapping (`ciclo.Logs` or a dict): logs, the state unchanged;
    - anything else: the new state, with no logs.

    Args:
        output: the returned value.
        state: the state the step or callback was given.
        source: the step or callback, named in the error.

    Raises:
        ValueError: for a tuple whose length is not 2.

    Example:
        >>> step_output(None, 1, "cb")
        (mappingproxy({}), 1)
        >>> step_output(({"metrics": {"a": 1}}, None), 1, "cb")
        ({'metrics': {'a': 1}}, 1)
        >>> step_output(2, 1, "cb")
        (mappingproxy({}), 2)
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
        return (NO_LOGS if logs is None else logs), (state if new_state is None else new_state)
    if isinstance(output, Mapping):
        return output, state
    return NO_LOGS, output
