"""Logs (what one step reports) and History (what a loop reported, step by step)."""

from __future__ import annotations

import itertools
import operator
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, cast, final, overload

import jax

from ciclo._src import host_copies
from ciclo._src.elapsed import Elapsed
from ciclo._src.entry_paths import entry_path as _entry_path
from ciclo._src.reprs import short

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LogsLike = Mapping[str, Mapping[str, Any]]
"""Nested mapping `{collection: {entry: value}}`, e.g. `{"metrics": {"loss": 0.3}}`."""

ELAPSED_KEYS = ("steps", "samples", "time")


_NUMERIC_COLLECTIONS = frozenset({"metrics", "losses", "stateful_metrics"})
"""Collections whose entries bars, loggers and aggregation treat as numbers."""


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
        if collection == "updates":
            # The property's getter raised AttributeError, which lands here.
            raise AttributeError("Logs.updates is write-only: assign logs to it to merge them")
        try:
            return self[collection]
        except KeyError:
            raise AttributeError(
                f"no collection {short(collection)}; collections are {sorted(self)}"
            ) from None

    @property
    def updates(self) -> NoReturn:
        """Write-only: `logs.updates = other` merges `other` into `logs`.

        Lets a step's logs be merged in the same line that unpacks its outputs:
        `logs.updates, state = train_step(state, batch)`.
        """
        raise AttributeError("Logs.updates is write-only: assign logs to it to merge them")

    @updates.setter
    def updates(self, updates: LogsLike | None) -> None:
        if updates is not None:
            self.merge(updates)

    def add_entry(self, collection: str, name: str, value: Any) -> Logs:
        """Sets `self[collection][name] = value`, creating the collection; returns self.

        Raises:
            TypeError: for a name that is not a non-empty string, or a string as a
                metric or a loss (they must be numbers or arrays).
        """
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"a log entry's name must be a non-empty string, got {short(name)} for {collection} "
                f"(e.g. logs.add_metric('accuracy', value))"
            )
        if isinstance(value, (str, bytes)) and collection in _NUMERIC_COLLECTIONS:
            raise TypeError(
                f"{collection}.{name} is the {type(value).__name__} {short(value)}: metrics and losses "
                "must be "
                "numbers or arrays (log text as an output: logs.add_output(name, text))"
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
        """Where `key` (`"name"` or `"collection.name"`) lives, or None if absent.

        Raises:
            ValueError: if a bare name is found in several collections.
        """
        return _entry_path(key, {(c, n) for c, entries in self.items() for n in entries})

    def entry_value(self, key: str) -> Any:
        """The value of `key` (`"name"` or `"collection.name"`).

        Raises:
            KeyError: if the key is absent, naming the keys present.
            ValueError: if a bare name is found in several collections.
        """
        path = self.entry_path(key)
        if path is None:
            present = sorted(f"{c}.{n}" for c, entries in self.items() for n in entries)
            raise KeyError(f"{short(key)} not found in logs; present: {present}")
        return self[path[0]][path[1]]


def collapse_leading_axis(logs: Logs, index: int) -> Logs:
    """Logs whose values carry a leading axis (devices, fused steps) as one step's logs.

    `outputs` are concatenated along that axis (`(n, rows, ...)` becomes
    `(n * rows, ...)`); every other entry takes its value at `index`.
    """
    out = Logs()
    for collection, entries in logs.items():
        if collection == "outputs":
            out[collection] = Entries({name: _merge_rows(value) for name, value in entries.items()})
        else:
            out[collection] = Entries({name: value[index] for name, value in entries.items()})
    return out


@final
class StackedLogs(Logs):
    """The logs of a fused group of steps: the last step's logs, with every step's in `per_step`.

    Used as a `Logs`, it is the group's last step's logs. `per_step` holds
    the same entries with a leading axis over the group's steps; a loop gives
    the history one entry per step from it, as if the steps had run one by one.
    Made by `ciclo.fuse`d steps and by managed steps given a `ciclo.types.Stacked` batch.

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
        """Stacked logs from every step's logs (a leading axis over steps); the last step's shown."""
        new = cls()
        for collection, entries in per_step.items():
            dict.__setitem__(new, collection, Entries({name: value[-1] for name, value in entries.items()}))
        new.per_step = per_step
        return new


def _merge_rows(value: Any) -> Any:
    return value.reshape((-1, *value.shape[2:])) if value.ndim >= 2 else value


def logs() -> Logs:
    """Creates an empty `Logs`.

    Example:
        >>> import ciclo
        >>> ciclo.logs().add_metric("loss", 0.5)
        {'metrics': {'loss': 0.5}}
    """
    return Logs()


_chain = itertools.chain.from_iterable
_dict_values: Callable[[Mapping[str, Any]], Iterable[Any]] = dict.values  # type: ignore[assignment]

Schema = tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]
"""A row's collections and, for each, its entry names: cheap to build and to hash."""


def _paths_of(schema: Schema) -> tuple[tuple[str, str], ...]:
    collections, names = schema
    return tuple(
        [
            (collection, name)
            for collection, entries in zip(collections, names, strict=True)
            for name in entries
        ]
    )


def _interned_paths(
    schema: Schema, interned: dict[Schema, tuple[tuple[str, str], ...]]
) -> tuple[tuple[str, str], ...]:
    """The entry paths of rows with `schema`: one tuple shared by every such row of a history."""
    paths = interned.get(schema)
    if paths is None:
        paths = interned[schema] = _paths_of(schema)
    return paths


def _rows_of(
    logs: Sequence[LogsLike | _StepRow], interned: dict[Schema, tuple[tuple[str, str], ...]]
) -> tuple[list[tuple[tuple[str, str], ...]], list[tuple[Any, ...]]]:
    """The entry paths and values of each of `logs`, a history's rows; paths interned by schema."""
    all_paths, all_values = [], []
    for row in logs:
        if isinstance(row, _StepRow):
            all_paths.append(row.paths)
            all_values.append(tuple([host_copies.Step(array, row.index) for array in row.arrays]))
            continue
        values = row.values()
        all_paths.append(_interned_paths((tuple(row), tuple(map(tuple, values))), interned))
        all_values.append(tuple(_chain(map(_dict_values, values))))
    return all_paths, all_values


def _columns_of(
    logs: Sequence[LogsLike | _StepRow], interned: dict[Schema, tuple[tuple[str, str], ...]]
) -> tuple[tuple[tuple[str, str], ...], list[list[Any]]] | None:
    """The entry paths and value columns of rows that all log the same entries; None if they do not.

    Read with C-level calls, no object made per row: what a loop's rows are, step after step.
    """
    rows = cast("Sequence[LogsLike]", logs)
    names: list[tuple[str, ...]] = []
    columns: list[list[Any]] = []
    # Rows with as many keys as the first, each of its keys among them, have its keys: no tuple is
    # made per row to compare them (a missing key raises KeyError; a `_StepRow`, TypeError).
    try:
        collections = tuple(rows[0])
        if list(map(len, rows)).count(len(collections)) != len(rows):
            return None
        for collection in collections:
            entries = list(map(operator.itemgetter(collection), rows))
            keys = tuple(entries[0])
            if list(map(len, entries)).count(len(keys)) != len(entries):
                return None
            names.append(keys)
            columns.extend([list(map(operator.itemgetter(name), entries)) for name in keys])
    except (KeyError, TypeError):
        return None
    return _interned_paths((collections, tuple(names)), interned), columns


@final
class _StepRow:
    """A pending row of a fused group: one step's values of the group's arrays (a leading axis over steps)."""

    __slots__ = ("arrays", "index", "paths")

    def __init__(self, paths: tuple[tuple[str, str], ...], arrays: tuple[Any, ...], index: int) -> None:
        self.paths = paths
        self.arrays = arrays
        self.index = index


@final
class _ColumnWindow:
    """Rows logging the same entries whose columns of device scalars are being copied, stacked."""

    __slots__ = ("columns", "copies", "paths", "size")

    def __init__(
        self,
        paths: tuple[tuple[str, str], ...],
        columns: list[list[Any]],
        copies: dict[int, list[host_copies.Copy]],
        size: int,
    ) -> None:
        self.paths = paths
        self.columns = columns  # host columns as they are; the copied ones are replaced when taken
        self.copies = copies  # column -> its stacked copies
        self.size = size  # rows (a row may log no entry, so not always the columns' length)

    def ready(self) -> bool:
        return all(copy.ready() for copies in self.copies.values() for copy in copies)

    def take(self) -> tuple[list[tuple[tuple[str, str], ...]], list[tuple[Any, ...]]]:
        columns = self.columns
        for column, copies in self.copies.items():
            columns[column] = list(_chain([copy.values() for copy in copies]))
        rows = list(zip(*columns, strict=True)) if columns else [()] * self.size
        return [self.paths] * self.size, rows

    def row(self, index: int) -> tuple[tuple[tuple[str, str], ...], tuple[Any, ...]]:
        return self.paths, tuple([column[index] for column in self.columns])


@final
class _RowWindow:
    """Rows of any entries whose device values are being copied one value, or one group, at a time."""

    __slots__ = ("converted", "copies", "paths", "values")

    def __init__(self, paths: list[tuple[tuple[str, str], ...]], values: list[tuple[Any, ...]]) -> None:
        self.paths = paths
        self.values = values
        self.copies, self.converted = host_copies.start(values, paths, 0)

    @property
    def size(self) -> int:
        return len(self.values)

    def ready(self) -> bool:
        return all(copy.ready() for copy in self.copies)

    def take(self) -> tuple[list[tuple[tuple[str, str], ...]], list[tuple[Any, ...]]]:
        rows: dict[int, list[Any]] = {}
        values = self.values
        cells = [
            (target, value)
            for copy in self.copies
            for target, value in zip(copy.targets, copy.values(), strict=True)
        ]
        for (row, column, _), value in itertools.chain(cells, self.converted.items()):
            cells_of_row = rows.get(row)
            if cells_of_row is None:
                cells_of_row = rows[row] = list(values[row])
            cells_of_row[column] = value
        for row, row_values in rows.items():
            values[row] = tuple(row_values)
        return self.paths, values

    def row(self, index: int) -> tuple[tuple[tuple[str, str], ...], tuple[Any, ...]]:
        return self.paths[index], self.values[index]


_Window = _ColumnWindow | _RowWindow

_LAG = 128
"""Rows younger than this keep their device arrays: their copies start once they are older."""


class History(Sequence[Logs]):
    """The logs a loop committed, one entry per step that logged something.

    Each entry is a `Logs` with an extra `elapsed` collection (`steps`, `samples`,
    `time`). Committing never waits on the device: the history keeps the logs a
    step returned as they are (do not change them afterwards), JAX arrays
    included. Once rows are a few hundred steps old, it starts copying their
    arrays to the host in batches (a column of scalars as one array), and takes
    the copies a window later, once the device has computed them (`on_host`
    counts the rows taken). Reading an entry or `collect` copies what is still
    on the device, waiting for it. Scalars are stored as Python numbers, so long
    runs take little memory.

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
        if max_rows is not None and (
            isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 0
        ):
            raise ValueError(f"max_rows must be None (keep every row) or an int >= 0, got {short(max_rows)}")
        self.max_rows = max_rows
        # rows dropped from the front by `max_rows`; `latest` still knows their newest values
        self.dropped = 0
        self._evicted_latest: dict[tuple[tuple[str, str], ...], tuple[Any, ...]] = {}
        # The rows on the host: their entry paths and values.
        self._paths: list[tuple[tuple[str, str], ...]] = []
        self._values: list[tuple[Any, ...]] = []
        # Every row's steps, samples and time, on the host or not, one after the other: no tuple is
        # kept per row (each would be one more object for the garbage collector to go through).
        self._elapsed: list[float] = []
        # schema (collections and names) -> the entry paths of rows with that schema, shared by the rows
        self._interned: dict[Schema, tuple[tuple[str, str], ...]] = {}
        # entry paths -> the index of the newest row with them that was read (for `latest`)
        self._newest: dict[tuple[tuple[str, str], ...], int] = {}
        # After the host rows: rows whose copies were started, oldest first...
        self._windows: deque[_Window] = deque()
        # ...then the newest rows, as the logs their steps returned (rows `_started` onwards).
        self._pending: list[LogsLike | _StepRow] = []
        self._started = 0
        self._scanned = 0  # pending rows whose paths `_newest` knows

    def commit(self, elapsed: Elapsed, logs: LogsLike) -> None:
        """Appends `logs` as the entry for `elapsed`; does not wait on the device."""
        self.append(elapsed.steps, elapsed.samples, elapsed.time, logs)

    def append(self, steps: int, samples: int, time: float, logs: LogsLike) -> None:
        """Appends `logs` as the entry at these counts: `commit` without building an `Elapsed`.

        The history keeps `logs` itself (the hot path of every loop): rows are
        read out of it in batches, a few hundred rows later.
        """
        pending = self._pending
        pending.append(logs)
        self._elapsed += (steps, samples, time)
        if len(pending) >= 2 * _LAG:
            self._advance()

    def append_steps(
        self, steps: int, samples: int, time: float, per_step: Logs, rows: int, batch_size: int
    ) -> None:
        """Appends `rows` entries from logs with a leading axis over steps (a fused group's first steps).

        Row `i` holds each entry's value at index `i`, at `steps + i` steps and
        `samples + i * batch_size` samples. The values are sliced when the
        history copies them to the host: one copy per entry for the whole group.
        """
        (paths,), (arrays,) = _rows_of([per_step], self._interned)
        self._pending += [_StepRow(paths, arrays, i) for i in range(rows)]
        self._elapsed += _chain([(steps + i, samples + i * batch_size, time) for i in range(rows)])
        if len(self._pending) >= 2 * _LAG:
            self._advance()

    def _advance(self) -> None:
        """Starts the copies of the rows now `_LAG` rows old, and takes those that are done; never waits.

        A window whose device values are still being computed is taken at a
        later call (the next one is `_LAG` rows later), once they are.
        """
        self._start(len(self._pending) - _LAG)
        self._take_windows(wait=False)
        if self.max_rows is not None:
            self._drop_old_rows()

    def _start(self, count: int) -> None:
        """Starts copying the oldest `count` pending rows to the host, as a window."""
        if count <= 0:
            return
        rows = self._pending[:count]
        del self._pending[:count]
        # `latest` already read the first `_scanned` pending rows into `_newest`, with newer rows after.
        known = min(self._scanned, count)
        window: _Window | None = self._column_window(rows)
        if isinstance(window, _ColumnWindow):
            if known < count:
                self._newest[window.paths] = self._started + count - 1
        else:
            all_paths, values = _rows_of(rows, self._interned)
            window = _RowWindow(all_paths, values)
            first = self._started + known
            self._newest.update(zip(all_paths[known:], range(first, self._started + count), strict=True))
        self._windows.append(window)
        self._started += count
        self._scanned = max(self._scanned - count, 0)

    def _column_window(self, rows: list[LogsLike | _StepRow]) -> _ColumnWindow | None:
        """The rows as a window of stacked column copies; None, having started nothing, if they are not.

        They are when every row logs the same entries and each entry is a
        Python number in every row, or a JAX scalar in every row.
        """
        columns_of = _columns_of(rows, self._interned)
        if columns_of is None:
            return None
        paths, columns = columns_of
        on_device = [
            i for i, column in enumerate(columns) if not set(map(type, column)) <= host_copies.HOST_SCALARS
        ]
        if not all(host_copies.stacks(columns[i]) for i in on_device):
            return None  # arrays, or host values to convert: copied value by value
        copies: dict[int, list[host_copies.Copy]] = {}
        for i in on_device:
            column_copies = host_copies.start_column(columns[i])
            if column_copies is None:
                return None  # scalars that do not stack together (devices, shardings)
            copies[i] = column_copies
        return _ColumnWindow(paths, columns, copies, len(rows))

    def _take_windows(self, *, wait: bool) -> None:
        """Moves the finished windows' rows to the host rows (with `wait`: every window, waiting)."""
        windows = self._windows
        while windows and (wait or windows[0].ready()):
            paths, values = windows.popleft().take()
            self._paths += paths
            self._values += values

    def _drop_old_rows(self) -> None:
        """Drops the oldest host rows beyond `max_rows`; `latest` keeps the newest value of each entry."""
        # The newest rows copied to the host stay for one more batch, so that a logger reading the
        # history at every step sees each row before it goes.
        excess = min(len(self) - int(self.max_rows or 0), len(self._values) - _LAG)
        if excess <= 0:
            return
        for paths, index in list(self._newest.items()):
            if index < excess:
                self._evicted_latest[paths] = self._values[index]
                del self._newest[paths]
            else:
                self._newest[paths] = index - excess
        del self._paths[:excess], self._values[:excess], self._elapsed[: 3 * excess]
        self._started -= excess
        self.dropped += excess

    def _row(self, index: int) -> tuple[tuple[tuple[str, str], ...], tuple[Any, ...]]:
        """Row `index`'s entry paths and values, wherever it is (values may be on the device)."""
        if index < len(self._values):
            return self._paths[index], self._values[index]
        index -= len(self._values)
        for window in self._windows:
            if index < window.size:
                return window.row(index)
            index -= window.size
        (paths,), (values,) = _rows_of([self._pending[index]], self._interned)
        return paths, values

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
        unscanned = self._pending[self._scanned :]
        if unscanned:
            scanned, _ = _rows_of(unscanned, self._interned)
            first = self._started + self._scanned
            self._newest.update(zip(scanned, range(first, first + len(scanned)), strict=True))
            self._scanned = len(self._pending)
        logs = Logs()
        for paths, row in self._evicted_latest.items():
            for (collection, name), value in zip(paths, row, strict=True):
                logs.add_entry(collection, name, value)
        for _, index in sorted(self._newest.items(), key=lambda item: item[1]):
            row_paths, row_values = self._row(index)
            for (collection, name), value in zip(row_paths, row_values, strict=True):
                logs.add_entry(collection, name, value.value() if type(value) is host_copies.Step else value)
        return logs

    def _fetch(self, upto: int) -> None:
        """Brings rows up to `upto` to the host, waiting for their device values."""
        if upto <= len(self._values):
            return
        self._take_windows(wait=True)
        self._start(upto - self._started)
        self._take_windows(wait=True)

    @property
    def on_host(self) -> int:
        """How many of the first rows are on the host: reading them never waits on the device.

        Rows are copied in batches, a few hundred steps behind the newest, and
        counted here once the device has computed them; a logger that writes
        these rows as they come never forces a sync.
        """
        return len(self._values)

    def host_rows(
        self, start: int, stop: int
    ) -> Iterator[tuple[tuple[tuple[str, str], ...], tuple[Any, ...], tuple[int, int, float]]]:
        """Rows `start` to `stop` (of those kept) as `(entry paths, values, (steps, samples, time))`.

        Values are host values: what is still on the device is copied first,
        waiting for it (rows before `on_host` never wait). Rows that log the
        same entries share one `paths` object. What loggers read: no `Logs` is
        built.

        Example:
            >>> import ciclo
            >>> history = ciclo.history()
            >>> history.append(0, 8, 0.5, ciclo.logs().add_metric("acc", 0.25))
            >>> list(history.host_rows(0, 1))
            [((('metrics', 'acc'),), (0.25,), (0, 8, 0.5))]
        """
        self._fetch(stop)
        return zip(
            self._paths[start:stop], self._values[start:stop], self._elapsed_rows(start, stop), strict=True
        )

    def to_host(self, first: int | None = None) -> dict[str, Any]:
        """The rows as plain host values: what a backup saves, and `load_host` reads back.

        Args:
            first: only the rows from this one on, counted from the first row
                ever (dropped rows counted): a backup saves the rows since its
                last one. Default: every row kept.
        """
        self._fetch(len(self))
        start = 0 if first is None else max(first - self.dropped, 0)
        return {
            "paths": self._paths[start:],
            "values": self._values[start:],
            "elapsed": self._elapsed_rows(start, len(self)),
            "max_rows": self.max_rows,
            "dropped": self.dropped,
            "evicted_latest": dict(self._evicted_latest),
        }

    def load_host(self, rows: Mapping[str, Any]) -> None:
        """Replaces this history's rows with those of `to_host()` (a resumed loop's history)."""
        self._paths, self._values = list(rows["paths"]), list(rows["values"])
        self._elapsed = list(_chain(rows["elapsed"]))
        self.dropped = int(rows["dropped"])
        self._evicted_latest = dict(rows["evicted_latest"])
        self._interned = {}  # new rows intern their paths again: equal paths are the same key
        self._newest = {paths: index for index, paths in enumerate(self._paths)}
        self._pending, self._windows = [], deque()
        self._started, self._scanned = len(self._values), 0

    def __len__(self) -> int:
        return len(self._elapsed) // 3

    def _elapsed_rows(self, start: int, stop: int) -> list[tuple[int, int, float]]:
        """The `(steps, samples, time)` of rows `start` to `stop`."""
        flat = iter(self._elapsed[3 * start : 3 * stop])
        return list(zip(flat, flat, flat, strict=True))  # type: ignore[arg-type]

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
        for name, value in zip(ELAPSED_KEYS, self._elapsed[3 * index : 3 * index + 3], strict=True):
            logs.add_entry("elapsed", name, value)
        return logs

    def __iter__(self) -> Iterator[Logs]:
        for index in range(len(self)):
            yield self[index]

    def __repr__(self) -> str:
        return f"History({len(self)} entries)"

    @overload
    def collect(self, key: str, /) -> list[Any]: ...

    @overload
    def collect(self, key: str, key2: str, /, *keys: str) -> tuple[list[Any], ...]: ...

    def collect(self, *keys: str) -> list[Any] | tuple[list[Any], ...]:
        """Values of `keys` over the entries in which all of them appear.

        A key is an entry name (`"accuracy"`), a full path (`"metrics.accuracy"`),
        or one of the elapsed keys `steps`, `samples`, `time`.

        Returns:
            One list for one key; a tuple of lists, one per key, for several.

        Raises:
            KeyError: if a key appears in no entry (the message lists those present).
            ValueError: if a bare name is found in several collections.
        """
        if not keys:
            raise TypeError("collect() needs at least one key")
        self._fetch(len(self))
        columns: tuple[list[Any], ...] = tuple([] for _ in keys)
        found = [False] * len(keys)
        # Resolve each key once per distinct set of paths, not once per entry.
        resolved: dict[tuple[tuple[str, str], ...], list[tuple[bool, int]] | None] = {}
        rows = zip(self._paths, self._values, self._elapsed_rows(0, len(self)), strict=True)
        for paths, values, elapsed in rows:
            plan = resolved.get(paths, ())
            if plan == ():
                plan = resolved[paths] = self._plan(paths, keys, found)
            if plan is None:
                continue
            for column, (from_elapsed, position) in zip(columns, plan, strict=True):
                column.append(elapsed[position] if from_elapsed else values[position])
        missing = [key for key, ok in zip(keys, found, strict=True) if not ok]
        if missing:
            present = sorted({f"{c}.{n}" for paths in self._interned.values() for c, n in paths})
            raise KeyError(
                f"{short(missing[0])} appears in no history entry; present: {present} "
                f"and the elapsed keys {list(ELAPSED_KEYS)}"
            )
        return columns[0] if len(keys) == 1 else columns

    @staticmethod
    def _plan(
        paths: tuple[tuple[str, str], ...], keys: tuple[str, ...], found: list[bool]
    ) -> list[tuple[bool, int]] | None:
        available = frozenset(paths) | {("elapsed", name) for name in ELAPSED_KEYS}
        plan: list[tuple[bool, int]] | None = []
        for i, key in enumerate(keys):
            path = _entry_path(key, available)
            if path is None:
                plan = None
                continue
            found[i] = True
            if plan is not None:
                if path[0] == "elapsed" and path not in paths:
                    plan.append((True, ELAPSED_KEYS.index(path[1])))
                else:
                    plan.append((False, paths.index(path)))
        return plan

    def _entry_paths(self) -> tuple[tuple[str, str], ...]:
        """Every `(collection, name)` some entry holds, in the order they first appeared."""
        self._fetch(len(self))
        return tuple(dict.fromkeys(path for paths in dict.fromkeys(self._paths) for path in paths))

    def plot(self, *entries: str, path: str | os.PathLike[str] | None = None) -> Figure:
        """Draws entries against steps with matplotlib; one subplot per entry, its test curve with it.

        Each subplot draws an entry (`"loss"`, or a full path `"losses.loss"`)
        and, when the history has it, its test entry (`"loss_test"`, as
        `train_loop` names what its evaluation logs). The figure is built without
        `pyplot`, so it needs no screen; in a notebook, it shows as the cell's value.
        Needs matplotlib (`pip install "ciclo-core[plot]"`).

        Args:
            *entries: the entries to draw; none draws every scalar entry.
            path: where to save the figure (as PNG, or the format its suffix names).

        Returns:
            The `matplotlib.figure.Figure`.

        Raises:
            ImportError: if matplotlib is not installed.
            KeyError: if an entry appears in no history entry.

        Example:
            >>> import ciclo
            >>> history = ciclo.history()
            >>> for step in range(3):
            ...     history.append(step, step, 0.0, ciclo.logs().add_loss("loss", 1.0 / (step + 1)))
            >>> figure = history.plot("loss")
            >>> figure.axes[0].lines[0].get_ydata().tolist()
            [1.0, 0.5, 0.3333333333333333]
        """
        from ciclo._src.plot import plot_history

        return plot_history(self, entries, path)


def history(max_rows: int | None = None) -> History:
    """Creates an empty `History`.

    Args:
        max_rows: keep at most about this many of the newest rows (older rows are
            dropped once they are on the host; `latest()` still knows every
            entry's newest value). `0` keeps none: for long runs that log
            elsewhere. `None` (the default) keeps every row.

    Example:
        >>> import ciclo
        >>> len(ciclo.history())
        0
    """
    return History(max_rows)


# A `Logs` is one pytree node whose children are its entries' values, and whose aux data
# names them, collection by collection: unflattening a compiled step's output (in Python,
# after every step) is then one call, where a node per collection took one call each.
def _flatten_logs_tree(tree: Logs) -> tuple[list[Any], tuple[tuple[str, tuple[str, ...]], ...]]:
    return list(_chain(map(_dict_values, tree.values()))), tuple(
        [(collection, tuple(entries)) for collection, entries in tree.items()]
    )


def _unflatten_logs_tree(names: tuple[tuple[str, tuple[str, ...]], ...], children: Iterable[Any]) -> Logs:
    values = iter(children)
    new = dict.__new__(Logs)
    dict.update(new, [(collection, Entries(zip(keys, values, strict=False))) for collection, keys in names])
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
