"""`Logger`: the one callback that writes scalar entries, to a backend's `Sink` (TensorBoard, CSV, ...)."""

from __future__ import annotations

import importlib
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, Protocol, final

from ciclo._src.base.reprs import short
from ciclo._src.callbacks._monitor import snapshot_fields
from ciclo._src.engine.callback import Callback
from ciclo._src.engine.loop_state import LoopState
from ciclo._src.logs.logs import History, LogsLike, Paths

_SKIPPED_COLLECTIONS = frozenset({"elapsed", "outputs"})


class Row(NamedTuple):
    """One logged step, as a sink writes it: the History's `steps`, unix time, its numbers by entry name.

    Not `elapsed` or `outputs`; a name in several collections with different values is `collection.name`.
    """

    step: int
    wall_time: float
    scalars: dict[str, float | int]


class Sink(Protocol):
    """Where a `Logger` writes: one backend; `write` after `close` opens it again."""

    def write(self, rows: Sequence[Row], /) -> None: ...

    def flush(self) -> None:
        """Makes everything written so far durable (on disk, handed to the backend's client)."""
        return None

    def close(self) -> None:
        """Flushes and releases the file, run or connection."""
        return None

    def state(self) -> dict[str, Any]:
        """What a resumed sink needs besides the last step (a run id); strings and numbers only."""
        return {}

    def restore(self, state: Mapping[str, Any], after_step: int | None, /) -> int | None:
        """Takes back `state()`; returns None, or the newest step the backend holds (a W&B run's)."""
        return None


def import_extra(module: str, extra: str, what: str) -> Any:
    """Imports an optional dependency; the error says which extra of ciclo-core to install."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f'{what} needs {module}: pip install "ciclo-core[{extra}]"') from error


HParams = dict[str, "bool | int | float | str"]
"""A run's hyperparameters, as a logger records them: name -> number, string or bool."""


def checked_hparams(hparams: Mapping[str, Any] | None) -> HParams:
    """`hparams` as plain Python values (numpy scalars as numbers), checked when a logger is created."""
    if hparams is None:
        return {}
    if not isinstance(hparams, Mapping):
        raise TypeError(f"hparams must be a dict of name -> number, string or bool, got {short(hparams)}")
    checked: HParams = {}
    for name, value in hparams.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"hparams names must be non-empty strings, got {short(name)}")
        plain = value if isinstance(value, (str, bool)) else _number(value)
        if plain is None:
            raise TypeError(
                f"hparams[{short(name)}] must be a number, a string or a bool, got {short(value)}"
            )
        checked[name] = plain
    return checked


def _row_scalars(paths: Paths, values: tuple[Any, ...]) -> dict[str, float | int]:
    """The row's numbers by name; a name in several collections with different values as `collection.name`."""
    found: dict[str, list[tuple[str, float | int]]] = {}
    for (collection, name), value in zip(paths, values, strict=True):
        number = None if collection in _SKIPPED_COLLECTIONS else _number(value)
        if number is not None:
            found.setdefault(name, []).append((collection, number))
    out: dict[str, float | int] = {}
    for name, found_values in found.items():
        if all(number == found_values[0][1] for _, number in found_values):
            out[name] = found_values[0][1]
        else:
            for collection, number in found_values:
                out[f"{collection}.{name}"] = number
    return out


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    # Host rows hold Python numbers; a numpy scalar or 0-d array can come from a hand-written loop.
    if getattr(value, "ndim", None) == 0:
        return _number(value.item())  # a numpy or JAX scalar: its Python value
    return None


@final
class Logger(Callback):
    """A loop callback that writes every logged scalar entry to a backend, against its step.

    Made by `ciclo.tensorboard`, `ciclo.csv_logger`, ...; it writes the rows History has
    copied to the host, never waiting. See docs/logging.md, "How loggers work".

    Example:
        >>> import ciclo
        >>> from ciclo._src.callbacks._loggers._base import Logger, Sink
        >>> class Printed(Sink):  # a sink of your own
        ...     def write(self, rows):
        ...         for row in rows:
        ...             print(row.step, row.scalars)
        >>> def train_step(state, batch):
        ...     return ciclo.logs().add_loss("loss", 1.0 / (batch + 1)), state
        >>> logger = Logger(Printed())
        >>> _ = ciclo.loop(None, range(3), {ciclo.every(1): [train_step, logger]})
        0 {'loss': 1.0}
        1 {'loss': 0.5}
        2 {'loss': 0.3333333333333333}
        >>> logger.state_dict()
        {'step': 2}
    """

    hook: ClassVar[str | None] = "on_train_batch_end"

    def __init__(self, sink: Sink) -> None:
        self._sink = sink
        self._history: History | None = None  # the history being read
        self._next_row = 0  # the first row of `_history` not yet handed to the sink, dropped rows counted
        self._date_start = 0.0  # unix time of the loop's start: row times are relative to it
        self._last_step: int | None = None
        self._resume_after: int | None = None  # restored: steps up to this one were written before
        self._own, self._own_next = History(), 0  # rows given to `write` by a hand-written loop

    def __loop_callback__(self, loop_state: LoopState[Any]) -> None:
        self._drain_loop(loop_state, ended=False)

    def on_start(self, loop_state: LoopState[Any]) -> None:
        """Refuses a loop starting at or before the last step written, unless it resumed this logger's run."""
        last, start = self._last_step, loop_state.elapsed.steps
        if last is not None and start <= last:
            raise ValueError(
                f"{self!r} already wrote steps up to {last}, and this loop starts at step {start}: it would "
                "write those steps again. Create a new logger for each loop, or go on counting from the "
                "earlier loop (elapsed= its Elapsed)"
            )

    def on_end(self, loop_state: LoopState[Any], error: BaseException | None) -> None:
        self._drain_loop(loop_state, ended=True)
        self._sink.close()

    def _drain_loop(self, loop_state: LoopState[Any], *, ended: bool) -> None:
        history = loop_state.history
        if history is not self._history:
            self._history, self._next_row = history, history.dropped
            self._date_start = loop_state.elapsed.date_start
        upto = (len(history) if ended else history.on_host) + history.dropped
        if upto > self._next_row:
            self._next_row = self._drain(history, self._next_row, upto, self._date_start)

    def _drain(self, history: History, start: int, upto: int, date_start: float) -> int:
        """Writes rows [`start`, `upto`) of `history`, dropped rows counted; returns `upto`."""
        first, last = max(start - history.dropped, 0), upto - history.dropped
        if last <= first:
            return upto
        rows = []
        resume_after = self._resume_after
        for paths, values, step, _, seconds in history.host_rows(first, last):
            if resume_after is not None and step <= resume_after:
                continue
            found = _row_scalars(paths, values)
            if found:
                rows.append(Row(step, date_start + seconds, found))
        if rows:
            self._sink.write(rows)
            self._last_step = rows[-1].step
        return upto

    def write(self, step: int, logs: LogsLike) -> None:
        """Logs `logs` at `step` from a hand-written loop, copied in batches as History does; never waits."""
        self._own.append(int(step), 0, time.time(), logs)
        self._own_next = self._drain(self._own, self._own_next, self._own.on_host, 0.0)

    def flush(self) -> None:
        """Writes every row given to `write` (copying what is still on the device) and flushes the backend."""
        self._drain(self._own, self._own_next, len(self._own), 0.0)
        self._own, self._own_next = History(), 0  # every row written: the next `write` starts a new buffer
        self._sink.flush()

    def close(self) -> None:
        """`flush`, then closes the backend (file, run); a later write opens it again."""
        self.flush()
        self._sink.close()

    def __enter__(self) -> Logger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def state_key(self) -> str:
        """What its saved state is found by on resume: the logger and where it writes, as in its repr."""
        return repr(self)

    def state_dict(self) -> dict[str, Any]:
        """The last step written (`step`, None before any) and what the backend needs to resume.

        Flushed first: a backup holding this state claims only rows that survive a kill.
        """
        self._sink.flush()
        return {"step": self._last_step, **self._sink.state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Appends after `state["step"]`: earlier steps are skipped, the backend's later rows dropped."""
        # The same keys as this logger's own snapshot: a snapshot of another callback is refused.
        state = snapshot_fields(state, ("step", *self._sink.state()), "logger")
        step = state["step"]
        self._last_step = self._resume_after = None if step is None else int(step)
        held = self._sink.restore(
            {key: value for key, value in state.items() if key != "step"}, self._last_step
        )
        if held is not None:  # the backend's own count: write after it, refuse nothing before it
            self._resume_after = held
            if self._last_step is not None:
                self._last_step = min(self._last_step, held) if held >= 0 else None

    def __repr__(self) -> str:
        return f"Logger({self._sink!r})"
