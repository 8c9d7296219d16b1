"""`ciclo.goodput` through two real SIGKILLs: each restart redid exactly the steps done since the last backup.

A small `train_loop` script (a backup every 5 steps) is killed twice at a gate:
the step function of step `PAUSE` prints `paused` once the backup before it is
on disk, and waits to be killed. The steps the killed start had done are then
known (`PAUSE - 1`), as is the backup the next start resumes from.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from support import processes, zygote

from ciclo._src.resume.goodput import BUCKETS

SCRIPT = """
import sys, time
from pathlib import Path

import jax, jax.numpy as jnp
import ciclo

directory, pause = Path(sys.argv[1]), int(sys.argv[2])
add = jax.jit(lambda state, batch: state + batch)


def train_step(state, batch):
    time.sleep(0.01)
    return None, add(state, batch)


def gate(state, batch, elapsed):
    if elapsed.steps + 1 == pause:  # in step `pause`: steps 1 to pause - 1 are done
        backed_up = directory / "backup" / str((pause - 1) // 5 * 5)
        while not backed_up.exists():  # the backup before the kill is complete
            time.sleep(0.01)
        print("paused", flush=True)
        time.sleep(300)
        raise SystemExit("not killed")


def batches():
    for index in range(100):
        time.sleep(0.005)
        yield jnp.int32(index)


ciclo.train_loop(
    jnp.int32(0),
    batches(),
    {ciclo.on_train_step: [train_step, gate]},
    stop=40,
    backup=ciclo.backup(directory / "backup", every=5),
)
print("done", flush=True)
"""


def run(directory: Path, pause: int) -> zygote.Process:
    script = directory / "train.py"
    script.write_text(SCRIPT)
    return zygote.popen(
        [sys.executable, str(script), str(directory), str(pause)],
        env=processes.clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def kill_at_gate(proc: zygote.Process) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "paused":
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=60)
            return
    raise AssertionError(f"ended ({proc.wait()}) without pausing: {proc.stderr.read()}")  # type: ignore[union-attr]


def test_the_steps_redone_after_each_sigkill_are_those_since_the_last_backup(tmp_path: Path) -> None:
    import ciclo

    kill_at_gate(run(tmp_path, 13))  # steps 1 to 12 done, the backup of step 10 on disk
    kill_at_gate(run(tmp_path, 27))  # resumed at 10; 26 done, the backup of step 25 on disk
    last = run(tmp_path, 0)
    out, err = last.communicate(timeout=300)
    assert last.returncode == 0 and out.strip() == "done", err
    report = ciclo.goodput(tmp_path / "backup")
    assert [(r["resumed"], r["steps"], r["lost"]) for r in report.rows] == [
        (0, 12, 0),
        (10, 26, 2),
        (25, 40, 1),
    ]
    totals = report.to_dict()
    assert (totals["restarts"], totals["lost"]) == (2, 3)
    for row in report.rows:  # the attributed buckets and `other` sum to the wall time within 2%
        assert abs(sum(row[name] for name in BUCKETS) - row["wall"]) <= 0.02 * row["wall"], row
        assert row["step"] >= (row["steps"] - row["resumed"]) * 0.01 * 0.9, row
    assert f"ciclo: goodput {totals['goodput']:.1%} over 2 restarts (3 steps redone): wall" in err
