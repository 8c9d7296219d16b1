"""`ciclo.watchdog`: a thread that ends a hung run with an exit code a requeue loop recognises."""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, ClassVar, final

import jax

from ciclo._src.base.checks import check_int
from ciclo._src.base.reprs import short
from ciclo._src.engine.callback import Callback
from ciclo._src.resume.backup import BackupCallback
from ciclo._src.resume.goodput import saving_since

if TYPE_CHECKING:
    from ciclo._src.engine.loop_state import LoopState

FILE = "ciclo_watchdog.{}.txt"  # beside the backups, one per process: the stacks of each hang, appended


def _seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, got {short(value)}")
    return float(value)


@final
@dataclasses.dataclass(eq=False)
class Watchdog(Callback):
    """Ends the process with `exit_code` when no step commits in time; create it with `ciclo.watchdog`."""

    hook: ClassVar[str | None] = "on_train_begin"
    step_timeout: float
    startup_timeout: float
    exit_code: int
    save_timeout: float | None
    straggler_factor: float | None = None
    directory: str | None = None  # where the stacks go besides stderr: a loop's backup directory

    def beside(self, directory: str) -> Watchdog:
        """This watchdog writing its file in `directory` (a loop's backup directory) unless it has one."""
        return dataclasses.replace(self, directory=self.directory or directory)

    def on_start(self, loop_state: LoopState[Any], /) -> None:
        self._done, self._commits = threading.Event(), 0
        # Under several processes JAX aborts (134) a process whose peer stopped its heartbeats after ~100 s.
        bound = self.save_timeout or (80.0 if jax.process_count() > 1 else 600.0)
        args = (loop_state, self._done, bound)
        threading.Thread(target=self._watch, args=args, name="ciclo-watchdog", daemon=True).start()

    def on_step_end(self, loop_state: LoopState[Any], /) -> None:
        self._commits += 1  # counted here, not read from the step count: a backup's restore moves that

    def on_end(self, loop_state: LoopState[Any], error: BaseException | None, /) -> None:
        self._done.set()

    def _watch(self, loop_state: LoopState[Any], done: threading.Event, save_bound: float) -> None:
        commits, timeout = 0, self.startup_timeout  # before the first step: restore and compile included
        deadline = time.monotonic() + timeout
        while not done.wait(min(1.0, self.step_timeout / 4)):
            now, since = time.monotonic(), saving_since()
            if self._commits != commits:
                commits, timeout = self._commits, self.step_timeout
                deadline = now + timeout
            elif since is not None and now - since < save_bound:  # a save's blocking work: not a hang
                deadline = max(deadline, now + self.step_timeout)
            elif since is not None:
                why = f"a save blocked for more than save_timeout={save_bound:g} s"
                return self._fire(loop_state.steps, why)
            elif now > deadline:
                return self._fire(loop_state.steps, f"no step committed within {timeout:g} s")
        return None

    def _fire(self, steps: int, why: str) -> None:
        process = jax.process_index()
        head = (
            f"ciclo.watchdog: {why} (process {process}, last committed step {steps}, "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')}): the stacks of every thread follow; exiting with "
            f"code {self.exit_code} so that a requeue loop restarts the run from its last backup\n"
        )
        # Python's streams are flushed aside: a main thread stuck writing to one holds its lock.
        flush = threading.Thread(target=lambda: [s.flush() for s in (sys.stdout, sys.stderr)], daemon=True)
        flush.start()
        flush.join(5.0)
        descriptors = [2]  # stderr, below Python's streams
        if self.directory is not None:
            path = os.path.join(self.directory, FILE.format(process))
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
            with contextlib.suppress(OSError):
                descriptors.append(os.open(path, flags, 0o644))
        for descriptor in descriptors:
            os.write(descriptor, head.encode())
            faulthandler.dump_traceback(descriptor, all_threads=True)
        os._exit(self.exit_code)


def loop_watchdog(value: Any, backup: BackupCallback | None) -> list[Watchdog]:
    """A loop's `watchdog=` as its callbacks, writing beside `backup`'s files; refuses anything else."""
    if value is None:
        return []
    if not isinstance(value, Watchdog):
        raise TypeError(f"watchdog must be ciclo.watchdog(step_timeout=...), got {short(value)}")
    if backup is None:
        return [value]
    backup.straggler_factor = value.straggler_factor  # the backups' exchange reports them
    return [value.beside(backup.spec.directory)]


def watchdog(
    *,
    step_timeout: float,
    startup_timeout: float = 1800.0,
    exit_code: int = 124,
    save_timeout: float | None = None,
    straggler_factor: float | None = 3.0,
) -> Watchdog:
    """Ends a hung run: when no step commits in time, dumps every thread's stack and exits with `exit_code`.

    A daemon thread watches the count of steps the loop commits. When it has
    not moved for `step_timeout` seconds (before the first step: `startup_timeout`,
    which covers a backup's restore and the compile), the watchdog writes the
    last committed step and the stack of every thread (`faulthandler`) to
    stderr and, when the loop has a backup, to `ciclo_watchdog.<process>.txt`
    in the backup directory, then ends the process with `os._exit(exit_code)`.
    Run the script in a requeue loop that restarts it on that code: it resumes
    from its last backup (docs/resume.md, "Hangs: the watchdog").

    The blocking work of ciclo's backups and checkpoints is marked while it
    runs: the timer waits meanwhile, for up to `save_timeout` per save.

    Under several processes, given as a loop's `watchdog=` with a backup, each
    backup also shares every process's time per step since the last one (no
    sync per step), and process 0 warns of a straggler: a process whose own
    time per step is over `straggler_factor` times the median.

    Args:
        step_timeout: seconds without a committed step that count as a hang.
        startup_timeout: seconds allowed before the first step commits.
        exit_code: the process's exit code on a hang (124, as `timeout(1)`'s).
        save_timeout: seconds a save may block the loop; default 600, and 80
            under several processes, below JAX's heartbeat timeout (~100 s)
            after which a process whose peer stopped aborts with code 134.
        straggler_factor: how much slower than the median a process's steps
            are when the backups name it in a warning; None: no report.

    Returns:
        A callback: give it to a loop as `watchdog=` (or in `callbacks=[...]`).

    Example:
        >>> import ciclo
        >>> def train_step(state, batch):
        ...     return None, state + batch
        >>> guard = ciclo.watchdog(step_timeout=60)
        >>> ciclo.loop(0, range(5), {ciclo.every(1): train_step}, watchdog=guard)[0]
        10
    """
    check_int(exit_code, "exit_code", 0)
    startup = _seconds(startup_timeout, "startup_timeout")
    save = None if save_timeout is None else _seconds(save_timeout, "save_timeout")
    factor = straggler_factor
    if factor is not None and (
        isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 1
    ):
        raise ValueError(f"straggler_factor must be a number > 1 (None: no report), got {short(factor)}")
    return Watchdog(_seconds(step_timeout, "step_timeout"), startup, exit_code, save, factor)
