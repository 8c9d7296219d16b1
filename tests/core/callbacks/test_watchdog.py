"""`ciclo.watchdog` in this process: when it fires, what it writes, and that a marked save holds it back.

Firing ends the process, so these tests replace `Watchdog._fire` (or `os._exit`)
with a recorder; tests/faults/test_watchdog.py runs the real exit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ciclo
from ciclo._src.callbacks import _watchdog
from ciclo._src.callbacks._watchdog import Watchdog
from ciclo._src.resume.goodput import saving, saving_since

TIMEOUT = 0.2  # where the watchdog must fire
SLOW = 0.5  # where it must not: steps commit at once, well within it even on a loaded machine


@pytest.fixture
def fired(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """What the watchdog fired with, `(last committed step, why)`, instead of ending the process."""
    records: list[tuple[int, str]] = []
    monkeypatch.setattr(Watchdog, "_fire", lambda self, steps, why: records.append((steps, why)))
    return records


def wait_until(condition: Any) -> None:
    """Waits (up to a generous bound) for what the watchdog's thread does."""
    limit = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < limit, "the watchdog's thread did not get there in 30 s"
        time.sleep(0.01)


def step(state: int, batch: int) -> tuple[None, int]:
    return None, state + batch


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="step_timeout must be a number of seconds > 0, got 0"):
        ciclo.watchdog(step_timeout=0)
    with pytest.raises(ValueError, match="save_timeout must be a number of seconds > 0, got True"):
        ciclo.watchdog(step_timeout=1, save_timeout=True)
    with pytest.raises(ValueError, match="exit_code must be an int >= 0, got -1"):
        ciclo.watchdog(step_timeout=1, exit_code=-1)
    with pytest.raises(TypeError, match=r"watchdog must be ciclo.watchdog\(step_timeout=...\), got 60"):
        ciclo.loop(0, range(2), {ciclo.every(1): step}, watchdog=60)  # type: ignore[typeddict-item]
    with pytest.raises(ValueError, match=r"straggler_factor must be a number > 1 \(None: no report\), got 1"):
        ciclo.watchdog(step_timeout=1, straggler_factor=1)
    assert repr(ciclo.watchdog(step_timeout=5)) == (
        "Watchdog(step_timeout=5.0, startup_timeout=1800.0, exit_code=124, save_timeout=None, "
        "straggler_factor=3.0, directory=None)"
    )


def test_a_step_that_does_not_commit_fires_naming_the_last_committed_step(fired: list[Any]) -> None:
    def batches() -> Iterator[int]:
        yield from (1, 2)
        wait_until(lambda: fired)  # the third batch never comes in time
        yield 3

    guard = ciclo.watchdog(step_timeout=TIMEOUT)
    state, _, _ = ciclo.loop(0, batches(), {ciclo.every(1): step}, watchdog=guard)
    assert state == 6
    assert fired == [(2, "no step committed within 0.2 s")]


def test_before_the_first_step_the_startup_timeout_runs(fired: list[Any]) -> None:
    def batches() -> Iterator[int]:
        wait_until(lambda: fired)
        yield 1

    guard = ciclo.watchdog(step_timeout=60, startup_timeout=TIMEOUT)
    ciclo.loop(0, batches(), {ciclo.every(1): step}, watchdog=guard)
    assert fired == [(0, "no step committed within 0.2 s")]


def test_steps_that_commit_in_time_and_a_marked_save_do_not_fire(fired: list[Any]) -> None:
    def saves_at_step_2(state: int, batch: int, elapsed: ciclo.types.Elapsed) -> None:
        if elapsed.steps == 2:
            with saving():  # a save's blocking work, longer than the timeout
                assert saving_since() is not None
                time.sleep(4 * SLOW)

    guard = ciclo.watchdog(step_timeout=SLOW)
    state, _, _ = ciclo.loop(0, range(8), {ciclo.every(1): [step, saves_at_step_2]}, watchdog=guard)
    assert state == 28 and fired == [] and saving_since() is None


def test_a_save_blocked_past_save_timeout_fires(fired: list[Any]) -> None:
    def stuck_save(state: int, batch: int) -> None:
        with saving():
            wait_until(lambda: fired)

    guard = ciclo.watchdog(step_timeout=TIMEOUT, save_timeout=TIMEOUT)
    ciclo.loop(0, range(2), {ciclo.every(1): [step, stuck_save]}, watchdog=guard)
    assert fired == [(0, "a save blocked for more than save_timeout=0.2 s")]


def test_the_thread_ends_with_the_loop(fired: list[Any]) -> None:
    guard = ciclo.watchdog(step_timeout=SLOW)
    ciclo.train_loop(0, range(3), {ciclo.on_train_step: step}, callbacks=[guard])
    wait_until(lambda: not any(t.name == "ciclo-watchdog" for t in threading.enumerate()))
    time.sleep(3 * SLOW)  # after the loop, no step commits: a watchdog still watching would fire
    assert fired == []


def test_firing_writes_the_stacks_beside_the_backups_and_exits(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    exits: list[int] = []
    monkeypatch.setattr(_watchdog.os, "_exit", exits.append)
    guard = ciclo.watchdog(step_timeout=1, exit_code=3).beside(str(tmp_path))
    guard._fire(7, "no step committed within 1 s")
    assert exits == [3]
    head = "ciclo.watchdog: no step committed within 1 s (process 0, last committed step 7, "
    written = (tmp_path / "ciclo_watchdog.0.txt").read_text()
    assert written.startswith(head)
    assert "in test_firing_writes_the_stacks_beside_the_backups_and_exits" in written  # this thread
    assert capfd.readouterr().err.startswith(head)
    # `beside` keeps a directory given; a loop's backup gives its own to one without.
    assert guard.beside("elsewhere").directory == str(tmp_path)


def test_train_loop_takes_it_as_a_setting_and_its_file_goes_beside_the_backups(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    where: list[str | None] = []
    monkeypatch.setattr(Watchdog, "_fire", lambda self, steps, why: where.append(self.directory))

    def batches() -> Iterator[int]:
        yield 1
        wait_until(lambda: where)
        yield 2

    guard = ciclo.watchdog(step_timeout=TIMEOUT)
    backup = tmp_path / "backup"
    state, _, _ = ciclo.train_loop(0, batches(), {ciclo.on_train_step: step}, watchdog=guard, backup=backup)
    assert state == 3 and where == [str(backup)]
    assert guard.directory is None  # the loop's copy took the directory: this one can watch another run


def test_a_resumed_run_s_first_step_has_the_startup_timeout(fired: list[Any], tmp_path: Path) -> None:
    # The backup's restore moves the step count before any batch: that is no step, and the first step
    # (its compile) still has the startup timeout, however soon after the restore the watchdog looks.
    ciclo.loop(0, range(10), {ciclo.every(1): step}, stop=3, backup=tmp_path)

    def compiles_first(state: int, batch: int, elapsed: ciclo.types.Elapsed) -> None:
        if elapsed.steps == 3:
            time.sleep(4 * SLOW)

    guard = ciclo.watchdog(step_timeout=SLOW, startup_timeout=60)
    tasks = {ciclo.every(1): [compiles_first, step]}
    state, _, elapsed = ciclo.loop(0, range(10), tasks, stop=6, backup=tmp_path, watchdog=guard)
    assert (state, elapsed.steps, fired) == (15, 6, [])
