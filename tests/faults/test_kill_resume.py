"""Real processes killed with real signals resume to the same result, bit for bit (`nox -s faults`).

Each test runs `worker.py` once without interruption (the reference), then
again in another directory, killing it at seeded random moments (some right as
a backup starts) and starting it again until it finishes. The parameters and
the History it ends with must equal the reference exactly.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import log_readers, processes, zygote
from support.optional import optional

WORKER = Path(__file__).with_name("worker.py")
TIMEOUT = 600


CONTAINER = ["unshare", "--pid", "--fork", "--mount-proc"]
"""Runs a command as pid 1 of a new pid namespace, as a container runs its entry point."""


def start(mode: str, directory: Path, *extra: str, container: bool = False) -> zygote.Process:
    """Starts the worker, forked from the zygote (`support.zygote`); in a `container`, a fresh interpreter
    as pid 1 of a new pid namespace (then `proc` is `unshare`)."""
    directory.mkdir(exist_ok=True)
    with open(directory / "stderr.log", "a") as log:  # the child keeps its own copy
        return zygote.popen(
            [*(CONTAINER if container else []), sys.executable, str(WORKER), mode, str(directory), *extra],
            env=processes.clean_env(),
            stdout=subprocess.PIPE,
            stderr=log,
        )


def finish(proc: zygote.Process, directory: Path) -> None:
    """Lets the process run to its end; it must succeed."""
    proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, (directory / "stderr.log").read_text()


def run_uninterrupted(mode: str, directory: Path) -> dict[str, np.ndarray]:
    finish(start(mode, directory), directory)
    return dict(np.load(directory / "result_0.npz"))


@pytest.fixture(scope="module")
def one_process_reference(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The directory of an uninterrupted run of `mode` (its `result_0.npz`, its logs), run once per module."""
    done: dict[str, Path] = {}

    def reference(mode: str) -> Path:
        if mode not in done:
            directory = tmp_path_factory.mktemp(f"reference_{mode}")
            run_uninterrupted(mode, directory)
            done[mode] = directory
        return done[mode]

    return reference


def descendants(pid: int) -> list[int]:
    """The processes started by `pid` and by them, as /proc lists them now (W&B's service among them)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:  # gone meanwhile
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry))
    found, pending = [], [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def signal_tree(pid: int, signum: int) -> None:
    """Sends `signum` to `pid`; a SIGKILL also kills every process it started, as a scheduler kills a job.

    W&B's service runs in a session of its own: killed with the script, it writes nothing after it.
    """
    helpers = descendants(pid) if signum == signal.SIGKILL else []
    os.kill(pid, signum)
    for helper in helpers:
        try:
            os.kill(helper, signum)
        except ProcessLookupError:
            pass


def pid_1(proc: zygote.Process) -> int:
    """The host's pid of the process that `start(..., container=True)` runs as pid 1 of its namespace."""
    return int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])


def kill_when(
    proc: zygote.Process,
    prefix: str,
    count: int,
    delay: float,
    signum: int,
    *,
    container: bool = False,
) -> bool:
    """Sends `signum` `delay` seconds after the `count`-th output line starting with `prefix`.

    In a `container`, the signal goes to the worker (pid 1 of its namespace), not to `unshare`.
    Returns whether the process was still running when the signal was sent.
    """
    assert proc.stdout is not None
    seen = 0
    for line in proc.stdout:
        if line.startswith(prefix):
            seen += 1
            if seen == count:
                time.sleep(delay)
                alive = proc.poll() is None
                if alive:
                    signal_tree(pid_1(proc) if container else proc.pid, signum)
                proc.communicate(timeout=TIMEOUT)
                return alive
    proc.wait(timeout=TIMEOUT)
    return False


def assert_equal_results(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert sorted(actual) == sorted(expected)
    assert any(key.startswith("history_") for key in expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(actual[key], value, err_msg=key)  # bitwise


def read_loggers(directory: Path) -> dict[str, list[tuple[int, str, float]]]:
    """What every logger of the `train_loop` worker holds, each read as its own reader reads it."""
    runs = json.loads((directory / "runs.json").read_text())
    written = {
        "tensorboard": log_readers.tensorboard(directory / "tb"),
        "csv": log_readers.csv_file(directory / "log.csv"),
        "wandb": log_readers.wandb_offline(directory / "wandb", runs["wandb"]),
        "mlflow": log_readers.mlflow_run("file:" + str(directory / "mlruns"), runs["mlflow"]),
    }
    return {backend: sorted(rows) for backend, rows in written.items()}


def assert_each_step_once(actual: dict[str, list[tuple[int, str, float]]], expected: dict[str, Any]) -> None:
    for backend, written in actual.items():
        keys = [(step, name) for step, name, _ in written]
        assert len(keys) == len(set(keys)), f"{backend}: a step written twice"
        # Every step, with the uninterrupted run's values (NaN included: compared by repr). A process
        # logs `performance.compiles` at its own first step: a resumed one compiles again, by nature.
        assert [(s, n, repr(v)) for s, n, v in written if n != "compiles"] == [
            (s, n, repr(v)) for s, n, v in expected[backend] if n != "compiles"
        ]


@pytest.mark.parametrize(
    ("mode", "seed", "span", "kills"),
    [("loop", 1, 8, 6), ("train_loop", 2, 14, 4), ("spikes", 3, 14, 3), ("population", 4, 14, 3)],
)
def test_sigkill_at_random_moments_then_resume(
    mode: str,
    seed: int,
    span: int,
    kills: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    one_process_reference: Callable[[str], Path],
) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads a file: store only then
    reference_directory = one_process_reference(mode)
    reference = dict(np.load(reference_directory / "result_0.npz"))
    # A finite run: a non-finite state is never backed up, and the kills would resume from before it.
    assert np.isfinite(reference["history_loss"]).all()
    rng = random.Random(seed)
    directory = tmp_path / "killed"
    done = []
    for i in range(kills):
        proc = start(mode, directory)
        if i % 2 == 0:
            # During a save: right as the first backup of this run starts.
            spec = ("saving", 1, rng.uniform(0.0, 0.05))
        else:
            spec = ("step", rng.randint(1, span), rng.uniform(0.0, 0.3))
        if kill_when(proc, *spec, signum=signal.SIGKILL):
            assert proc.returncode == -signal.SIGKILL
            done.append(spec)
    assert len(done) == kills, done
    finish(start(mode, directory), directory)
    assert_equal_results(dict(np.load(directory / "result_0.npz")), reference)
    if mode == "train_loop":  # with every logger attached: each holds each step once
        assert_each_step_once(read_loggers(directory), read_loggers(reference_directory))
    # No orbax temporary directory is left behind, and at most `keep` backups are.
    backups = sorted(p.name for p in (directory / "backup").iterdir())
    assert not [name for name in backups if "tmp" in name], backups
    assert len([name for name in backups if name.isdigit()]) <= 2, backups


# grain_prefetch: preempted with two batches read ahead of the step it stops at, it resumes at the
# batch after that step (grain's iterator state, as ciclo.prefetch_to_device keeps it).
@pytest.mark.parametrize("mode", ["loop", *(["grain_prefetch"] if optional("grain") else [])])
def test_sigterm_saves_then_exits_143_and_resumes(
    mode: str, tmp_path: Path, one_process_reference: Callable[[str], Path]
) -> None:
    reference = dict(np.load(one_process_reference(mode) / "result_0.npz"))
    directory = tmp_path / "preempted"
    proc = start(mode, directory)
    assert kill_when(proc, "step", 7, 0.0, signal.SIGTERM)
    assert proc.returncode == 143, (directory / "stderr.log").read_text()
    assert not (directory / "result_0.npz").exists()
    finish(start(mode, directory), directory)
    assert_equal_results(dict(np.load(directory / "result_0.npz")), reference)


def pid_namespace_refusal() -> str | None:
    """Why a process cannot be started as pid 1 of a new pid namespace here, or None if it can."""
    if shutil.which("unshare") is None:
        return "needs util-linux's unshare"
    probe = subprocess.run([*CONTAINER, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"{' '.join(CONTAINER)} is not permitted here (it needs root): {probe.stderr.strip()}"
    return None


def test_a_container_killed_as_pid_1_and_restarted_as_pid_1_resumes(
    tmp_path: Path, one_process_reference: Callable[[str], Path]
) -> None:
    """A container's entry point is pid 1 of its pid namespace, again after each restart (Kubernetes'
    `restartPolicy: OnFailure`), on the same host name: the backup's lock must not take the new pid 1
    for the killed one."""
    refusal = pid_namespace_refusal()
    if refusal is not None:
        pytest.skip(refusal)
    reference = dict(np.load(one_process_reference("loop") / "result_0.npz"))
    rng = random.Random(5)
    directory = tmp_path / "container"
    # As the third backup of this run starts, or after a step past the second: orbax waits for a save
    # before it starts the next, so the first backup is complete and each run resumes further on.
    moments = [("saving", 3) if i % 2 == 0 else ("step", rng.randint(11, 14)) for i in range(5)]
    for prefix, count in moments:
        proc = start("loop", directory, container=True)
        killed = kill_when(proc, prefix, count, 0.0, signal.SIGKILL, container=True)
        assert killed, (prefix, count, (directory / "stderr.log").read_text()[-2000:])
        assert not (directory / "result_0.npz").exists()  # killed before its end (unshare says 1 or 137)
    finish(start("loop", directory, container=True), directory)
    assert_equal_results(dict(np.load(directory / "result_0.npz")), reference)


def start_two(mode: str, directory: Path, pauses: tuple[str, str] = ("", "")) -> list[zygote.Process]:
    """Starts both processes of a 2-process run; `pauses` freezes each at a moment (worker.py's PAUSE)."""
    port = str(processes.free_port())
    return [start(mode, directory, str(i), port, *filter(None, [pauses[i]])) for i in range(2)]


def run_two(mode: str, directory: Path, *, signum: int | None = None, after: int = 0) -> list[int]:
    """Runs both processes of a 2-process run; optionally sends `signum` to process 0 after its
    `after`-th step line. Returns the exit codes."""
    procs = start_two(mode, directory)
    try:
        if signum is not None:
            kill_when(procs[0], "step", after, 0.0, signum)
        for proc in procs:
            proc.communicate(timeout=TIMEOUT)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [proc.returncode for proc in procs]


@pytest.fixture(scope="module")
def two_process_reference(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The directory of an uninterrupted 2-process run of `mode`, run once per module."""
    done: dict[str, Path] = {}

    def reference(mode: str) -> Path:
        if mode not in done:
            directory = tmp_path_factory.mktemp(f"reference_{mode}")
            assert run_two(mode, directory) == [0, 0], (directory / "stderr.log").read_text()
            done[mode] = directory
        return done[mode]

    return reference


@pytest.fixture(scope="module")
def two_process_preempted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The directory of a 2-process run of `mode` stopped by SIGTERM to process 0 after its step 12,
    run once per module: each test resumes a copy of it."""
    done: dict[str, Path] = {}

    def preempted(mode: str) -> Path:
        if mode not in done:
            directory = tmp_path_factory.mktemp(f"preempted_{mode}")
            codes = run_two(mode, directory, signum=signal.SIGTERM, after=12)
            # Both stop at the step they agreed on, after saving their shards.
            assert codes == [143, 143], (directory / "stderr.log").read_text()
            done[mode] = directory
        return done[mode]

    return preempted


def assert_equal_to_reference(directory: Path, reference: Path) -> None:
    for process in range(2):
        assert_equal_results(
            dict(np.load(directory / f"result_{process}.npz")),
            dict(np.load(reference / f"result_{process}.npz")),
        )


FSDP = pytest.mark.xdist_group("distributed_fsdp")
"""The tests of `distributed_fsdp` share its reference and preempted runs: `nox -s faults` (`--dist
loadgroup`) runs them on one pytest-xdist worker, where the module's fixtures run each once."""


@pytest.mark.parametrize("strategy", ["data_parallel", pytest.param("fsdp", marks=FSDP)])
def test_two_processes_preempted_by_sigterm_to_one_resume_together(
    strategy: str,
    tmp_path: Path,
    two_process_reference: Callable[[str], Path],
    two_process_preempted: Callable[[str], Path],
) -> None:
    mode = f"distributed_{strategy}"
    reference = two_process_reference(mode)
    directory = shutil.copytree(two_process_preempted(mode), tmp_path / "preempted")
    assert run_two(mode, directory) == [0, 0], (directory / "stderr.log").read_text()
    assert_equal_to_reference(directory, reference)


@FSDP
def test_two_processes_fall_back_together_over_a_backup_one_of_them_cannot_read(
    tmp_path: Path,
    two_process_reference: Callable[[str], Path],
    two_process_preempted: Callable[[str], Path],
) -> None:
    mode = "distributed_fsdp"
    reference = two_process_reference(mode)
    # The preempted run of the test above, whose newest backup this test damages in its own copy.
    directory = shutil.copytree(two_process_preempted(mode), tmp_path / "damaged")
    backups = directory / "backup"
    newest = max(int(step.name) for step in backups.iterdir() if step.name.isdigit())
    # Process 1's shards of the newest backup: only process 1 reads them.
    shards = list((backups / str(newest) / "state" / "ocdbt.process_1" / "d").iterdir())
    assert shards
    for shard in shards:
        with open(shard, "r+b") as file:
            file.truncate(10)
    assert run_two(mode, directory) == [0, 0], (directory / "stderr.log").read_text()
    log = (directory / "stderr.log").read_text()
    # Process 0 read its part, and falls back with process 1 instead of resuming alone.
    assert f"process 1 could not read its part of step {newest}; trying the one before" in log, log
    assert_equal_to_reference(directory, reference)


LOST_PEER_BOUND = processes.HEARTBEAT + 20
"""How long a process may outlive its lost peer: JAX's heartbeat timeout, then the seconds it takes to
end (JAX checks the heartbeats now and then, and prints a stack trace as it aborts; slower when loaded)."""


@FSDP
def test_a_process_whose_peer_is_killed_ends_within_the_heartbeat_timeout_and_both_resume(
    tmp_path: Path, two_process_reference: Callable[[str], Path]
) -> None:
    """Killed at 3 moments, then resumed bit for bit. The first is both processes killed outright
    together: SIGKILL to process 0, and process 1, whose coordination service it held, ends at once."""
    mode = "distributed_fsdp"
    reference = two_process_reference(mode)
    rng = random.Random(3)
    first = rng.randint(6, 14)
    saved = 5 * rng.randint(first // 5 + 1, 5)  # backups are every 5 steps
    last = 5 * rng.randint(saved // 5 + 1, 8)
    # Process 0 (which holds JAX's coordination service: process 1 ends at once) between steps; process 1
    # as a backup starts (process 0 is then inside that save, waiting for it, until JAX's heartbeat
    # timeout declares process 1 dead); process 0 as a backup starts.
    moments = [(0, f"step:{first}"), (1, f"save:{saved}"), (0, f"save:{last}")]
    directory = tmp_path / "lost"
    for victim, pause in moments:
        log_start = (directory / "stderr.log").stat().st_size if directory.exists() else 0
        procs = start_two(mode, directory, (pause, "") if victim == 0 else ("", pause))
        survivor = procs[1 - victim]
        try:
            assert kill_when(procs[victim], "paused", 1, 0.0, signal.SIGKILL), (pause, survivor.poll())
            try:
                survivor.communicate(timeout=LOST_PEER_BOUND)
            except subprocess.TimeoutExpired:
                pytest.fail(f"process {1 - victim} ran on {LOST_PEER_BOUND} s after process {victim} died")
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        log = (directory / "stderr.log").read_bytes()[log_start:].decode(errors="replace")
        # JAX ends it (SIGABRT), or a collective's error reached Python first and the process exited with 1.
        assert survivor.returncode in (-signal.SIGABRT, 1), (pause, survivor.returncode, log[-3000:])
        if victim == 1:
            # Process 0 saw the loss in a barrier or a collective, and said so in one line, naming the
            # backup that the rerun resumes from.
            lines = re.findall(r"^ciclo: process 0 of 2 lost process 1 \(.*", log, re.MULTILINE)
            newest = max(int(step.name) for step in (directory / "backup").iterdir() if step.name.isdigit())
            # The newest complete step when the loss was found, or the save of the newest step, which
            # another thread was finishing as the loss was found (it completed after the line).
            place = re.escape(f"in {directory / 'backup'}")
            resume = (
                rf"; the last complete backup is step {newest} {place}"
                rf"(?: \(step \d+ was being written[^)]*\))?: start every"
                rf"|{place} \(step {newest} was being written: if it completed"
            )
            # The line is printed as the barrier fails; JAX's abort can end the process in that same
            # moment, so it is required only where Python saw the error and ended the process itself.
            assert len(lines) <= 1 and all(re.search(resume, line) for line in lines), (
                pause,
                lines,
                log[-3000:],
            )
            if survivor.returncode == 1:
                assert lines, (pause, log[-3000:])
    assert run_two(mode, directory) == [0, 0], (directory / "stderr.log").read_text()[-5000:]
    assert_equal_to_reference(directory, reference)


@FSDP
def test_a_process_whose_peer_stopped_exits_124_and_the_requeued_run_resumes_bitwise(
    tmp_path: Path, two_process_reference: Callable[[str], Path]
) -> None:
    """The watchdog's requeue (docs/resume.md, "Hangs: the watchdog") under two processes: process 1
    stops (SIGSTOP) in its step 8; process 0, waiting for it, exits with 124 before JAX's heartbeat
    timeout would end it; the scheduler kills process 1; both start again and end as a run never
    interrupted, bit for bit."""
    mode = "distributed_fsdp"
    reference = two_process_reference(mode)
    directory = tmp_path / "stopped"
    procs = start_two(mode, directory, ("watch", "stop:8"))
    try:
        procs[0].communicate(timeout=TIMEOUT)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()  # the stopped one, as its scheduler would
            proc.communicate()
    log = (directory / "stderr.log").read_text()
    assert procs[0].returncode == 124, log[-3000:]
    # Whether process 0 waits in a step or in the next backup's save depends on how far it ran ahead.
    fired = r"ciclo\.watchdog: (no step committed within 2 s|a save blocked for more than save_timeout=5 s) "
    assert re.search(fired + r"\(process 0, last committed step", log), log[-3000:]
    assert not (directory / "result_0.npz").exists()
    assert run_two(mode, directory) == [0, 0], (directory / "stderr.log").read_text()[-5000:]
    log = (directory / "stderr.log").read_text()
    assert re.search(r"resumed loop from the backup at step \d+ in ", log), log[-3000:]
    assert_equal_to_reference(directory, reference)
