"""A loop's survival: its backup, the signals that stop it, and the dataset's position.

The engine (`run_phases`) knows one object for all of it, `Survival`, and calls
it at four moments: `restore` before the loop is built, `start` before the
first step, `after_step` after each step (only when `watching`), and `finish`
when the loop ended by itself; `close` always runs last. What a backup holds
is `ciclo._src.backup`; the signal mechanism is `ciclo._src.signals`.
"""

from __future__ import annotations

import logging
import math
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ciclo._src.backup import (
    Backup,
    Preempted,
    Restored,
    Session,
    as_backup,
    iterator_state,
    position_dataset,
)
from ciclo._src.elapsed import Clock, Period
from ciclo._src.learning_rate import changed_hyperparameters
from ciclo._src.logs import History
from ciclo._src.loop_state import LoopState
from ciclo._src.orbax_io import note_lost_peer
from ciclo._src.reprs import short
from ciclo._src.signals import SignalGuard

_log = logging.getLogger("ciclo")


class _Stderr(logging.Handler):
    """Writes each record's message alone to the `sys.stderr` of the moment it is written."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging's own rule: a handler never raises
            self.handleError(record)


_announce = logging.getLogger("ciclo.resume")
_announce.addHandler(_Stderr())
_announce.propagate = False  # printed once, whatever the root logger's handlers


def announce(message: str, *args: Any) -> None:
    """One line on stderr through the `ciclo.resume` logger: a resume, a preemption.

    What a restarted job's output must show, so it is on by default (level
    WARNING, with a handler of its own). Silence it with
    `logging.getLogger("ciclo.resume").setLevel(logging.ERROR)`; send it
    elsewhere by replacing that logger's handlers.
    """
    _announce.warning(message, *args)


class Survival:
    """One loop's backup session and signal guard, driven by the engine.

    Args:
        backup: `backup=` as the loop was given it (None, a directory, a `Backup`).
        backup_every: how often to back up when `backup` does not say.
        kind: the loop's name, recorded in its backups; a backup of another
            kind is refused.
        stop: the loop's `stop`, recorded too: a finished backup resumed with
            another `stop` that it has not reached goes on training.
        catch_keyboard_interrupt: whether Ctrl-C stops the loop after the step
            in flight (else only a backup with `sigint=True` catches it).
    """

    def __init__(
        self,
        backup: Backup | Any,
        backup_every: Any,
        *,
        kind: str,
        stop: Period | None,
        catch_keyboard_interrupt: bool,
    ) -> None:
        self.spec = as_backup(backup)
        self.kind = kind
        self.stop = stop
        self.catch_keyboard_interrupt = catch_keyboard_interrupt
        self.session = None if self.spec is None else Session(self.spec, backup_every, kind=kind, stop=stop)
        self.restored: Restored | None = None
        self.guard: SignalGuard | None = None
        self.watching = False
        """Whether `after_step` has anything to do: a backup, or a signal that may ask to stop."""
        self._iterator: Iterator[Any] | None = None
        self._samples_before = 0  # samples counted before this run drew its first batch

    @property
    def forced(self) -> bool:
        """Whether a second Ctrl-C raised: that KeyboardInterrupt is never caught."""
        return self.guard is not None and self.guard.forced

    def restore(self, state: Any, history: History) -> Restored | None:
        """The backup to resume from (its History loaded into `history`), or None to start afresh."""
        session = self.session
        if session is None:
            return None
        try:
            restored = session.restore(state)
            if restored is not None:
                self._check_kind(restored)
                history.load_host(restored.history)
                self._note_changed_hyperparameters(restored, state)
        except BaseException as error:
            note_lost_peer(error)
            session.close()
            raise
        self.restored = restored
        if restored is not None:
            announce(
                "ciclo: resumed %s from the backup at step %d in %s%s",
                self.kind,
                restored.step,
                self.spec.directory,  # type: ignore[union-attr]
                "".join(
                    [
                        " (a finished run)" if restored.finished else "",
                        f" (newer backups at steps {list(restored.skipped)} could not be read)"
                        if restored.skipped
                        else "",
                    ]
                ),
            )
        return restored

    def _note_changed_hyperparameters(self, restored: Restored, state: Any) -> None:
        changes = changed_hyperparameters(restored.state, state)
        if changes:
            _log.warning(
                "the backup at step %d in %s was written with other optimizer hyperparameters than this "
                "run's state has (%s): the backup's optimizer state, and these values, are resumed; "
                "give backup= another directory to train with the new ones",
                restored.step,
                self.spec.directory,  # type: ignore[union-attr]
                "; ".join(changes),
            )

    def _check_kind(self, restored: Restored) -> None:
        if restored.kind != self.kind:
            raise ValueError(
                f"the backup in {self.spec.directory} was written by {short(restored.kind)}, "  # type: ignore[union-attr]
                f"and this loop is {self.kind!r}: resuming it would return the results of another "
                "loop. Give backup= a directory of this loop's own"
            )

    @property
    def done(self) -> bool:
        """Whether the restored backup is a finished run that this loop's `stop` does not extend."""
        restored = self.restored
        if restored is None or not restored.finished:
            return False
        if self.stop == restored.stop:
            return True
        # Another stop: go on from the finished state unless it is reached already.
        return self.stop is not None and restored.elapsed >= self.stop

    def start(
        self,
        loop_state: LoopState[Any],
        clock: Clock,
        iterator: Iterator[Any],
        dataset: Any,
        start_hooks: list[Callable[[LoopState[Any]], None]],
    ) -> tuple[Iterator[Any], int]:
        """Before the first step: callback states, the dataset's position, the start hooks, a first backup.

        Returns:
            The iterator to draw from and how many batches the run had drawn.
        """
        restored = self.restored
        drawn = 0
        try:
            if restored is not None:
                loop_state.load_state_dicts(restored.callbacks)
                iterator = position_dataset(iterator, dataset, restored, clock.batch_size_fn)
                drawn = restored.position
                self._samples_before = restored.elapsed.samples - restored.samples
            else:
                self._samples_before = clock.samples
            for hook in start_hooks:  # each refuses what it can know before the first step
                hook(loop_state)
        except BaseException:
            self.close()
            raise
        self._iterator = iterator
        sigint = self.catch_keyboard_interrupt or (self.spec is not None and self.spec.sigint)
        self.guard = SignalGuard.for_loop(sigterm=self.session is not None, sigint=sigint)
        self.watching = self.guard.active or self.session is not None
        if self.session is not None and restored is None:
            # A backup of the start: a run killed before its first periodic backup resumes as a
            # resumed run too (its checkpoint callbacks then know the checkpoints are their own).
            self._save(loop_state, clock, drawn, finished=False, wait=False)
        return iterator, drawn

    def check_at(self) -> float:
        """The step count from which `after_step` has work besides a signal: the engine's cheap gate.

        The engine calls `after_step` when a signal is pending or `clock.steps`
        reached this count: a backup's next boundary, 0 (every step) for a
        backup on another schedule or a multi-process sync point, and never
        (infinity) with no backup.
        """
        guard = self.guard
        if guard is not None and guard.sync_point:
            return 0
        session = self.session
        return math.inf if session is None else session.next_due()

    def after_step(self, loop_state: LoopState[Any], clock: Clock, drawn: int) -> None:
        """After each step: stop on a signal (saving first when it is a preemption), or back up when due.

        Raises:
            ciclo.types.Preempted: after saving, on SIGTERM (or SIGINT with `sigint=True`).
            KeyboardInterrupt: on Ctrl-C without a backup that takes it.
        """
        guard = self.guard
        assert guard is not None
        if guard.active and guard.requested(clock.steps):
            signum = guard.signum
            assert signum is not None
            if self.session is not None and (signum != signal.SIGINT or self.spec.sigint):  # type: ignore[union-attr]
                self._save(loop_state, clock, drawn, finished=False, wait=True)
                preempted = Preempted(signum, clock.steps, self.spec.directory)  # type: ignore[union-attr]
                announce("ciclo: %s", preempted)
                raise preempted
            raise KeyboardInterrupt
        session = self.session
        if session is not None and session.due(clock.steps, clock.now):
            self._save(loop_state, clock, drawn, finished=False, wait=False)

    def finish(self, loop_state: LoopState[Any], clock: Clock, drawn: int) -> None:
        """The final backup, marked finished: after the end hooks, so that it claims what they flushed."""
        if self.session is not None:
            self._save(loop_state, clock, drawn, finished=True, wait=True)

    def _save(
        self, loop_state: LoopState[Any], clock: Clock, drawn: int, *, finished: bool, wait: bool
    ) -> None:
        assert self.session is not None
        self.session.save(
            loop_state.state,
            clock.now(),
            loop_state.history,
            loop_state.state_dicts(),
            drawn,
            clock.samples - self._samples_before,
            iterator_state(self._iterator),
            finished=finished,
            wait=wait,
        )

    def close(self, error: BaseException | None = None) -> None:
        """Finishes the save in flight, then gives the signals back (a Ctrl-C meanwhile sets the flag).

        `error` is what stopped the loop, if anything: when it says that another
        process is gone, one line says so before the wait for the save in flight
        (which JAX ends, see `ciclo._src.orbax_io.note_lost_peer`).
        """
        try:
            if self.session is not None:
                if error is not None:
                    note_lost_peer(error)
                self.session.close()
        finally:
            if self.guard is not None:
                self.guard.release()
