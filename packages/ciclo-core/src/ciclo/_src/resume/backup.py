"""Backups: what a loop needs to go on after a kill, saved atomically with orbax (docs/resume.md).

Each backup is one orbax step holding `state`, `loop` (a JSON document, checked
field by field when read) and `kept` (trees shaped like the state that callbacks
hold). Each backup writes the History's rows since the last to `history/`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import itertools
import json
import logging
import math
import os
import re
import signal
import socket
import stat
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, final

import jax
import numpy as np

from ciclo._src.base.checks import check_bool, check_directory, check_int
from ciclo._src.base.compile_cache import compiled
from ciclo._src.base.elapsed import Elapsed, Period, make_elapsed, only_steps
from ciclo._src.base.files import check_closed, open_own, remove_own, write_atomically
from ciclo._src.base.finite import all_finite
from ciclo._src.base.reprs import cut, short
from ciclo._src.base.schedules import Every
from ciclo._src.data.position import iterator_state
from ciclo._src.engine.callback import Callback
from ciclo._src.resume.goodput import Recorder, goodput, saving
from ciclo._src.resume.host_json import Schema, check_document, from_json, to_json
from ciclo._src.resume.orbax_io import (
    abstract,
    announce,
    check_device_axis,
    check_structure,
    is_single_leaf,
    note_lost_peer,
    open_manager,
    orbax,
    restore_everywhere,
    stored_tree,
)
from ciclo._src.resume.signals import SignalGuard
from ciclo._src.state.learning_rate import changed_hyperparameters
from ciclo._src.state.managed import ResumeRefused, check_static_options, static_options

if sys.platform != "win32":
    import fcntl

if TYPE_CHECKING:
    from ciclo._src.engine.loop_state import LoopState

_log = logging.getLogger("ciclo")


_FORMAT = 4  # of the loop document (format 1 held a pickle: refused, never read)
_MARKER = "ciclo_backup.json"  # says the directory holds ciclo backups
_HISTORY_DIR = "history"  # the History's rows, in files rows-<first>-<end>.json
_CHUNK = re.compile(r"rows-(\d+)-(\d+)\.json")
_BARRIERS = "ciclo_backup"  # the backups' kind in orbax's barrier names
_HEADING = re.compile(r":\s")  # ends the heading of an error: its file, its step
_LOCK = "ciclo_backup.lock"  # held while a loop uses the directory: the owner's pid and host


class Preempted(SystemExit):
    """Raised by a loop after it saved its backup on SIGTERM (or SIGINT when asked).

    A `SystemExit` of code 128 plus the signal's number (143 for SIGTERM): run
    the same script again to resume from the backup.
    """

    def __init__(self, signum: int, steps: int, directory: str) -> None:
        super().__init__(128 + signum)
        self.signum = signum
        self.steps = steps
        self.directory = directory

    def __str__(self) -> str:
        name = signal.Signals(self.signum).name
        return (
            f"preempted by {name} after step {self.steps}: the backup is saved in {self.directory}; run "
            "the same command again to resume from it"
        )


@dataclasses.dataclass(frozen=True)
class Backup:
    """Where and how often a loop saves what it needs to resume; create it with `ciclo.backup`."""

    directory: str
    every: Any = None
    keep: int = 2
    sigint: bool = False

    def __repr__(self) -> str:
        return (
            f"ciclo.backup({self.directory!r}, every={self.every!r}, keep={self.keep}, sigint={self.sigint})"
        )

    def callback(self, kind: str) -> BackupCallback:
        """This backup as a callback for `run_phases(callbacks=[...])`, first; `kind` names the loop."""
        return BackupCallback(self, kind=kind)


def backup(
    directory: str | os.PathLike[str],
    *,
    every: int | Period | Any = None,
    keep: int = 2,
    sigint: bool = False,
) -> Backup:
    """Backups of a loop in `directory`, so that a killed run goes on where it stopped.

    Give it to a loop as `backup=` (a plain directory means
    `ciclo.backup(directory)`). The loop saves the state, the `Elapsed`, the
    History, the callbacks' states and the dataset position; when it finds a
    backup, it restores them and continues, bit for bit as a run never
    interrupted if the steps are deterministic. On SIGTERM (and SIGINT with
    `sigint=True`) the loop finishes the step, saves, and raises
    `ciclo.types.Preempted`. Datasets, signals, several processes: docs/resume.md.

    Args:
        directory: where the backups go (created if needed).
        every: how often to save: a number of steps, a `ciclo.types.Period`, or a
            schedule (`ciclo.every(...)`). Default: at each epoch's end in
            `train_loop`, every 1000 steps in the other loops. The loop also
            saves at its end and when preempted.
        keep: how many backups to keep (at least 2, so that a kill during a
            save leaves the previous one).
        sigint: also treat SIGINT (Ctrl-C) as a preemption.

    Example:
        >>> import ciclo, tempfile
        >>> def train_step(state, batch):
        ...     return ciclo.logs().add_metric("x", state), state + batch
        >>> directory = tempfile.mkdtemp()
        >>> state, history, elapsed = ciclo.loop(
        ...     0, range(10), {ciclo.every(1): train_step}, stop=6, backup=directory
        ... )
        >>> state, elapsed.steps
        (15, 6)
        >>> state, history, elapsed = ciclo.loop(  # finished: returns at once
        ...     0, range(10), {ciclo.every(1): train_step}, stop=6, backup=directory
        ... )
        >>> int(state), elapsed.steps, len(history)
        (15, 6, 6)
    """
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"backup directory must be a path, got {short(directory)}")
    check_int(keep, "keep", 2, " (a kill during a save must leave one)")
    check_bool(sigint, "sigint")
    _schedule(every)  # checked now, not at the first step
    path = os.path.abspath(os.fspath(directory))
    check_directory(path, "backup directory")
    return Backup(path, every, keep, sigint)


def _schedule(every: Any) -> Any:
    """`every` as a schedule of the `Elapsed` (an `Every` for a number of steps or a period), or None."""
    steps = only_steps(every) if isinstance(every, Period) else every
    if isinstance(steps, int) and not isinstance(steps, bool):
        if steps < 1:
            raise ValueError(f"every must be >= 1 step, got {short(every)}")
        return Every(Period(steps=steps))
    if every is None or isinstance(every, Period) or callable(every):
        return Every(every) if isinstance(every, Period) else every
    raise TypeError(
        f"every must be a number of steps, a ciclo.types.Period or a schedule, got {short(every)}"
    )


@dataclasses.dataclass
class Restored:
    """What a backup held: the loop goes on from here."""

    step: int
    state: Any
    elapsed: Elapsed
    history: dict[str, Any]
    callbacks: dict[str, Any]
    position: int
    iterator_state: Any
    finished: bool
    kind: str
    stop: Period | None
    samples: int
    devices: int | None = None  # of the run that wrote it, where the backup recorded it
    skipped: tuple[int, ...] = ()  # the newer backups that could not be read


def _is_count(x: Any) -> bool:
    return type(x) is int and x >= 0


def _is_time(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_period(x: Any) -> bool:
    try:
        return x is None or isinstance(x, list) and len(x) == 4 and isinstance(Period(*x), Period)
    except (TypeError, ValueError):
        return False


def _loop_schema(step: int) -> Schema:
    """The structure of the loop document of the backup numbered `step` (its format, `_FORMAT`)."""
    elapsed = "[steps, samples, time, date_start], steps the backup's number"
    return {
        "format": (int, lambda x: x == _FORMAT, f"{_FORMAT}, the format this ciclo reads"),
        "kind": (str, None, "the name of a loop"),
        "stop": (object, _is_period, "null or a period [steps, samples, time, date]"),
        "finished": (bool, None, "true or false"),
        "elapsed": (
            list,
            lambda x: (
                len(x) == 4 and x[0] == step and _is_count(x[1]) and all(map(_is_time, x[2:])) and x[2] >= 0
            ),
            elapsed,
        ),
        "history": None,  # read by from_json and _HISTORY_SCHEMA
        "callbacks": (dict, None, "a dict"),
        "position": (
            int,
            lambda x: 0 <= x <= step,
            f"a number of batches from 0 to the {step} steps completed",
        ),
        "samples": (int, _is_count, "a count"),
        "iterator_state": None,  # read by from_json
        "kept": (list, lambda x: all(isinstance(name, str) for name in x), "a list of names"),
        "options": None,  # read by check_static_options
        "devices?": (int, lambda x: x > 0, "a device count"),  # earlier ciclo versions did not record it
    }


_HISTORY_SCHEMA: Schema = {
    "chunks": (
        list,
        lambda x: all(isinstance(c, list) and len(c) == 2 and all(map(_is_count, c)) for c in x),
        "a list of [first, end] rows",
    ),
    "max_rows": None,
    "dropped": (int, _is_count, "a count"),
    "evicted_latest": (dict, None, "a dict"),
}


def _checked_loop_item(item: Any, step: int, where: str) -> dict[str, Any]:
    if isinstance(item, dict) and item.get("format") == 1:
        raise ValueError(
            f"{where} was written by an earlier ciclo, whose backups held a pickle: it is not read, as "
            "loading a backup never runs code from the directory. Give backup= another directory to "
            "start afresh"
        )
    fields = check_document(item, _loop_schema(step), where)
    fields["stop"] = None if fields["stop"] is None else Period(*fields["stop"])
    return fields


def _check_rows(part: dict[str, Any], where: str, first: int) -> None:
    """Refuses a chunk file's row unlike `History.to_host`'s."""
    for index, (paths, values, elapsed) in enumerate(zip(*(part[name] for name in _COLUMNS), strict=True)):
        row = f"{where}: row {first + index}"
        if not isinstance(paths, tuple) or not all(
            isinstance(p, tuple) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in paths
        ):
            raise ValueError(f"{row}: paths is {short(paths)}, not (collection, name) pairs")
        if not isinstance(values, tuple) or len(values) != len(paths):
            raise ValueError(
                f"{row}: values is {short(values)}, not one value for each of its {len(paths)} paths"
            )
        for (collection, name), value in zip(paths, values, strict=True):
            numeric = isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in "biufc"
            if not numeric and not isinstance(value, (bool, int, float)):
                raise ValueError(f"{row}: {collection}.{name} is {short(value)}, not a number or an array")
        if not (isinstance(elapsed, tuple) and len(elapsed) == 3 and _is_time(elapsed[2])) or not all(
            map(_is_count, elapsed[:2])
        ):
            raise ValueError(f"{row}: elapsed is {short(elapsed)}, not (steps, samples, time)")


_COLUMNS = ("paths", "values", "elapsed")


def _checked_chunks(item: Any, where: str) -> list[tuple[int, int]]:
    """The document's history chunks, `[[first, end], ...]`, checked to follow each other."""
    chunks, dropped = check_document(item, _HISTORY_SCHEMA, where)["chunks"], item["dropped"]
    ranges = [(first, end) for first, end in chunks]
    follows = all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    if not all(first < end for first, end in ranges) or not follows or (ranges and ranges[0][0] > dropped):
        raise ValueError(f"{where}: chunks {short(chunks)} do not cover the rows from {dropped} on, in order")
    return ranges


@final
class BackupCallback(Callback):
    """A loop's backup as a callback (`Backup.callback`): restores before the first step, saves after.

    The backup of the start is written when the first batch is drawn; the
    finished run's after the other callbacks' `on_end` (loggers flushed what the
    backup then claims).
    """

    straggler_factor: float | None = None  # a watchdog's: under several processes, each save reports

    def __init__(
        self, spec: Backup | str | os.PathLike[str], *, kind: str, default_every: Any = None
    ) -> None:
        self.spec = spec if isinstance(spec, Backup) else backup(spec)
        self.kind = kind
        self.default_every = default_every

    def on_start(self, loop_state: LoopState[Any], /) -> None:
        spec, began = self.spec, time.monotonic()
        self._goodput: Recorder | None = None
        every = next(every for every in (spec.every, self.default_every, 1000) if every is not None)
        self._due = _schedule(every)
        if jax.process_count() > 1 and (type(self._due) is not Every or self._due.step_boundary() is None):
            raise ValueError(
                "under several processes, backup(every=...) must be a number of steps: all processes "
                f"must save at the same step, and a schedule in time would not agree; got {short(spec.every)}"
            )
        self._ocp = ocp = orbax()
        os.makedirs(spec.directory, exist_ok=True)
        check_closed(spec.directory, "the backup directory")
        self._last_saved: int | None = None
        self._recent: list[list[tuple[int, int]]] = []  # the History chunks of the kept backups, newest last
        self._guard: SignalGuard | None = None
        self._manager: Any = None
        self._resumed = False  # until its first step ends, which then says what it compiled
        # Locked first: a run started at the same instant is refused before it writes anything here.
        self._lock = _lock(spec.directory)
        try:
            self._check_marker()
            self._manager = open_manager(
                spec.directory,
                _BARRIERS,
                item_handlers={
                    "state": ocp.StandardCheckpointHandler(),
                    "kept": ocp.StandardCheckpointHandler(),
                    "loop": ocp.JsonCheckpointHandler(),
                },
                max_to_keep=spec.keep,
            )
            restored = self._restore_newest(loop_state.state)
            self._iterator: Any = loop_state.iterator
            self._position = 0  # the batches drawn from the dataset: restored, then one a step
            self._samples_before = loop_state.elapsed.samples  # counted before this run drew a batch
            if restored is None:
                # The backup of the start, once every on_start accepted the run: a run killed before its
                # first periodic backup resumes as a resumed run (its checkpoints then are its own).
                loop_state.iterator = itertools.chain(self._start_backup(loop_state), self._iterator)
            elif self._resume(loop_state, restored):
                return  # a finished run: no save, no signal taken (on_end sees no guard)
        except BaseException as error:
            self._close(error)
            raise
        # Times this start: its row in goodput/ (docs/resume.md, "Goodput"), written by process 0.
        self._goodput = Recorder(
            spec.directory if jax.process_index() == 0 else None, loop_state.steps, began
        )
        loop_state.iterator = self._goodput.iterate(loop_state.iterator)
        sync_point = jax.process_count() > 1  # then JAX's preemption sync point takes SIGTERM
        signals = (() if sync_point else (signal.SIGTERM,)) + ((signal.SIGINT,) if spec.sigint else ())
        self._guard = SignalGuard(signals, sync_point=sync_point)

    def _resume(self, loop_state: LoopState[Any], restored: Restored) -> bool:
        """Loads `restored` into the loop; True if it is a finished run that stops at once."""
        directory = self.spec.directory
        if restored.kind != self.kind:
            raise ValueError(
                f"the backup in {directory} was written by {short(restored.kind)}, "
                f"and this loop is {self.kind!r}: resuming it would return the results of another "
                "loop. Give backup= a directory of this loop's own"
            )
        loop_state.history.load_host(restored.history)
        changes = changed_hyperparameters(restored.state, loop_state.state)
        if changes:
            _log.warning(
                "the backup at step %d in %s was written with other optimizer hyperparameters than this "
                "run's state has (%s): the backup's optimizer state, and these values, are resumed; "
                "give backup= another directory to train with the new ones",
                restored.step,
                directory,
                "; ".join(changes),
            )
        skipped = restored.skipped and f" (newer backups at steps {list(restored.skipped)} could not be read)"
        finished = " (a finished run)" if restored.finished else ""
        announce(
            "ciclo: resumed %s from the backup at step %d in %s%s%s",
            self.kind,
            restored.step,
            directory,
            finished,
            skipped or "",
        )
        loop_state.restore(restored.state, restored.elapsed)
        loop_state.load_state_dicts(restored.callbacks)  # a finished run's too: its checkpoints are its own
        stop = loop_state.stop_at
        # A finished run is done, unless another stop that it has not reached asks for more.
        if restored.finished and (stop == restored.stop or (stop is not None and restored.elapsed >= stop)):
            loop_state.stop()
            return True
        if restored.devices is not None and restored.devices != jax.device_count():
            announce(
                "ciclo: resuming a backup written on %d device%s onto %d: the run goes on; its results "
                "are not bitwise those of an uninterrupted run",
                restored.devices,
                "" if restored.devices == 1 else "s",
                jax.device_count(),
            )
        self._position = position = restored.position
        if restored.iterator_state is not None:
            self._iterator.set_state(restored.iterator_state)
        elif position:  # the batches the backed-up run drew, drawn again
            # A generator given as the dataset is its own iterator.
            iterator = self._iterator
            if inspect.isgenerator(iterator) and inspect.getgeneratorstate(iterator) != inspect.GEN_CREATED:
                raise ValueError(
                    "cannot resume from the backup: the dataset is a generator that was already partly "
                    f"consumed, and the run must skip the {position} batches it used. Pass a fresh "
                    "generator, or an iterator with get_state()/set_state()"
                )
            samples = 0
            for index in range(position):
                try:
                    samples += loop_state.count_samples(next(iterator))
                except StopIteration:
                    raise ValueError(
                        f"cannot resume from the backup: the dataset ended after {index} batches, but the "
                        f"backed-up run had used {position}. Resuming needs the same batches in the same "
                        "order"
                    ) from None
            if samples != restored.samples:
                raise ValueError(
                    f"cannot resume from the backup: the backed-up run had drawn {position} batches holding "
                    f"{restored.samples} samples, but the first {position} batches of this dataset hold "
                    f"{samples}: another batch size would resume at another sample. Resume with the batch "
                    "size of the backed-up run, or give backup= another directory to start afresh"
                )
        self._samples_before = restored.elapsed.samples - restored.samples
        self._resumed = True
        return False

    def _start_backup(self, loop_state: LoopState[Any]) -> Iterator[Any]:
        self._save(loop_state, finished=False, wait=False)
        yield from ()

    def on_step_end(self, loop_state: LoopState[Any], /) -> None:
        """Backs up when due; on a signal, saves and raises `ciclo.types.Preempted`."""
        self._position += 1
        guard, steps = self._guard, loop_state.steps
        if self._goodput is not None:
            self._goodput.step_end(steps)
        if self._resumed:  # a resumed run's first step: what it compiled to get there
            self._resumed, note = False, compiled()
            if note is not None:
                announce("ciclo: %s, from the loop's start to step %d", note, steps)
        if guard is None or loop_state.stop_iteration:
            return
        if guard.requested(steps):
            assert guard.signum is not None
            self._save(loop_state, finished=False, wait=True)
            preempted = Preempted(guard.signum, steps, self.spec.directory)
            announce("ciclo: %s", preempted)
            raise preempted
        if self._due(loop_state.elapsed):
            self._save(loop_state, finished=False, wait=False)

    def on_end(self, loop_state: LoopState[Any], error: BaseException | None, /) -> None:
        """Saves a run that ended by itself as finished, waits for the save in flight, frees the signals."""
        try:
            if error is None and self._guard is not None:  # none: a finished run, resumed
                self._save(loop_state, finished=True, wait=True)
        finally:
            self._close(error)
        if error is None and self.kind == "train_loop" and self._goodput and self._goodput.index:
            announce("ciclo: %s", goodput(self.spec.directory))  # a resumed training's time, in one line

    def _check_marker(self) -> None:
        path = os.path.join(self.spec.directory, _MARKER)
        if os.path.exists(path):
            return
        # The marker's temporary file is ours (a kill between its write and its rename). Under several
        # processes, process 0 writes the marker and may already be saving: the others leave the
        # check of orbax's step directories to it, and may see the marker appear after looking for it.
        ours = re.compile(
            r"ciclo_backup\.(json|lock)(\.tmp)?|history"
            + (r"|\d+(\..*)?|goodput" if jax.process_index() else "")
        )
        entries = [e for e in os.listdir(self.spec.directory) if not ours.fullmatch(e)]
        if entries:
            raise FileExistsError(
                f"{self.spec.directory} is not empty and holds no ciclo backup ({sorted(entries)[:5]}...): "
                "give backup= a directory of its own (a checkpoint directory cannot double as one)"
            )
        if jax.process_index() == 0:
            write_atomically(path, json.dumps({"format": _FORMAT}))

    def _restore_newest(self, target: Any) -> Restored | None:
        """The newest backup that can be read, into `target`'s structure; deletes newer unreadable ones."""
        failures: list[tuple[int, Exception]] = []
        for step in sorted((int(step) for step in self._manager.all_steps()), reverse=True):
            try:
                # Every process resumes from the same step: the reads fail on all of them together.
                restored = self._restore_step(step, target)
            except ResumeRefused:
                raise  # the run's own options, which every backup in the directory was written with
            except Exception as error:  # noqa: BLE001 - orbax, tensorstore and json raise anything
                failures.append((step, error))
                _log.warning(
                    "cannot resume from the backup at step %d in %s: %s; trying the one before",
                    step,
                    self.spec.directory,
                    error,
                )
                continue
            for damaged, _ in failures:
                self._manager.delete(damaged)
            return dataclasses.replace(restored, skipped=tuple(step for step, _ in failures))
        if not failures:
            return None
        raise ValueError(_refusal(self.spec.directory, failures))

    def _restore_step(self, step: int, target: Any) -> Restored:
        ocp, manager = self._ocp, self._manager
        loop_item = restore_everywhere(manager, step, ocp.args.Composite(loop=ocp.args.JsonRestore()))["loop"]
        document = os.path.join(self.spec.directory, str(step), "loop")
        fields = _checked_loop_item(loop_item, step, document)
        where = f"at step {step} in {self.spec.directory}"
        # The options that give the arrays their meaning (accumulate_steps, ...), before the arrays.
        changed = check_static_options(fields["options"], target, where)
        target_tree = abstract(target)
        # Compared before orbax reads anything: its own errors name no leaf.
        stored = stored_tree(self._manager, step, "state", "state")  # saved wrapped, as {"state": state}
        check_device_axis(stored, target, "the backup", where)
        check_structure(stored, target_tree, "the backup", where, dtypes=True)
        items = {"state": ocp.args.StandardRestore({"state": target_tree})}
        if fields["kept"]:  # trees shaped like the loop's state (an early stopping's best state)
            items["kept"] = ocp.args.StandardRestore({name: target_tree for name in fields["kept"]})
        try:
            arrays = restore_everywhere(manager, step, ocp.args.Composite(**items))
        except Exception as error:  # noqa: BLE001 - orbax and tensorstore raise plain Exceptions
            # The structure fits (checked above): what fails is reading the arrays' files.
            raise ValueError(f"the state of the backup {where} cannot be read: {error}") from None
        restored, states = arrays["state"]["state"], arrays["kept"] if fields["kept"] else {}
        callbacks = from_json(fields["callbacks"], f"{document}: callbacks", states=states)
        item = from_json(fields["history"], f"{document}: history")
        chunks = _checked_chunks(item, f"{document}: history")
        history = self._read_history(item, chunks, f"{document}: history")
        self._last_saved, self._recent = step, [chunks]
        if changed:
            _log.warning(
                "the backup at step %d in %s was written with other options than this run's state has "
                "(%s): the run goes on with this state's, so it will not equal the run that was backed up; "
                "give backup= another directory to start afresh",
                step,
                self.spec.directory,
                "; ".join(changed),
            )
        return Restored(
            step=step,
            state=restored,
            elapsed=make_elapsed(*fields["elapsed"]),
            history=history,
            callbacks=callbacks,
            position=fields["position"],
            iterator_state=from_json(fields["iterator_state"], f"{document}: iterator_state"),
            finished=fields["finished"],
            kind=fields["kind"],
            stop=fields["stop"],
            samples=fields["samples"],
            devices=fields.get("devices"),
        )

    def _read_history(
        self, item: dict[str, Any], chunks: list[tuple[int, int]], where: str
    ) -> dict[str, Any]:
        rows: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
        for first, end in chunks:
            path = os.path.join(self.spec.directory, _HISTORY_DIR, f"rows-{first}-{end}.json")
            try:
                with open_own(path, "r") as file:
                    part = from_json(json.load(file), path)
            except (OSError, ValueError) as error:
                raise ValueError(f"{where}: the rows {first} to {end} cannot be read: {error}") from None
            rows_of = (list, lambda x, n=end - first: len(x) == n, f"a list of {end - first} rows")
            _check_rows(check_document(part, dict.fromkeys(_COLUMNS, rows_of), path), path, first)
            for name in _COLUMNS:
                rows[name] += part[name]
        skip = item["dropped"] - chunks[0][0] if chunks else 0  # rows a bounded History dropped since
        history = {name: column[skip:] for name, column in rows.items()}
        history.update(
            max_rows=item["max_rows"], dropped=item["dropped"], evicted_latest=item["evicted_latest"]
        )
        return history

    def _history_item(self, history: Any) -> dict[str, Any]:
        """The document's history field; writes the rows since the last backup as a new chunk."""
        dropped, total = history.dropped, history.dropped + len(history)
        chunks = [chunk for chunk in (self._recent[-1] if self._recent else []) if chunk[1] > dropped]
        written = chunks[-1][1] if chunks else dropped
        rows = history.to_host(written)
        if total > written:
            if jax.process_index() == 0:
                part = to_json({name: rows[name] for name in _COLUMNS}, "the history")
                path = os.path.join(self.spec.directory, _HISTORY_DIR, f"rows-{written}-{total}.json")
                write_atomically(path, json.dumps(part))
            chunks.append((written, total))
        self._recent = [*self._recent, chunks][-(self.spec.keep + 1) :]
        return {
            "chunks": [list(chunk) for chunk in chunks],
            "max_rows": rows["max_rows"],
            "dropped": dropped,
            "evicted_latest": rows["evicted_latest"],
        }

    def _delete_unused_chunks(self) -> None:
        """Deletes the chunk files no kept backup refers to (a bounded History's old rows, a killed run's)."""
        directory = os.path.join(self.spec.directory, _HISTORY_DIR)
        if jax.process_index() != 0 or os.path.islink(directory) or not os.path.isdir(directory):
            return
        used = {chunk for chunks in self._recent for chunk in chunks}
        for name in os.listdir(directory):
            match = _CHUNK.fullmatch(name)
            if match is not None and (int(match[1]), int(match[2])) not in used:
                remove_own(directory, name, _CHUNK)  # only a chunk file of ours, never through a link

    @saving()  # its blocking work, which `ciclo.watchdog` does not count as a hang
    def _save(self, loop_state: LoopState[Any], *, finished: bool, wait: bool) -> None:
        """Saves a backup numbered by the steps completed, unless the state holds NaN or inf."""
        state, elapsed = loop_state.state, loop_state.elapsed
        step = int(elapsed.steps)
        if step == self._last_saved and not finished:
            return
        if not all_finite(state):
            _log.warning(
                "backup of step %d not saved: the state holds NaN or inf; running the script again resumes "
                "from the newest finite backup (%s)",
                step,
                "none yet" if self._last_saved is None else f"step {self._last_saved}",
            )
            return
        if self.straggler_factor is not None and self._goodput is not None and jax.process_count() > 1:
            self._goodput.report_stragglers(self.straggler_factor)
        kept: dict[str, Any] = {}
        structure = None if is_single_leaf(state) else jax.tree.structure(state)
        callbacks_data = {
            name: to_json(value, f"the state of callback {name}", state_structure=structure, kept=kept)
            for name, value in loop_state.state_dicts().items()
        }
        loop_item = {
            "format": _FORMAT,
            "kind": self.kind,
            "stop": None if loop_state.stop_at is None else list(dataclasses.astuple(loop_state.stop_at)),
            "finished": finished,
            "elapsed": [step, int(elapsed.samples), float(elapsed.time), float(elapsed.date_start)],
            "history": to_json(self._history_item(loop_state.history), "the history"),
            "callbacks": callbacks_data,
            "position": self._position,
            "samples": int(elapsed.samples - self._samples_before),  # those this run drew
            "iterator_state": to_json(iterator_state(self._iterator), "the dataset iterator's get_state()"),
            "kept": sorted(kept),
            "options": static_options(state),
            "devices": jax.device_count(),
        }
        ocp = self._ocp
        if step == self._last_saved:
            # Same step, now finished: replace the backup in place of a second one.
            self._manager.wait_until_finished()
            self._manager.delete(step)
        self._manager.save(
            step,
            args=ocp.args.Composite(
                # Wrapped: orbax refuses a state that is a single leaf at the root.
                state=ocp.args.StandardSave({"state": state}),
                loop=ocp.args.JsonSave(loop_item),
                **({"kept": ocp.args.StandardSave(kept)} if kept else {}),
            ),
            force=True,
        )
        self._last_saved = step
        self._delete_unused_chunks()
        if self._goodput is not None:  # durable as the backup is: the steps it claims are done
            self._goodput.write(sync=True)
        if wait:
            self._manager.wait_until_finished()

    def _close(self, error: BaseException | None) -> None:
        try:
            if error is not None:
                note_lost_peer(error)  # before the wait for the save in flight, which JAX may end
            if self._manager is not None:  # none: refused before it was opened
                self._manager.wait_until_finished()
                self._manager.close()
        finally:
            if self._goodput is not None:
                self._goodput.close()
            if self._guard is not None:
                self._guard.release()
                self._guard = None
            if self._lock is not None:  # removed, then released: a process waiting on the old file retries
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.spec.directory, _LOCK))
                os.close(self._lock)


def _refusal(directory: str, failures: list[tuple[int, Exception]]) -> str:
    """Why no backup resumes: each kind of failure said once, with the backups that share it."""
    kinds: dict[str, list[tuple[int, str]]] = {}
    for step, error in failures:  # the same failure of another backup differs only in its step
        text = str(error)
        mine = (f"at step {step} in {directory}", os.path.join(directory, str(step)) + os.sep)
        key = text.replace(mine[0], "at step N").replace(mine[1], "N/")
        kinds.setdefault(key, []).append((step, text))
    head = f"no backup in {directory} can be resumed from:"
    fix = "If the loop's state changed (another model), give backup= another directory to start afresh."
    lines = []
    for shared in kinds.values():
        (first, text), others = shared[0], shared[1:]
        lines.append(f"- step {first}: {cut(text, (1800 - len(head) - len(fix)) // len(kinds))}")
        for step, same in others:  # its heading only, which names its own file
            lines.append(f"- step {step}: {_HEADING.split(same, maxsplit=1)[0]}: as step {first}")
        if others:
            lines[-1] += f" ({len(shared)} backups share this)"
    return cut("\n".join([head, *lines, fix]), 1990)


def _identity(pid: int) -> str | None:
    """Boot id and start time of process `pid`: what tells it from a later one with its pid; or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as file:
            fields = file.read().rpartition(")")[2].split()
        with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as file:
            boot = file.read().strip()
    except (OSError, IndexError):
        return None
    return f"{boot}/{fields[19]}"  # field 22 of stat: the start time in clock ticks since boot


def _owner(raw: bytes) -> dict[str, Any] | None:
    """The holder a lock file names, as `_lock` writes it (pid, host, start), or None."""
    try:
        owner = json.loads(raw)
    except ValueError:
        return None
    ciclo = isinstance(owner, dict) and type(owner.get("pid")) is int and isinstance(owner.get("host"), str)
    return owner if ciclo else None


def _lock(directory: str) -> int | None:
    """Takes the directory's lock (docs/resume.md, "The lock") in process 0: its open descriptor, else None.

    flock decides; on a filesystem without it, the holder's identity (`_identity`).
    """
    if jax.process_index() != 0:
        return None
    path = os.path.join(directory, _LOCK)
    flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0)
    while True:
        try:
            fd, left = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644), False
        except FileExistsError:
            try:
                if not stat.S_ISREG(os.lstat(path).st_mode):  # not opened: a FIFO's open could block
                    raise FileExistsError(
                        f"the backup directory's lock file {path} is not a regular file (a FIFO, a "
                        "directory, a socket or a device): ciclo cannot lock the directory with it. Remove "
                        "it, or give this run another directory"
                    ) from None
                fd, left = os.open(path, flags), True  # a holder's, live or gone
            except FileNotFoundError:
                continue  # released meanwhile
        try:
            held: bool | None = None
            if sys.platform != "win32":
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held = True
                except BlockingIOError:
                    held = False
                except OSError:
                    pass  # no flock on this filesystem
            for _ in range(50):  # a ciclo holder writes its name once it has the lock: it is given a moment
                holder = _owner(raw := os.pread(fd, 4096, 0))
                if holder is not None or held is not False:
                    break
                time.sleep(0.02)
            if held is None:  # the holder's identity decides; another machine's, nothing here can tell
                here = socket.gethostname()
                pid, host, started = (
                    (holder["pid"], holder["host"], holder.get("started")) if holder else (0, here, None)
                )
                held = host == here and not (started is not None and _identity(pid) == started)
            if not held:
                who = (
                    f"another program, not a ciclo run ({path} holds {short(raw)})"
                    if holder is None
                    else f"process {short(holder['pid'])} on host {short(holder['host'])} ({path})"
                )
                raise FileExistsError(
                    f"the backup directory {directory} is in use by {who}: two runs on one backup would "
                    "overwrite each other's steps. Give this run another directory"
                )
            if os.path.exists(path) and os.path.samestat(os.fstat(fd), os.stat(path)):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the file was removed by the holder that released it: lock the new one
    if left:
        _log.warning(
            "taking over the lock of %s left by %s, which is gone (its process ended, or its pid now "
            "belongs to another process)",
            directory,
            short(holder) if holder else "a process that wrote no readable owner",
        )
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "started": _identity(os.getpid())}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(owner).encode(), 0)
    return fd
