"""Checks of what a user hands a loop, made before any long work: data warnings, directories, datasets."""

from __future__ import annotations

import inspect
import itertools
import operator
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax

from ciclo._src.base.reprs import short

# Where `warn` looks past: ciclo, and jax, which calls a step's function while it traces it.
_SKIPPED = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(jax.__file__))) + os.sep + "jax",
)


class DataWarning(UserWarning):
    """A loop was given data that is probably not what was meant (no batch, or fewer than `stop`).

    Example:
        >>> import ciclo, warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     _ = ciclo.loop(0, [], {ciclo.every(1): lambda state: state + 1})
        >>> [type(w.message).__name__ for w in caught]
        ['DataWarning']
    """


class RecompileWarning(UserWarning):
    """A managed step compiled again, for inputs that differ from its first compile's (docs/logging.md).

    Example:
        >>> import ciclo, warnings
        >>> warnings.filterwarnings("ignore", category=ciclo.types.RecompileWarning)
    """


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """`warnings.warn`, pointing at the user's line: the first frame outside ciclo and jax."""
    stacklevel, frame = 1, sys._getframe()
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_SKIPPED):
        stacklevel, frame = stacklevel + 1, frame.f_back
    warnings.warn(message, category, stacklevel=stacklevel)


def signature_of(fn: Callable[..., Any], passing: str, wrapper: str) -> inspect.Signature:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"cannot read the signature of {short(fn)} to pass it arguments {passing}; "
            f"wrap it in a function such as `{wrapper}`"
        ) from error


def check_path(value: Any, what: str) -> str:
    """`value`, a path (a str or `os.PathLike`), as a str; a TypeError for anything else.

    Example:
        >>> check_path(3, "logdir")
        Traceback (most recent call last):
        TypeError: logdir must be a path (a str or os.PathLike), got 3
    """
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{what} must be a path (a str or os.PathLike), got {short(value)}")
    return os.fspath(value)


def check_directory(directory: str, what: str) -> None:
    """Raises now (NotADirectoryError, PermissionError) if local `directory` cannot be created or written to.

    Example:
        >>> import tempfile
        >>> check_directory(tempfile.mkdtemp(), "checkpoint directory")
    """
    if "://" in directory:
        return
    existing = directory
    while not os.path.exists(existing):
        parent = os.path.dirname(existing)
        if parent == existing:
            return
        existing = parent
    remedy = "pass a path to a directory you can write to"
    if not os.path.isdir(existing):
        where = "is a file" if existing == directory else f"cannot be created: {existing} is a file"
        raise NotADirectoryError(f"{what} {directory} {where}, not a directory; {remedy}")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "is" if existing == directory else f"cannot be created: {existing} is"
        raise PermissionError(f"{what} {directory} {where} not writable by this process; {remedy}")


def check_bool(value: Any, name: str) -> None:
    """Refuses an option that must be True or False and is anything else.

    Example:
        >>> check_bool("yes", "test_with_ema")
        Traceback (most recent call last):
        TypeError: test_with_ema must be True or False, got 'yes'
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {short(value)}")


class NotAnInt(TypeError, ValueError):
    """What `check_int` raises for a value that is not an int: a TypeError, and a ValueError as before."""


def check_int(value: Any, name: str, least: int | None = None, why: str = "") -> None:
    """Refuses anything but an int (a bool is not one) >= `least`: NotAnInt, or ValueError below `least`.

    Example:
        >>> check_int(1, "keep", 2, " (a kill during a save must leave one)")
        Traceback (most recent call last):
        ValueError: keep must be an int >= 2 (a kill during a save must leave one), got 1
    """
    message = f"{name} must be an int{'' if least is None else f' >= {least}'}{why}, got {short(value)}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise NotAnInt(message)
    if least is not None and value < least:
        raise ValueError(message)


def check_positive(period: Any, name: str, remedy: str) -> None:
    """Raises a ValueError if `period` (a `Period` or None) is reached at once."""
    if period is None or period.date is not None:
        return
    if any(value is not None and value > 0 for value in (period.steps, period.samples, period.time)):
        return
    raise ValueError(f"{name} is zero ({short(period)}), which would never end or never run; {remedy}")


class TestData:
    """Calls `train_loop`'s `test_dataset` per pass, refusing (unbounded) what would hang or be empty."""

    __test__ = False  # not a pytest test class

    def __init__(self, make: Any, bounded: bool) -> None:
        self.make = make
        self.bounded = bounded
        self.previous: Any = None

    def __call__(self) -> Any:
        data = self.make()
        if not self.bounded and (
            isinstance(data, (itertools.cycle, itertools.count))
            or (isinstance(data, itertools.repeat) and operator.length_hint(data, -1) < 0)
        ):
            raise ValueError(
                f"test_dataset() returned an endless itertools.{type(data).__name__}: the test pass would "
                "never end; return a finite iterable of test batches, or pass test_duration=N to bound "
                "each test pass"
            )
        if not self.bounded and data is self.previous is not None:
            raise ValueError(
                "test_dataset() returned the same iterator as for the previous test pass, which used it "
                "up: this pass would test nothing. Return a fresh iterable each call, e.g. "
                "test_dataset=lambda: iter(test_batches), or a function that makes a new generator"
            )
        self.previous = data if isinstance(data, Iterator) else None
        return data
