"""Backups: what a loop needs to go on after a kill, saved atomically with orbax.

`ciclo.backup(directory)` returns a `Backup`, given to a loop as `backup=`. The
loop then saves, every `every` (default: each epoch in `train_loop`, every 1000
steps elsewhere), at its end and when it is preempted, one orbax checkpoint
holding two items:

- `state`: the loop state, saved by orbax (each process writes its own shards),
- `loop`: a JSON document with the `Elapsed`, the History rows, every stateful
  callback's `callback_state()`, and the position in the dataset: plain data
  (`ciclo._src.host_json`), checked field by field when it is read, never code,
- `kept` (when a callback holds one): trees shaped like the state, such as an
  early stopping's best state, saved by orbax like the state.

When the directory holds a backup at start, the loop restores all of it and
continues; a backup written at the loop's end is marked finished, and a loop
that finds one returns its results at once.

orbax writes each checkpoint into a temporary directory and renames it when it
is complete, so a kill during a save leaves the previous backup intact; the
last `keep` (at least 2) are kept.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import re
import signal
import threading
from collections.abc import Iterator
from typing import Any

import jax

from ciclo._src.checks import check_directory
from ciclo._src.elapsed import Elapsed, Period, make_elapsed
from ciclo._src.finite import all_finite
from ciclo._src.host_json import from_json, to_json
from ciclo._src.reprs import short
from ciclo._src.schedules import Every

_log = logging.getLogger("ciclo")

_FORMAT = 2
"""The loop item's format: 2 is plain JSON data (format 1 held a pickle, which is never read)."""
_MARKER = "ciclo_backup.json"
"""Written next to the checkpoints: says the directory holds ciclo backups."""


class Preempted(SystemExit):
    """Raised by a loop after it saved its backup on SIGTERM (or SIGINT when asked).

    A `SystemExit`: unless caught, the process exits with `code`, 128 plus the
    signal's number (143 for SIGTERM), without a traceback. Run the same script
    again to resume from the backup.
    """

    def __init__(self, signum: int, steps: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum
        self.steps = steps

    def __str__(self) -> str:
        name = signal.Signals(self.signum).name
        return f"preempted by {name} after step {self.steps}: the backup is saved, run again to resume"


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


def backup(
    directory: str | os.PathLike[str],
    *,
    every: int | Period | Any = None,
    keep: int = 2,
    sigint: bool = False,
) -> Backup:
    """Backups of a loop in `directory`, so that a killed run goes on where it stopped.

    Give it to `ciclo.loop`, `train_loop`, `test_loop`, `predict_loop` or
    `run_phases` as `backup=` (a plain directory means `ciclo.backup(directory)`).
    The loop saves the state, the `Elapsed`, the History, the stateful
    callbacks' states and the dataset position; when it starts and finds a
    backup, it restores them and continues. Results equal those of a run that
    was never interrupted, bit for bit, as long as the steps are deterministic.

    The dataset position: an iterator with `get_state()` / `set_state()` (like
    grain's `DatasetIterator`) has its own state saved. Any other dataset is
    iterated again from its start, skipping the batches already used (so it
    must give the same batches in the same order, and the skipped batches cost
    their loading time). A generator that was already partly consumed cannot
    be positioned and is refused.

    On SIGTERM (and SIGINT with `sigint=True`) the loop finishes the step in
    flight, saves, and raises `ciclo.Preempted`, which exits the process with
    code 143 (130 for SIGINT) unless caught. Under several processes they all
    stop at the same step (JAX's preemption sync point).

    Args:
        directory: where the backups go (created if needed).
        every: how often to save: a number of steps, a `ciclo.Period`, or a
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
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 2:
        raise ValueError(f"keep must be an int >= 2 (a kill during a save must leave one), got {short(keep)}")
    if not isinstance(sigint, bool):
        raise TypeError(f"sigint must be a bool, got {short(sigint)}")
    _schedule(every)  # checked now, not at the first step
    path = os.path.abspath(os.fspath(directory))
    check_directory(path, "backup directory")
    return Backup(path, every, keep, sigint)


def as_backup(value: Any) -> Backup | None:
    """`backup=` as given to a loop: None, a directory, or a `Backup`."""
    if value is None or isinstance(value, Backup):
        return value
    if isinstance(value, (str, os.PathLike)):
        return backup(value)
    raise TypeError(f"backup must be a directory or ciclo.backup(directory, ...), got {short(value)}")


def _schedule(every: Any) -> Any:
    """`every` as `(steps_interval, None)` for steps alone, or `(None, schedule)`."""
    if every is None:
        return None, None
    if isinstance(every, bool):
        raise TypeError(f"every must be a number of steps, a ciclo.Period or a schedule, got {short(every)}")
    if isinstance(every, int):
        if every < 1:
            raise ValueError(f"every must be >= 1 step, got {short(every)}")
        return every, None
    if isinstance(every, Period):
        if every.steps is not None and every == Period(steps=every.steps):
            return every.steps, None
        return None, Every(every)
    if callable(every):
        return None, every
    raise TypeError(f"every must be a number of steps, a ciclo.Period or a schedule, got {short(every)}")


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


_LOOP_FIELDS = ("format", "finished", "elapsed", "history", "callbacks", "position", "iterator_state", "kept")


def _checked_loop_item(item: Any, step: int, where: str) -> dict[str, Any]:
    """The loop item's fields, each checked: a backup is data, and a damaged or crafted one is named."""
    if not isinstance(item, dict):
        raise ValueError(f"{where} holds a {type(item).__name__}, not the loop's JSON document")
    if item.get("format") == 1:
        raise ValueError(
            f"{where} was written by an earlier ciclo, whose backups held a pickle: it is not read, as "
            "loading a backup never runs code from the directory. Give backup= another directory to "
            "start afresh"
        )
    if item.get("format") != _FORMAT:
        raise ValueError(f"{where} has format {short(item.get('format'))}; this ciclo reads format {_FORMAT}")
    unknown, missing = sorted(set(item) - set(_LOOP_FIELDS)), sorted(set(_LOOP_FIELDS) - set(item))
    if unknown or missing:
        raise ValueError(f"{where}: unknown fields {unknown}, missing fields {missing}")
    if not isinstance(item["finished"], bool):
        raise ValueError(f"{where}: finished is {short(item['finished'])}, not true or false")
    elapsed = item["elapsed"]
    if (
        not isinstance(elapsed, list)
        or len(elapsed) != 4
        or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in elapsed[:2])
        or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in elapsed[2:])
    ):
        raise ValueError(f"{where}: elapsed is {short(elapsed)}, not [steps, samples, time, date_start]")
    if elapsed[0] != step:
        raise ValueError(f"{where}: elapsed counts {elapsed[0]} steps, but the backup is numbered {step}")
    position = item["position"]
    if not isinstance(position, int) or isinstance(position, bool) or not 0 <= position <= step:
        raise ValueError(
            f"{where}: position is {short(position)}, not a number of batches from 0 to the {step} steps "
            "completed"
        )
    kept = item["kept"]
    if not isinstance(kept, list) or not all(isinstance(name, str) for name in kept):
        raise ValueError(f"{where}: kept is {short(kept)}, not a list of names")
    if not isinstance(item["callbacks"], dict):
        raise ValueError(f"{where}: callbacks is a {type(item['callbacks']).__name__}, not a dict")
    return dict(item)


_HISTORY_FIELDS = {"paths", "values", "elapsed", "max_rows", "dropped", "evicted_latest"}


def _check_history(history: Any, where: str) -> None:
    if not isinstance(history, dict) or set(history) != _HISTORY_FIELDS:
        raise ValueError(f"{where} does not have the fields {sorted(_HISTORY_FIELDS)}")
    rows = [history[name] for name in ("paths", "values", "elapsed")]
    if not all(isinstance(column, list) for column in rows) or len({len(column) for column in rows}) != 1:
        raise ValueError(f"{where}: paths, values and elapsed are not lists of one length")
    if not isinstance(history["dropped"], int) or history["dropped"] < 0:
        raise ValueError(f"{where}: dropped is {short(history['dropped'])}, not a count")
    if not isinstance(history["evicted_latest"], dict):
        raise ValueError(f"{where}: evicted_latest is not a dict")


class Session:
    """One loop's use of a `Backup`: opens the orbax manager, restores, saves on schedule."""

    def __init__(self, spec: Backup, default_every: Any) -> None:
        # the one place orbax is imported
        from ciclo._src.callbacks._checkpoint import _orbax, barrier_prefix

        self.spec = spec
        interval, schedule = _schedule(spec.every if spec.every is not None else default_every)
        if interval is None and schedule is None:
            interval = 1000
        self.interval: int | None = interval
        self.schedule = schedule
        if schedule is not None and jax.process_count() > 1:
            raise ValueError(
                "under several processes, backup(every=...) must be a number of steps: all processes "
                f"must save at the same step, and a schedule in time would not agree; got {short(spec.every)}"
            )
        ocp = _orbax()
        self._ocp = ocp
        os.makedirs(spec.directory, exist_ok=True)
        self._check_marker()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=spec.keep,
            enable_async_checkpointing=True,
            cleanup_tmp_directories=True,
            create=True,
            # Under several processes orbax names its barriers by step: a prefix of this directory's
            # own keeps a backup and a checkpoint of the same step from waiting on each other.
            multiprocessing_options=ocp.options.MultiprocessingOptions(
                barrier_sync_key_prefix=barrier_prefix("ciclo_backup", spec.directory)
            ),
        )
        self.manager = ocp.CheckpointManager(
            spec.directory,
            options=options,
            item_handlers={
                "state": ocp.StandardCheckpointHandler(),
                "kept": ocp.StandardCheckpointHandler(),
                "loop": ocp.JsonCheckpointHandler(),
            },
        )
        self.last_saved: int | None = None

    def _check_marker(self) -> None:
        path = os.path.join(self.spec.directory, _MARKER)
        if os.path.exists(path):
            return
        # The marker's temporary file is ours (a kill between its write and its rename). Under several
        # processes, process 0 writes the marker and may already be saving: the others leave the
        # check of orbax's step directories to it, and may see the marker appear after looking for it.
        ours = re.compile(
            r"ciclo_backup\.json(\.tmp)?"
            if jax.process_index() == 0
            else r"ciclo_backup\.json(\.tmp)?|\d+(\..*)?"
        )
        entries = [e for e in os.listdir(self.spec.directory) if not ours.fullmatch(e)]
        if entries:
            raise FileExistsError(
                f"{self.spec.directory} is not empty and holds no ciclo backup ({sorted(entries)[:5]}...): "
                "give backup= a directory of its own (a checkpoint directory cannot double as one)"
            )
        if jax.process_index() == 0:
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(f'{{"format": {_FORMAT}}}\n')
            os.replace(tmp, path)

    def restore(self, target: Any) -> Restored | None:
        """The newest backup that can be read, restored into the structure, shapes and shardings of `target`.

        A newer backup that cannot be read (a damaged file, a document that is
        not ciclo's) is warned about with what failed, then deleted once an
        older one is restored, so that the run saves its steps again.

        Raises:
            ValueError: if no backup in the directory can be read, naming each
                one and what failed.
        """
        failures: list[tuple[int, Exception]] = []
        for step in sorted((int(step) for step in self.manager.all_steps()), reverse=True):
            try:
                restored = self._restore_step(step, target)
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
                self.manager.delete(damaged)
            return restored
        if not failures:
            return None
        errors = "\n".join(f"- step {step}: {error}" for step, error in failures)
        raise ValueError(
            f"no backup in {self.spec.directory} can be resumed from:\n{errors}\nIf the loop's state "
            "changed (another model), give backup= another directory to start afresh."
        )

    def _restore_step(self, step: int, target: Any) -> Restored:
        """The backup of `step`, checked field by field; raises if any part of it cannot be read."""
        from ciclo._src.callbacks._checkpoint import _abstract, check_structure

        ocp = self._ocp
        loop_item = self.manager.restore(step, args=ocp.args.Composite(loop=ocp.args.JsonRestore()))["loop"]
        document = os.path.join(self.spec.directory, str(step), "loop")
        fields = _checked_loop_item(loop_item, step, document)
        where = f"at step {step} in {self.spec.directory}"
        abstract = _abstract(target)
        try:
            stored = self.manager.item_metadata(step)["state"]
            stored = getattr(stored, "tree", stored)["state"]
        except Exception:  # noqa: BLE001 - no metadata to compare with: orbax's own checks remain
            stored = None
        if stored is not None:
            # Compared before orbax reads anything: its own errors name no leaf.
            check_structure(stored, abstract, "the backup", where)
        try:
            restored = self.manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore({"state": abstract}))
            )["state"]["state"]
        except Exception as error:  # noqa: BLE001 - orbax and tensorstore raise plain Exceptions
            raise ValueError(f"the backup {where} does not fit this loop's state: {error}") from None
        states = {}
        if fields["kept"]:
            # Trees shaped like the loop's state (an early stopping's best state), saved by orbax.
            states = self.manager.restore(
                step,
                args=ocp.args.Composite(
                    kept=ocp.args.StandardRestore({name: abstract for name in fields["kept"]})
                ),
            )["kept"]
        callbacks = from_json(fields["callbacks"], f"{document}: callbacks", states=states)
        history = from_json(fields["history"], f"{document}: history")
        _check_history(history, f"{document}: history")
        self.last_saved = step
        return Restored(
            step=step,
            state=restored,
            elapsed=make_elapsed(*fields["elapsed"]),
            history=history,
            callbacks=callbacks,
            position=fields["position"],
            iterator_state=from_json(fields["iterator_state"], f"{document}: iterator_state"),
            finished=fields["finished"],
        )

    def due(self, steps: int, now: Any) -> bool:
        """Whether the schedule asks for a backup after a step that ended at `steps`."""
        if self.interval is not None:
            last = self.last_saved or 0
            return steps // self.interval > last // self.interval
        return bool(self.schedule(now()))

    def save(
        self,
        state: Any,
        elapsed: Elapsed,
        history: Any,
        callbacks: dict[str, Any],
        position: int,
        iterator_state: Any,
        *,
        finished: bool,
        wait: bool,
    ) -> None:
        """Saves a backup numbered by the steps completed; `wait` blocks until it is on disk.

        A state holding NaN or inf is not saved (nor marked finished): the newest
        finite backup stays the resume point, and no rotation deletes it.
        """
        step = int(elapsed.steps)
        if step == self.last_saved and not finished:
            return
        if not all_finite(state):
            _log.warning(
                "backup of step %d not saved: the state holds NaN or inf; running the script again resumes "
                "from the newest finite backup (%s)",
                step,
                "none yet" if self.last_saved is None else f"step {self.last_saved}",
            )
            return
        structure = jax.tree.structure(state)
        kept: dict[str, Any] = {}
        callbacks_data = {
            name: to_json(
                value,
                f"the state of callback {name}",
                state_structure=None if jax.tree_util.treedef_is_leaf(structure) else structure,
                kept=kept,
            )
            for name, value in callbacks.items()
        }
        loop_item = {
            "format": _FORMAT,
            "finished": finished,
            "elapsed": [
                int(elapsed.steps),
                int(elapsed.samples),
                float(elapsed.time),
                float(elapsed.date_start),
            ],
            "history": to_json(history.to_host(), "the history"),
            "callbacks": callbacks_data,
            "position": int(position),
            "iterator_state": to_json(iterator_state, "the dataset iterator's get_state()"),
            "kept": sorted(kept),
        }
        ocp = self._ocp
        if step == self.last_saved:
            # Same step, now finished: replace the backup in place of a second one.
            self.manager.wait_until_finished()
            self.manager.delete(step)
        self.manager.save(
            step,
            args=ocp.args.Composite(
                # Wrapped: orbax refuses a state that is a single leaf at the root.
                state=ocp.args.StandardSave({"state": state}),
                loop=ocp.args.JsonSave(loop_item),
                **({"kept": ocp.args.StandardSave(kept)} if kept else {}),
            ),
            force=True,
        )
        self.last_saved = step
        if wait:
            self.manager.wait_until_finished()

    def close(self) -> None:
        """Finishes the pending save (also after Ctrl-C or an error) and releases the manager."""
        self.manager.wait_until_finished()
        self.manager.close()


def position_dataset(iterator: Iterator[Any], dataset: Any, restored: Restored) -> Iterator[Any]:
    """`iterator` moved to where the backed-up run stopped drawing batches."""
    if restored.iterator_state is not None:
        iterator.set_state(restored.iterator_state)  # type: ignore[attr-defined]
        return iterator
    if restored.position == 0:
        return iterator
    if inspect.isgenerator(dataset) and inspect.getgeneratorstate(dataset) != inspect.GEN_CREATED:
        raise ValueError(
            "cannot resume from the backup: the dataset is a generator that was already partly consumed, "
            f"and the run must skip the {restored.position} batches it used. Pass a fresh generator, or an "
            "iterator with get_state()/set_state()"
        )
    for index in range(restored.position):
        try:
            next(iterator)
        except StopIteration:
            raise ValueError(
                f"cannot resume from the backup: the dataset ended after {index} batches, but the backed-up "
                f"run had used {restored.position}. Resuming needs the same batches in the same order"
            ) from None
    return iterator


def iterator_state(iterator: Any) -> Any:
    """The iterator's own `get_state()` when it has `get_state` and `set_state`; None otherwise."""
    if callable(getattr(iterator, "get_state", None)) and callable(getattr(iterator, "set_state", None)):
        return iterator.get_state()
    return None


class SignalGuard:
    """Turns SIGTERM and SIGINT into a request to stop after the step in flight, for one loop.

    A signal is only caught where Python still has its default handler for it
    and in the main thread, so a loop inside another (or a program with its own
    handlers) leaves them alone. A second SIGINT raises `KeyboardInterrupt` at
    once. Under several processes SIGTERM is JAX's preemption notice: every
    process stops at the same step, its sync point.
    """

    def __init__(self, *, sigterm: bool, sigint: bool) -> None:
        self.signum: int | None = None
        self.forced = False
        """Whether a second Ctrl-C raised: that KeyboardInterrupt always propagates."""
        self._previous: dict[int, Any] = {}
        self.sync_point = sigterm and jax.process_count() > 1
        if threading.current_thread() is not threading.main_thread():
            return
        if sigterm and not self.sync_point and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._handle)
        if sigint and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._handle)

    @property
    def active(self) -> bool:
        return bool(self._previous) or self.sync_point

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            self.forced = True
            raise KeyboardInterrupt  # a second Ctrl-C stops at once
        self.signum = signum

    def requested(self, steps: int) -> bool:
        """Whether to stop after the step that ended at `steps`."""
        if self.signum is not None:
            return True
        if self.sync_point:
            from jax.experimental import multihost_utils

            if multihost_utils.reached_preemption_sync_point(steps):
                self.signum = signal.SIGTERM
                return True
        return False

    def release(self) -> None:
        """Gives the signals back to the handlers they had."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
