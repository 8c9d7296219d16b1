"""Backups: what a loop needs to go on after a kill, saved atomically with orbax.

`ciclo.backup(directory)` returns a `Backup`, given to a loop as `backup=`. The
loop then saves, every `every` (default: each epoch in `train_loop`, every 1000
steps elsewhere), at its end and when it is preempted, one orbax checkpoint
holding two items:

- `state`: the loop state, saved by orbax (each process writes its own shards),
- `loop`: a JSON document with the `Elapsed`, the History rows, every stateful
  callback's `callback_state()`, and the position in the dataset (a pickle,
  base64-encoded: these are host values only).

When the directory holds a backup at start, the loop restores all of it and
continues; a backup written at the loop's end is marked finished, and a loop
that finds one returns its results at once.

orbax writes each checkpoint into a temporary directory and renames it when it
is complete, so a kill during a save leaves the previous backup intact; the
last `keep` (at least 2) are kept.
"""

from __future__ import annotations

import base64
import dataclasses
import inspect
import os
import pickle
import re
import signal
import threading
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from ciclo._src.checks import check_directory
from ciclo._src.elapsed import Elapsed, Period, make_elapsed
from ciclo._src.schedules import Every

_FORMAT = 1
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
        raise TypeError(f"backup directory must be a path, got {directory!r}")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 2:
        raise ValueError(f"keep must be an int >= 2 (a kill during a save must leave one), got {keep!r}")
    if not isinstance(sigint, bool):
        raise TypeError(f"sigint must be a bool, got {sigint!r}")
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
    raise TypeError(f"backup must be a directory or ciclo.backup(directory, ...), got {value!r}")


def _schedule(every: Any) -> Any:
    """`every` as `(steps_interval, None)` for steps alone, or `(None, schedule)`."""
    if every is None:
        return None, None
    if isinstance(every, bool):
        raise TypeError(f"every must be a number of steps, a ciclo.Period or a schedule, got {every!r}")
    if isinstance(every, int):
        if every < 1:
            raise ValueError(f"every must be >= 1 step, got {every!r}")
        return every, None
    if isinstance(every, Period):
        if every.steps is not None and every == Period(steps=every.steps):
            return every.steps, None
        return None, Every(every)
    if callable(every):
        return None, every
    raise TypeError(f"every must be a number of steps, a ciclo.Period or a schedule, got {every!r}")


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


def _encode(value: Any) -> str:
    return base64.b64encode(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).decode("ascii")


def _decode(text: str) -> Any:
    return pickle.loads(base64.b64decode(text.encode("ascii")))  # noqa: S301 - our own files


def _to_host(tree: Any) -> Any:
    """Callback states on the host: arrays become numpy (gathered from every process if sharded)."""

    def leaf(x: Any) -> Any:
        if isinstance(x, jax.Array):
            if not x.is_fully_addressable:
                from jax.experimental import multihost_utils

                return np.asarray(multihost_utils.process_allgather(x, tiled=True))
            return np.asarray(x)
        return x

    return jax.tree.map(leaf, tree)


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
                f"must save at the same step, and a schedule in time would not agree; got {spec.every!r}"
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
            item_handlers={"state": ocp.StandardCheckpointHandler(), "loop": ocp.JsonCheckpointHandler()},
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

    def latest_step(self) -> int | None:
        step = self.manager.latest_step()
        return None if step is None else int(step)

    def restore(self, target: Any) -> Restored | None:
        """The newest backup, restored into the structure, shapes and shardings of `target`."""
        step = self.latest_step()
        if step is None:
            return None
        from ciclo._src.callbacks._checkpoint import _abstract, check_structure

        ocp = self._ocp
        loop_item = self.manager.restore(step, args=ocp.args.Composite(loop=ocp.args.JsonRestore()))["loop"]
        if loop_item.get("format") != _FORMAT:
            raise ValueError(f"the backup at step {step} in {self.spec.directory} has an unknown format")
        where = f"the backup at step {step} in {self.spec.directory}"
        advice = "Was it written by another model? Give backup= another directory to start afresh."
        try:
            stored = self.manager.item_metadata(step)["state"]
            stored = getattr(stored, "tree", stored)["state"]
        except Exception:  # noqa: BLE001 - no metadata to compare with: orbax's own checks remain
            stored = None
        if stored is not None:
            # Compared before orbax reads anything: its own errors name no leaf.
            try:
                check_structure(stored, _abstract(target), where)
            except ValueError as error:
                raise ValueError(f"{error}\n{advice}") from None
        try:
            restored = self.manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore({"state": _abstract(target)}))
            )["state"]["state"]
        except Exception as error:  # noqa: BLE001 - orbax and tensorstore raise plain Exceptions
            raise ValueError(f"{where} does not fit this loop's state: {error}. {advice}") from None
        payload = _decode(loop_item["payload"])
        self.last_saved = step
        return Restored(
            step=step,
            state=restored,
            elapsed=make_elapsed(*payload["elapsed"]),
            history=payload["history"],
            callbacks=payload["callbacks"],
            position=payload["position"],
            iterator_state=payload["iterator_state"],
            finished=bool(loop_item["finished"]),
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
        """Saves a backup numbered by the steps completed; `wait` blocks until it is on disk."""
        step = int(elapsed.steps)
        if step == self.last_saved and not finished:
            return
        payload = {
            "elapsed": (elapsed.steps, elapsed.samples, elapsed.time, elapsed.date_start),
            "history": history.to_host(),
            "callbacks": _to_host(callbacks),
            "position": position,
            "iterator_state": iterator_state,
        }
        loop_item = {"format": _FORMAT, "finished": finished, "payload": _encode(payload)}
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
