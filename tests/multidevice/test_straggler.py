"""The straggler report: two processes under `jax.distributed`, one slow to get its batches.

Process 1's data iterator sleeps 0.3 s per batch; the steps themselves take milliseconds. At each
backup the processes share their times per step, and process 0 names process 1. No timing is
asserted: a factor of 3 against a 0.3 s sleep per step leaves noise no way to flip the report.
"""

from __future__ import annotations

import sys
from pathlib import Path

from support import processes

SCRIPT = """
import sys, time

import jax
import numpy as np
from jax.experimental import multihost_utils

import ciclo

process_id, port, directory = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", 2, process_id, initialization_timeout=120)


def batches():
    for index in range(6):
        if process_id == 1:
            time.sleep(0.3)  # a slow data pipeline on one host
        yield index


def train_step(state, batch):
    return None, state + int(multihost_utils.process_allgather(np.int32(batch)).sum())


state, _, elapsed = ciclo.loop(
    0,
    batches(),
    {ciclo.every(1): train_step},
    backup=ciclo.backup(directory, every=2),
    watchdog=ciclo.watchdog(step_timeout=120, straggler_factor=3),
)
print("done", state, elapsed.steps, flush=True)
"""


def test_the_backups_name_the_process_whose_batches_come_slowly(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    port = str(processes.free_port())
    commands = [[sys.executable, str(script), str(i), port, str(tmp_path / "backup")] for i in range(2)]
    codes, output = processes.run_together(commands, env=processes.clean_env(), logs=tmp_path, timeout=300)
    assert codes == [0, 0], "\n\n".join(output)
    assert all("done 30 6" in out for out in output), output
    # Process 0 reports at each of the backups of steps 2, 4 and 6 (the first step is not counted).
    reports = [line for line in output[0].splitlines() if "is a straggler" in line]
    assert len(reports) == 3, output[0]
    assert all("process 1 is a straggler: " in line for line in reports), reports
    assert "straggler_factor=3 times the median of the 2 processes" in reports[0]
    assert "is a straggler" not in output[1]  # process 1 hears the figures, process 0 speaks
