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

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
"""The directory of the `ciclo` package: `warn` points at the first frame outside it."""

_SKIPPED = (_PACKAGE, os.path.dirname(os.path.dirname(os.path.abspath(jax.__file__))) + os.sep + "jax")
"""Where `warn` looks past: ciclo, and jax, which calls a step's function while it traces it."""


class DataWarning(UserWarning):
    """A loop was given data that is probably not what was meant (no batch, or fewer than `stop`).

    Warned, not raised, as the run is still well defined; make it an error with
    `warnings.simplefilter("error", ciclo.types.DataWarning)`.

    Example:
        >>> import ciclo, warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     _ = ciclo.loop(0, [], {ciclo.every(1): lambda state: state + 1})
        >>> [type(w.message).__name__ for w in caught]
        ['DataWarning']
    """


class RecompileWarning(UserWarning):
    """A managed step compiled again, for inputs that differ from its first compile's.

    Warned by `train_loop` once per change (see `managed.ManagedStep`);
    silence it with
    `warnings.filterwarnings("ignore", category=ciclo.types.RecompileWarning)`.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax, warnings
        >>> from ciclo import managed
        >>> @managed.train_step
        ... def train_step(state, batch):
        ...     return ciclo.logs().add_loss("loss", (batch * state.params).sum() ** 2), state
        >>> state = managed.ManagedState.create(params=jnp.ones(()), tx=optax.sgd(0.1))
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     _ = ciclo.train_loop(state, [jnp.ones(4), jnp.ones(3)], {ciclo.on_train_step: [train_step]})
        >>> [type(w.message).__name__ for w in caught], train_step.compiles
        (['RecompileWarning'], 2)
    """


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """`warnings.warn`, pointing at the user's line: the first frame outside ciclo and jax."""
    stacklevel, frame = 1, sys._getframe()
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_SKIPPED):
        stacklevel, frame = stacklevel + 1, frame.f_back
    warnings.warn(message, category, stacklevel=stacklevel)


def signature_of(fn: Callable[..., Any], passing: str, wrapper: str) -> inspect.Signature:
    """`fn`'s signature, read to pass it arguments `passing`; a builtin's refused naming `wrapper`."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"cannot read the signature of {short(fn)} to pass it arguments {passing}; "
            f"wrap it in a function such as `{wrapper}`"
        ) from error


def check_directory(directory: str, what: str) -> None:
    """Raises now, naming the remedy, if local `directory` (named `what`) cannot be created or written to.

    Raises:
        NotADirectoryError: if `directory` or one of its parents is a file.
        PermissionError: if the nearest existing directory is not writable.

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
    """Refuses an option that must be True or False and is anything else (`"yes"`, `1`, None).

    Example:
        >>> check_bool("yes", "test_with_ema")
        Traceback (most recent call last):
        TypeError: test_with_ema must be True or False, got 'yes'
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {short(value)}")


def check_int(value: Any, name: str, least: int, why: str = "") -> None:
    """Refuses (ValueError) anything but an int >= `least`, a bool included; `why` follows the bound.

    Example:
        >>> check_int(1, "keep", 2, " (a kill during a save must leave one)")
        Traceback (most recent call last):
        ValueError: keep must be an int >= 2 (a kill during a save must leave one), got 1
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int >= {least}{why}, got {short(value)}")


def check_positive(period: Any, name: str, remedy: str) -> None:
    """Raises a ValueError if `period` (a `Period` or None) is reached at once: every set field is 0."""
    if period is None or period.date is not None:
        return
    if any(value is not None and value > 0 for value in (period.steps, period.samples, period.time)):
        return
    raise ValueError(f"{name} is zero ({short(period)}), which would never end or never run; {remedy}")


class TestData:
    """Calls `train_loop`'s `test_dataset` for each test pass, refusing what would hang or be empty.

    Unless `test_duration` bounds the pass: an endless standard iterator
    (`itertools.cycle`, `count`, endless `repeat`), or the iterator an earlier
    pass used up.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, make: Any, bounded: bool) -> None:
        self.make = make
        self.bounded = bounded
        self.previous: Any = None  # the iterator of the previous pass, if it was one

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
