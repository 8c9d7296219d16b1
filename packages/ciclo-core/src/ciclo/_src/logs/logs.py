"""Logs (what one step reports) and the History (what a loop reported, step by step).

A History row is oldest first on the host; in flight (a window of `_Block`s whose
device values `host_copies` brings over); or pending (the newest, kept as returned).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, cast, final, overload

import jax
import numpy as np

from ciclo._src.base.checks import check_int
from ciclo._src.base.elapsed import Elapsed
from ciclo._src.base.entry_paths import EntryPath
from ciclo._src.base.entry_paths import entry_path as _entry_path
from ciclo._src.base.reprs import short
from ciclo._src.base.types import LogsLike as LogsLike
from ciclo._src.logs import host_copies

if TYPE_CHECKING:
    from matplotlib.figure import Figure


ELAPSED_KEYS = ("steps", "samples", "time")


NUMERIC_COLLECTIONS = frozenset({"metrics", "losses", "stateful_metrics", "norms"})
"""Collections whose entries bars, loggers and aggregation treat as numbers."""

NOT_NUMERIC = (str, bytes, dict)
"""What a numeric collection refuses: text, and a dict (kept, but shown by no bar or logger)."""


def numeric_remedy(name: str, value: Any) -> str:
    """What to log instead of `value`, one of `NOT_NUMERIC`, as entry `name` of a numeric collection."""
    if isinstance(value, dict):
        return f"log each of the dict's values as an entry of its own, e.g. add_metric('{name}/key', value)"
    return "log text as an output: logs.add_output(name, text)"


PERFORMANCE = "performance"
"""The collection of what the loop says of its own running (steps per dispatch, compiles)."""


class Entries(dict[str, Any]):
    """The entries of one collection; entries are also readable as attributes."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no entry {short(name)}; entries are {sorted(self)}") from None


class Logs(dict[str, Entries]):
    """What a step reports: a dict of collections (`metrics`, `losses`, `outputs`, ...).

    Values may be JAX arrays still being computed: nothing here reads them.
    `Logs` is a pytree, so a `jax.jit`-compiled step can create and return it.

    Example:
        >>> import ciclo
        >>> logs = ciclo.logs()
        >>> logs.add_metric("accuracy", 0.9).add_loss("xent", 0.3)
        {'metrics': {'accuracy': 0.9}, 'losses': {'xent': 0.3}}
        >>> logs.metrics.accuracy, logs.entry_value("xent")
        (0.9, 0.3)
    """

    __slots__ = ()

    def __init__(self, logs: LogsLike | None = None) -> None:
        super().__init__()
        if logs is not None:
            self.merge(logs)

    def __getattr__(self, collection: str) -> Entries:
        if collection == "updates":  # the write-only property's missing getter lands here
            raise AttributeError("Logs.updates is write-only: assign logs to it to merge them")
        try:
            return self[collection]
        except KeyError:
            raise AttributeError(
                f"no collection {short(collection)}; collections are {sorted(self)}"
            ) from None

    def _merge_updates(self, updates: LogsLike | None) -> None:
        if updates is not None:
            self.merge(updates)

    updates = property(
        fset=_merge_updates, doc="Write-only: `logs.updates, state = train_step(state, batch)` merges."
    )

    def add_entry(self, collection: str, name: str, value: Any) -> Logs:
        """Sets `self[collection][name] = value`, creating the collection; returns self.

        Raises:
            TypeError: for a name that is not a non-empty string, or a string or a dict as a metric or
                a loss (a dict's entries are logged one by one, `"name/key"`).
        """
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"a log entry's name must be a non-empty string, got {short(name)} for {collection} "
                f"(e.g. logs.add_metric('accuracy', value))"
            )
        if isinstance(value, NOT_NUMERIC) and collection in NUMERIC_COLLECTIONS:
            raise TypeError(
                f"{collection}.{name} is the {type(value).__name__} {short(value)}: metrics and losses "
                f"must be numbers or arrays ({numeric_remedy(name, value)})"
            )
        entries = self.get(collection)
        if entries is None:
            entries = self[collection] = Entries()
        entries[name] = value
        return self

    def add_entries(self, collection: str, **values: Any) -> Logs:
        """Adds several entries to one collection; returns self."""
        for name, value in values.items():
            self.add_entry(collection, name, value)
        return self

    def add_metric(self, name: str, value: Any) -> Logs:
        """Adds an entry to the `metrics` collection (shown by progress bars); returns self."""
        return self.add_entry("metrics", name, value)

    def add_metrics(self, **values: Any) -> Logs:
        """Adds several entries to the `metrics` collection; returns self."""
        return self.add_entries("metrics", **values)

    def add_loss(self, name: str, value: Any, *, add_metric: bool = False) -> Logs:
        """Adds an entry to the `losses` collection (and to `metrics` if asked); returns self."""
        self.add_entry("losses", name, value)
        if add_metric:
            self.add_metric(name, value)
        return self

    def add_losses(self, *, add_metrics: bool = False, **values: Any) -> Logs:
        """Adds several entries to the `losses` collection; returns self."""
        for name, value in values.items():
            self.add_loss(name, value, add_metric=add_metrics)
        return self

    def add_output(self, name: str, value: Any) -> Logs:
        """Adds an entry to the `outputs` collection (predictions and the like); returns self."""
        return self.add_entry("outputs", name, value)

    def add_outputs(self, **values: Any) -> Logs:
        """Adds several entries to the `outputs` collection; returns self."""
        return self.add_entries("outputs", **values)

    def merge(self, other: LogsLike) -> Logs:
        """Merges `other` into these logs in place (later values win); returns self.

        Example:
            >>> import ciclo
            >>> ciclo.logs().add_metric("a", 1).merge({"metrics": {"b": 2}})
            {'metrics': {'a': 1, 'b': 2}}
        """
        for collection, entries in other.items():
            if type(entries) is not Entries and not isinstance(entries, Mapping):
                raise TypeError(
                    f"logs must map collection -> {{entry: value}}, but collection "
                    f"{short(collection)} holds {short(entries)}"
                )
            mine = self.get(collection)
            if mine is None:
                self[collection] = Entries(entries)
            else:
                mine.update(entries)
        return self

    def entry_path(self, key: str) -> tuple[str, str] | None:
        """Where `key` (`"name"` or `"collection.name"`) lives, or None; a ValueError if ambiguous."""
        return _entry_path(key, {(c, n) for c, entries in self.items() for n in entries})

    def entry_value(self, key: str) -> Any:
        """The value of `key` (`"name"` or `"collection.name"`): KeyError if absent, ValueError if two."""
        path = self.entry_path(key)
        if path is None:
            present = sorted(f"{c}.{n}" for c, entries in self.items() for n in entries)
            raise KeyError(f"{short(key)} not found in logs; present: {present}")
        return self[path[0]][path[1]]


def collapse_leading_axis(logs: Logs, index: int) -> Logs:
    """Logs with a leading axis as one step's: `outputs` `(n, rows, ...)` merge it, others index it."""
    out = Logs()
    for collection, entries in logs.items():
        if collection == "outputs":
            out[collection] = Entries(
                {name: v.reshape((-1, *v.shape[2:])) if v.ndim >= 2 else v for name, v in entries.items()}
            )
        else:
            out[collection] = Entries({name: value[index] for name, value in entries.items()})
    return out


@final
class StackedLogs(Logs):
    """The logs of a fused group of steps: the last step's logs, with every step's in `per_step`.

    Example:
        >>> import ciclo, jax.numpy as jnp
        >>> logs = StackedLogs.of(ciclo.logs().add_metric("loss", jnp.array([3.0, 2.0, 1.0])))
        >>> float(logs.metrics.loss), logs.per_step.metrics.loss.shape
        (1.0, (3,))
    """

    __slots__ = ("per_step",)

    per_step: Logs

    @classmethod
    def of(cls, per_step: Logs) -> StackedLogs:
        new = cls()
        for collection, entries in per_step.items():
            dict.__setitem__(new, collection, Entries({name: value[-1] for name, value in entries.items()}))
        new.per_step = per_step
        return new


def logs() -> Logs:
    """Creates an empty `Logs`.

    Example:
        >>> import ciclo
        >>> ciclo.logs().add_metric("loss", 0.5)
        {'metrics': {'loss': 0.5}}
    """
    return Logs()


Paths = tuple[EntryPath, ...]
"""A History row's entry paths, in the order of its values; rows that log the same entries share one."""


class History(Sequence[Logs]):
    """The logs a loop committed, one entry per step that logged something.

    Each entry is a `Logs` with an extra `elapsed` collection (`steps`, `samples`, `time`).
    Committing never waits on the device (do not change the logs afterwards); see docs/logging.md.

    Example:
        >>> import ciclo
        >>> history = ciclo.history()
        >>> for step in range(3):
        ...     logs = ciclo.logs().add_metric("loss", 1.0 / (step + 1))
        ...     history.commit(ciclo.types.Elapsed.create(steps=step), logs)
        >>> history.collect("steps", "loss")
        ([0, 1, 2], [1.0, 0.5, 0.3333333333333333])
    """

    def __init__(self, max_rows: int | None = None) -> None:
        if max_rows is not None:
            check_int(max_rows, "max_rows", 0, " or None (keep every row)")
        self.max_rows = max_rows
        self.dropped = 0  # rows dropped from the front by `max_rows`
        # Row `i` kept: counts `_steps[i]`, `_samples[i]`, `_times[i]`; entries `_paths[i]`, `_values[i]`
        # for the first `on_host` rows, then in `_windows`, then `_pending`.
        self._steps: list[int] = []
        self._samples: list[int] = []
        self._times: list[float] = []
        self._paths: list[Paths] = []
        self._values: list[tuple[Any, ...]] = []
        self._windows: deque[list[_Block]] = deque()  # oldest first; a window's blocks
        self._pending: list[LogsLike | _FusedRow] = []
        # For `latest`: the newest row of each set of paths read up to row `_scanned`, as its index
        # (dropped rows counted) and values (host values once the row is dropped).
        self._newest: dict[Paths, tuple[int, tuple[Any, ...]]] = {}
        self._scanned = 0
        self._interned: dict[Paths, Paths] = {}  # one `Paths` object for all the rows that log its entries
        self.running: set[str] = set()
        """The entries (`"losses.loss"`) whose every value covers all the steps so far, such as
        `test_loop`'s losses: an inner loop keeps their last value (see `ciclo.inner_loop`)."""
        self.members: int | None = None
        """A population's size (`train_loop` sets it): entries of shape `(members,)` are per member."""

    def commit(self, elapsed: Elapsed, logs: LogsLike) -> None:
        """Appends `logs` as the entry for `elapsed`; does not wait on the device."""
        self.append(elapsed.steps, elapsed.samples, elapsed.time, logs)

    def append(self, steps: int, samples: int, time: float, logs: LogsLike) -> None:
        """`commit` without building an `Elapsed`; the history keeps `logs` itself."""
        pending = self._pending
        pending.append(logs)
        self._steps.append(steps)
        self._samples.append(samples)
        self._times.append(time)
        if len(pending) >= 2 * _LAG:
            self._advance()

    def append_steps(
        self, steps: int, samples: int, time: float, per_step: Logs, rows: int, batch_size: int
    ) -> None:
        """Appends `rows` entries from logs with a leading axis over steps (a fused group's first steps)."""
        paths, arrays = self._read(per_step)
        self._pending += [_FusedRow(paths, arrays, i) for i in range(rows)]
        self._steps += range(steps, steps + rows)
        self._samples += [samples + i * batch_size for i in range(rows)]
        self._times += [time] * rows
        if len(self._pending) >= 2 * _LAG:
            self._advance()

    def _read(self, logs: LogsLike) -> tuple[Paths, tuple[Any, ...]]:
        paths = tuple([(collection, name) for collection, entries in logs.items() for name in entries])
        values = tuple([value for entries in logs.values() for value in entries.values()])
        return self._interned.setdefault(paths, paths), values

    def _advance(self) -> None:
        """Starts copying rows `_LAG` rows old, takes the windows done; drops rows beyond `max_rows`."""
        self._start(len(self._pending) - _LAG)
        self._take_windows(wait=False)
        if self.max_rows is None:
            return
        # The newest host rows stay for one more batch: a logger reading the history at every step sees them.
        excess = min(len(self) - self.max_rows, len(self._values) - _LAG)
        if excess <= 0:
            return
        for paths, (index, _) in self._newest.items():
            if self.dropped <= index < self.dropped + excess:
                self._newest[paths] = (index, self._values[index - self.dropped])
        del self._paths[:excess], self._values[:excess]
        del self._steps[:excess], self._samples[:excess], self._times[:excess]
        self.dropped += excess

    def _start(self, count: int) -> None:
        if count <= 0:
            return
        first = self.dropped + len(self) - len(self._pending)  # the first row's index, dropped rows counted
        rows = self._pending[:count]
        del self._pending[:count]
        blocks = self._blocks(rows)
        for block in blocks:
            self._note(first + block.positions[-1], block.paths, block.newest)
        self._windows.append(blocks)

    def _blocks(self, rows: list[LogsLike | _FusedRow]) -> list[_Block]:
        alike = _alike_columns(rows)
        if alike is not None:
            paths, columns, kinds = alike
            return [_Block.read(self._interned.setdefault(paths, paths), range(len(rows)), columns, kinds)]
        by_paths: dict[Paths, tuple[list[int], list[tuple[Any, ...]]]] = {}
        runs: list[tuple[list[int], list[_FusedRow]]] = []  # consecutive rows of one fused group
        for position, row in enumerate(rows):
            if type(row) is _FusedRow:
                if not runs or runs[-1][1][-1].arrays is not row.arrays:
                    runs.append(([], []))
                runs[-1][0].append(position)
                runs[-1][1].append(row)
            else:
                paths, values = self._read(row)
                positions, group = by_paths.setdefault(paths, ([], []))
                positions.append(position)
                group.append(values)
        blocks = []
        for paths, (positions, group) in by_paths.items():
            columns = [list(column) for column in zip(*group, strict=True)]
            blocks.append(
                _Block.read(paths, positions, columns, [set(map(type, column)) for column in columns])
            )
        return blocks + [_Block.fused(run, positions) for positions, run in runs]

    def _note(self, index: int, paths: Paths, values: tuple[Any, ...]) -> None:
        if self._newest.get(paths, (-1, ()))[0] < index:
            self._newest[paths] = (index, values)

    def _take_windows(self, *, wait: bool) -> None:
        windows = self._windows
        while windows and (wait or all(block.ready() for block in windows[0])):
            blocks = windows.popleft()
            if len(blocks) == 1:  # the usual case: every row logs the same entries
                self._paths += [blocks[0].paths] * len(blocks[0].positions)
                self._values += blocks[0].take()
                continue
            size = sum(len(block.positions) for block in blocks)
            paths: list[Paths] = [()] * size
            values: list[tuple[Any, ...]] = [()] * size
            for block in blocks:
                for position, row in zip(block.positions, block.take(), strict=True):
                    paths[position], values[position] = block.paths, row
            self._paths += paths
            self._values += values

    def latest(self) -> Logs:
        """The newest value of every entry in the history (values may still be device arrays).

        Example:
            >>> import ciclo
            >>> history = ciclo.history()
            >>> history.append(0, 0, 0.0, ciclo.logs().add_metric("a", 1).add_loss("b", 2))
            >>> history.append(1, 0, 0.0, ciclo.logs().add_metric("a", 3))
            >>> history.latest()
            {'metrics': {'a': 3}, 'losses': {'b': 2}}
        """
        pending = self._pending
        first = self.dropped + len(self) - len(pending)  # the first pending row's index
        start = max(self._scanned, first)
        rows = pending[start - first :]  # rows not noted yet
        if len(rows) > 1 and _alike_columns(rows) is not None:  # all log the same entries: the newest
            start, rows = start + len(rows) - 1, rows[-1:]
        for index, row in enumerate(rows, start):
            if type(row) is _FusedRow:
                self._note(index, row.paths, tuple([_StepValue(array, row.step) for array in row.arrays]))
            else:
                self._note(index, *self._read(row))
        self._scanned = first + len(pending)
        newest: dict[EntryPath, Any] = {}  # each entry's value in the newest row that logs it
        on_host = self.dropped + len(self._values)  # rows before this one give their host values
        for paths, (index, values) in sorted(self._newest.items(), key=lambda item: item[1][0]):
            if self.dropped <= index < on_host:
                values = self._values[index - self.dropped]
            newest.update(zip(paths, values, strict=True))
        logs = Logs()
        for (collection, name), value in newest.items():
            logs.add_entry(collection, name, value.array[value.step] if type(value) is _StepValue else value)
        return logs

    def _fetch(self, upto: int) -> None:
        if upto <= len(self._values):
            return
        self._take_windows(wait=True)
        self._start(upto - len(self._values))
        self._take_windows(wait=True)

    @property
    def on_host(self) -> int:
        """How many of the first rows are on the host: reading them never waits on the device."""
        return len(self._values)

    def host_rows(self, start: int, stop: int) -> Iterator[tuple[Paths, tuple[Any, ...], int, int, float]]:
        """Rows `start` to `stop` (of those kept), as `(paths, values, steps, samples, time)`, for loggers.

        Rows from `on_host` on wait for the device; rows that log the same entries share one `paths`.

        Example:
            >>> import ciclo
            >>> history = ciclo.history()
            >>> history.append(0, 8, 0.5, ciclo.logs().add_metric("acc", 0.25))
            >>> list(history.host_rows(0, 1))
            [((('metrics', 'acc'),), (0.25,), 0, 8, 0.5)]
        """
        self._fetch(stop)
        return zip(
            self._paths[start:stop],
            self._values[start:stop],
            self._steps[start:stop],
            self._samples[start:stop],
            self._times[start:stop],
            strict=True,
        )

    def to_host(self, first: int | None = None) -> dict[str, Any]:
        """The rows kept (from row `first` on, dropped rows counted) as host values: what a backup saves."""
        self._fetch(len(self))
        start = 0 if first is None else max(first - self.dropped, 0)
        return {
            "paths": self._paths[start:],
            "values": self._values[start:],
            "elapsed": list(
                zip(self._steps[start:], self._samples[start:], self._times[start:], strict=True)
            ),
            "max_rows": self.max_rows,
            "dropped": self.dropped,
            "evicted_latest": {paths: row for paths, (i, row) in self._newest.items() if i < self.dropped},
        }

    def load_host(self, rows: Mapping[str, Any]) -> None:
        """Replaces this history's rows with those of `to_host()` (a resumed loop's history)."""
        self._interned = {}
        self._paths = [self._interned.setdefault(paths, paths) for paths in rows["paths"]]
        self._values = list(rows["values"])
        self._steps = [steps for steps, _, _ in rows["elapsed"]]
        self._samples = [samples for _, samples, _ in rows["elapsed"]]
        self._times = [time for _, _, time in rows["elapsed"]]
        self.dropped = int(rows["dropped"])
        self._newest = {paths: (-1, values) for paths, values in rows["evicted_latest"].items()}
        for index, (paths, values) in enumerate(zip(self._paths, self._values, strict=True)):
            self._note(self.dropped + index, paths, values)
        self._pending, self._windows = [], deque()
        self._scanned = self.dropped + len(self)

    def __len__(self) -> int:
        return len(self._steps)

    @overload
    def __getitem__(self, index: int) -> Logs: ...

    @overload
    def __getitem__(self, index: slice) -> list[Logs]: ...

    def __getitem__(self, index: int | slice) -> Logs | list[Logs]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"history index {index} out of range for {len(self)} entries")
        self._fetch(index + 1)
        logs = Logs()
        for (collection, name), value in zip(self._paths[index], self._values[index], strict=True):
            logs.add_entry(collection, name, value)
        return logs.add_entries(
            "elapsed", steps=self._steps[index], samples=self._samples[index], time=self._times[index]
        )

    def __repr__(self) -> str:
        return f"History({len(self)} entries)"

    @overload
    def collect(self, key: str, /) -> list[Any]: ...

    @overload
    def collect(self, key: str, key2: str, /, *keys: str) -> tuple[list[Any], ...]: ...

    def collect(self, *keys: str) -> list[Any] | tuple[list[Any], ...]:
        """Values of `keys` over the entries in which all of them appear: a list, or a tuple of lists.

        A key is an entry name (`"accuracy"`), a full path (`"metrics.accuracy"`),
        or one of the elapsed keys `steps`, `samples`, `time`.
        """
        if not keys:
            raise TypeError("collect() needs at least one key")
        self._fetch(len(self))
        columns: tuple[list[Any], ...] = tuple([] for _ in keys)
        found = [False] * len(keys)
        # Resolve each key once per distinct set of paths, not once per entry.
        resolved: dict[Paths, list[tuple[bool, int]] | None] = {}
        counts = zip(self._steps, self._samples, self._times, strict=True)
        for paths, values, row_counts in zip(self._paths, self._values, counts, strict=True):
            plan = resolved.get(paths, ())
            if plan == ():
                plan = resolved[paths] = self._plan(paths, keys, found)
            if plan is None:
                continue
            for column, (from_counts, position) in zip(columns, plan, strict=True):
                column.append(row_counts[position] if from_counts else values[position])
        missing = [key for key, ok in zip(keys, found, strict=True) if not ok]
        if missing:
            present = [f"{c}.{n}" for c, n in self._entry_paths()]
            raise KeyError(
                f"{short(missing[0])} appears in no history entry; present: {sorted(present)} "
                f"and the elapsed keys {list(ELAPSED_KEYS)}"
            )
        if self.members is not None:  # a population's per-member entries: an array (steps, members)
            columns = tuple([np.stack(c) if self._per_member(c) else c for c in columns])  # type: ignore[misc]
        return columns[0] if len(keys) == 1 else columns

    def _per_member(self, column: Iterable[Any]) -> bool:
        return all(type(value) is np.ndarray and value.shape[:1] == (self.members,) for value in column)

    def member(self, index: int) -> History:
        """Member `index`'s own history: of a population's entries (shape `(members, ...)`), its values.

        Example:
            >>> import ciclo, numpy as np
            >>> history = ciclo.history()
            >>> history.members = 2  # as train_loop sets it for a population of 2
            >>> history.append(0, 8, 0.0, ciclo.logs().add_loss("loss", np.array([0.5, 0.25])))
            >>> history.collect("loss"), history.member(1).collect("loss")
            (array([[0.5 , 0.25]]), [0.25])
        """
        members = self.members
        if members is None:
            raise ValueError("history.member(i) reads a population's history (train_loop(population, ...))")
        check_int(index, "index", 0, f" below the population's size {members}")
        if index >= members:
            raise IndexError(f"member {index} out of range for a population of {members}")

        def own(values: tuple[Any, ...]) -> tuple[Any, ...]:
            return tuple([host_copies.to_host(v[index]) if self._per_member((v,)) else v for v in values])

        rows = self.to_host()
        rows["values"] = list(map(own, rows["values"]))
        rows["evicted_latest"] = {paths: own(row) for paths, row in rows["evicted_latest"].items()}
        history = History(self.max_rows)
        history.load_host(rows)
        history.running = set(self.running)
        return history

    @staticmethod
    def _plan(paths: Paths, keys: tuple[str, ...], found: list[bool]) -> list[tuple[bool, int]] | None:
        """Where each key's value is in rows with `paths`, `(in the counts, position)`; None if one lacks."""
        available = frozenset(paths) | {("elapsed", name) for name in ELAPSED_KEYS}
        located = [_entry_path(key, available) for key in keys]
        found[:] = [was or path is not None for was, path in zip(found, located, strict=True)]
        if None in located:
            return None
        return [
            (False, paths.index(path)) if path in paths else (True, ELAPSED_KEYS.index(path[1]))
            for path in cast("list[EntryPath]", located)
        ]

    def _entry_paths(self) -> tuple[EntryPath, ...]:
        self._fetch(len(self))
        return tuple(dict.fromkeys(path for paths in dict.fromkeys(self._paths) for path in paths))

    def plot(self, *entries: str, path: str | os.PathLike[str] | None = None) -> Figure:
        """Draws entries (none: every scalar entry) against steps, each with its `_test` entry.

        A population's entries are drawn one curve per member. Needs matplotlib
        (`pip install "ciclo-core[plot]"`); see docs/logging.md.
        `path` saves the figure (as PNG, or the format its suffix names).

        Example:
            >>> import ciclo
            >>> history = ciclo.history()
            >>> for step in range(3):
            ...     history.append(step, step, 0.0, ciclo.logs().add_loss("loss", 1.0 / (step + 1)))
            >>> figure = history.plot("loss")
            >>> figure.axes[0].lines[0].get_ydata().tolist()
            [1.0, 0.5, 0.3333333333333333]
        """
        from ciclo._src.logs.plot import plot_history

        return plot_history(self._entry_paths(), self.collect, entries, path)


def history(max_rows: int | None = None) -> History:
    """Creates an empty `History`.

    Args:
        max_rows: keep about this many of the newest rows (`latest()` still knows
            every entry's newest value); `0` keeps none, `None` every row.

    Example:
        >>> import ciclo
        >>> len(ciclo.history())
        0
    """
    return History(max_rows)


_LAG = 128
"""Rows younger than this keep their device arrays: their copies start once they are older."""


@final
class _FusedRow(NamedTuple):
    """A fused group's pending row: its entry `k` is `arrays[k][step]`, on the device."""

    paths: Paths
    arrays: tuple[Any, ...]
    step: int


@final
class _StepValue(NamedTuple):
    """One step's value of a fused group's array, indexed on the device only if `latest` shows it."""

    array: Any
    step: int


@final
@dataclasses.dataclass(slots=True)
class _Block:
    """Rows of a window that log the same entries, at `positions`: `columns[k]` holds entry `paths[k]`."""

    paths: Paths
    positions: Sequence[int]
    columns: list[list[Any]]
    copies: list[list[host_copies.Copy]]
    newest: tuple[Any, ...]

    @classmethod
    def read(
        cls, paths: Paths, positions: Sequence[int], columns: list[list[Any]], kinds: list[set[type]]
    ) -> _Block:
        copies = list(map(host_copies.start_column, columns, kinds))
        return cls(paths, positions, columns, copies, tuple([column[-1] for column in columns]))

    @classmethod
    def fused(cls, rows: list[_FusedRow], positions: Sequence[int]) -> _Block:
        arrays, first, count = rows[0].arrays, rows[0].step, len(rows)
        columns: list[list[Any]] = [[None] * count for _ in arrays]
        copies = [[host_copies.Copy(array, range(count), first)] for array in arrays]
        newest = tuple([_StepValue(array, rows[-1].step) for array in arrays])
        return cls(rows[0].paths, positions, columns, copies, newest)

    def ready(self) -> bool:
        return all(copy.ready() for copies in self.copies for copy in copies)

    def take(self) -> list[tuple[Any, ...]]:
        for column, copies in zip(self.columns, self.copies, strict=True):
            for copy in copies:
                copy.fill(column)
        return list(zip(*self.columns, strict=True)) if self.columns else [()] * len(self.positions)


_MISSING = object()  # what `_alike_columns` reads for an entry a row does not log
_DICTS = frozenset({dict, Logs, StackedLogs, Entries})


def _alike_columns(
    rows: Sequence[LogsLike | _FusedRow],
) -> tuple[Paths, list[list[Any]], list[set[type]]] | None:
    """`rows`' entry paths, value columns and each column's value types; None unless all log the same.

    C-level calls and no object made per row: how the history reads a loop's rows.
    """
    logs = cast("Sequence[dict[str, dict[str, Any]]]", rows)
    count = len(logs)
    if not set(map(type, logs)) <= _DICTS or list(map(len, logs)).count(len(logs[0])) != count:
        return None
    paths: list[EntryPath] = []
    columns: list[list[Any]] = []
    kinds: list[set[type]] = []
    for collection, names in logs[0].items():
        entries: list[Any] = list(
            map(dict.get, logs, itertools.repeat(collection), itertools.repeat(_MISSING))
        )
        if not set(map(type, entries)) <= _DICTS or list(map(len, entries)).count(len(names)) != count:
            return None
        for name in names:
            column = list(map(dict.get, entries, itertools.repeat(name), itertools.repeat(_MISSING)))
            column_kinds = set(map(type, column))
            if object in column_kinds:
                return None
            paths.append((collection, name))
            columns.append(column)
            kinds.append(column_kinds)
    return tuple(paths), columns, kinds


_chain = itertools.chain.from_iterable
_dict_values: Callable[[Mapping[str, Any]], Iterable[Any]] = dict.values  # type: ignore[assignment]


# A `Logs` is one pytree node whose children are its entries' values: unflattening a compiled
# step's output (after every step) is one call, not one per collection. Its aux data is
# `(collections, their entries' names)`.
_LogsNames = tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]


def _flatten_logs_tree(tree: Logs) -> tuple[list[Any], _LogsNames]:
    return list(_chain(map(_dict_values, tree.values()))), (tuple(tree), tuple(map(tuple, tree.values())))


def _unflatten_logs_tree(names: _LogsNames, children: Iterable[Any]) -> Logs:
    new = dict.__new__(Logs)
    values = iter(children)  # each collection's zip takes its entries' values from it, in order
    # No `strict=`: both sides come from one flatten, and a keyword makes `zip` ~0.2 µs slower. A
    # loop over the few collections is faster than nested `map`s (0.85 µs to 1.07 for two).
    for collection, keys in zip(*names):  # noqa: B905
        new[collection] = Entries(zip(keys, values))  # noqa: B905
    return new


def _flatten_entries_tree(tree: Entries) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    return tuple(tree.values()), tuple(tree)


def _unflatten_entries_tree(keys: tuple[str, ...], children: tuple[Any, ...]) -> Entries:
    return Entries(zip(keys, children, strict=True))


jax.tree_util.register_pytree_node(Logs, _flatten_logs_tree, _unflatten_logs_tree)
jax.tree_util.register_pytree_node(Entries, _flatten_entries_tree, _unflatten_entries_tree)


def _flatten_stacked_logs(tree: StackedLogs) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    return (*tree.values(), tree.per_step), tuple(tree)


def _unflatten_stacked_logs(keys: tuple[str, ...], children: tuple[Any, ...]) -> StackedLogs:
    new = dict.__new__(StackedLogs)
    dict.update(new, zip(keys, children[:-1], strict=True))
    new.per_step = children[-1]
    return new


jax.tree_util.register_pytree_node(StackedLogs, _flatten_stacked_logs, _unflatten_stacked_logs)
