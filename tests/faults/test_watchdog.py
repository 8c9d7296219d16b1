"""`ciclo.watchdog` in real processes: a hung run exits 124 with its stacks, a slow or saving one runs on.

Each test runs a small script (a Python state, a backup every 2 steps) in a
fresh interpreter, as a requeue loop would. Waits are gated by what the script
prints or writes; the only time bound asserted is a generous one.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from support import processes, zygote

TIMEOUT = 2  # the watchdog's step_timeout in the scripts, seconds
SLACK = 60  # generous: a loaded machine may take long to start the interpreter and JAX

SCRIPT = f"""
import sys, threading, time
from pathlib import Path

import ciclo

mode, directory = sys.argv[1], Path(sys.argv[2])


def block_forever():
    threading.Event().wait()


def batches():
    for index in range(8):
        if mode == "hang" and index == 3:
            print("blocking", flush=True)
            block_forever()
        if mode == "slow":
            time.sleep({TIMEOUT} / 2)
        yield index


class GatedSave(ciclo.Callback):
    # A backup asks the callbacks for their state inside its save: this one waits for the test in the
    # backup of step 2 (after the first steps: the step timeout, not the startup one, runs).
    saves = 0

    def state_dict(self):
        GatedSave.saves += 1
        if mode == "gated_save" and GatedSave.saves == 2:
            print("saving", flush=True)
            while not (directory / "released").exists():
                time.sleep(0.05)
        return {{}}


def train_step(state, batch):
    return None, state + batch


state, _, elapsed = ciclo.loop(
    0,
    batches(),
    {{ciclo.every(1): [train_step, GatedSave()]}},
    backup=ciclo.backup(directory / "backup", every=2),
    watchdog=ciclo.watchdog(step_timeout={TIMEOUT}, startup_timeout={SLACK}),
)
print("done", int(state), elapsed.steps, flush=True)
"""


def start(mode: str, directory: Path) -> zygote.Process:
    script = directory / "train.py"
    script.write_text(SCRIPT)
    return zygote.popen(
        [sys.executable, str(script), mode, str(directory)],
        env=processes.clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_for(proc: zygote.Process, line: str) -> None:
    """Reads the script's stdout until `line` (it must come before the script ends)."""
    assert proc.stdout is not None
    for printed in proc.stdout:
        if printed.strip() == line:
            return
    raise AssertionError(f"the script ended ({proc.wait()}) without printing {line!r}: {proc.stderr.read()}")  # type: ignore[union-attr]


def test_a_run_whose_data_blocks_forever_exits_124_with_the_blocking_function_in_its_stacks(
    tmp_path: Path,
) -> None:
    proc = start("hang", tmp_path)
    wait_for(proc, "blocking")
    began = time.monotonic()
    _, stderr = proc.communicate(timeout=TIMEOUT + SLACK)
    assert proc.returncode == 124, stderr
    assert time.monotonic() - began < TIMEOUT + SLACK
    assert "ciclo.watchdog: no step committed within 2 s" in stderr
    assert "last committed step 3" in stderr
    assert "block_forever" in stderr
    stacks = (tmp_path / "backup" / "ciclo_watchdog.0.txt").read_text()
    assert "last committed step 3" in stacks
    assert "in block_forever" in stacks
    # The requeued run resumes from the backup of step 2 and finishes.
    rerun = start("done", tmp_path)
    stdout, stderr = rerun.communicate(timeout=SLACK * 5)
    assert rerun.returncode == 0, stderr
    assert "resumed loop from the backup at step 2" in stderr
    assert "done 28 8" in stdout


def test_a_run_whose_steps_commit_in_time_is_not_ended(tmp_path: Path) -> None:
    # Each step takes half the timeout: the whole run takes twice as long as the timeout.
    proc = start("slow", tmp_path)
    stdout, stderr = proc.communicate(timeout=SLACK * 5)
    assert proc.returncode == 0, stderr
    assert "done 28 8" in stdout
    assert "ciclo.watchdog" not in stderr


def test_the_timer_waits_while_a_backup_is_saving(tmp_path: Path) -> None:
    proc = start("gated_save", tmp_path)
    wait_for(proc, "saving")  # the backup of step 2, held by the test
    time.sleep(3 * TIMEOUT)  # longer than the timeout: a watchdog that counted the save would fire
    assert proc.poll() is None, proc.communicate()
    (tmp_path / "released").touch()
    stdout, stderr = proc.communicate(timeout=SLACK * 5)
    assert proc.returncode == 0, stderr
    assert "done 28 8" in stdout
    assert "ciclo.watchdog" not in stderr


PAIR = f"""
import os, signal, sys

import jax
import numpy as np
from jax.experimental import multihost_utils

import ciclo

process_id, port = int(sys.argv[1]), int(sys.argv[2])
jax.config.update("jax_cpu_collectives_implementation", "gloo")
# A long heartbeat timeout: JAX would end process 0 with 134 after it; the watchdog must come first.
jax.distributed.initialize(
    f"127.0.0.1:{{port}}", 2, process_id, initialization_timeout=120, heartbeat_timeout_seconds=120
)


def train_step(state, batch, elapsed):
    if process_id == 1 and elapsed.steps == 3:
        os.kill(os.getpid(), signal.SIGSTOP)  # a stuck host: alive, silent
    return None, state + int(multihost_utils.process_allgather(np.int32(batch)).sum())


guard = ciclo.watchdog(step_timeout={TIMEOUT}, startup_timeout={SLACK})
ciclo.loop(0, range(8), {{ciclo.every(1): train_step}}, watchdog=guard)
"""


def test_a_process_whose_peer_stopped_exits_124_before_jax_ends_it(tmp_path: Path) -> None:
    script = tmp_path / "pair.py"
    script.write_text(PAIR)
    port = str(processes.free_port())
    procs = [
        zygote.popen(
            [sys.executable, str(script), str(index), port],
            env=processes.clean_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for index in range(2)
    ]
    try:
        _, stderr = procs[0].communicate(timeout=SLACK * 2)  # well below the heartbeat timeout
        assert procs[0].returncode == 124, stderr
        assert "ciclo.watchdog: no step committed within 2 s (process 0, last committed step 3" in stderr
        assert "process_allgather" in stderr  # where it waited for its peer
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.communicate()
