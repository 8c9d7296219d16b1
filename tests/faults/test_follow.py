"""An evaluator following a training's checkpoints, SIGKILLed and started again, evaluates each once.

The training (`follow_worker.py train`) and the evaluator (`follow_worker.py
follow`) are separate processes, as a standalone evaluator is. The evaluator is
killed twice, each time while it evaluates a step, after its progress file says
the steps before are done; started again, it goes on with that step. In the end
each checkpoint was evaluated once, with the state saved at that step.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from support import processes, zygote

WORKER = Path(__file__).with_name("follow_worker.py")
TIMEOUT = 600
STEPS = 12  # follow_worker.STEPS: a checkpoint after each


def start(directory: Path, *args: str) -> zygote.Process:
    with open(directory / "stderr.log", "a") as log:  # the child keeps its own copy
        return zygote.popen(
            [sys.executable, str(WORKER), args[0], str(directory), *args[1:]],
            env=processes.clean_env(),
            stdout=subprocess.PIPE,
            stderr=log,
        )


def finish(proc: zygote.Process, directory: Path) -> None:
    proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, (directory / "stderr.log").read_text()[-5000:]


def test_a_follower_killed_and_started_again_evaluates_every_checkpoint_once(tmp_path: Path) -> None:
    procs = [start(tmp_path, "train")]
    try:
        # Paused in its 4th evaluation (steps 1 to 3 done), then in the 3rd of the next (4 and 5 done).
        for pause, done in ((4, 3), (3, 5)):
            follower = start(tmp_path, "follow", str(pause))
            procs.append(follower)
            assert follower.stdout is not None
            lines = iter(follower.stdout)
            assert next((line for line in lines if line == "paused\n"), None), (
                tmp_path / "stderr.log"
            ).read_text()[-5000:]
            # The gate: the steps before the one being evaluated are recorded done, and no more.
            progress = tmp_path / "checkpoints" / "ciclo_follow_default.json"
            assert json.loads(progress.read_text()) == {"done": done}
            follower.send_signal(signal.SIGKILL)
            follower.communicate(timeout=TIMEOUT)
            assert follower.returncode == -signal.SIGKILL
        # The last one ends by itself once the training has marked its final checkpoint.
        procs.append(start(tmp_path, "follow"))
        for proc in (procs[0], procs[-1]):
            finish(proc, tmp_path)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    evaluated = [line.split() for line in (tmp_path / "evaluated.txt").read_text().splitlines()]
    # Each step once, in order, holding w = 0 + 1 + ... + (step - 1).
    assert [(int(step), float(w)) for step, w in evaluated] == [
        (step, float(step * (step - 1) // 2)) for step in range(1, STEPS + 1)
    ]
