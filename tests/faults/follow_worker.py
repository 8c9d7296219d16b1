"""A training and an evaluator that follows its checkpoints: the fault tests run each in its own process.

Usage: python follow_worker.py train DIRECTORY
       python follow_worker.py follow DIRECTORY [PAUSE]

`train` runs `STEPS` steps of `w += batch` (batches 0, 1, 2, ...), pausing a
moment after each so that its checkpoints (after every step, in
`DIRECTORY/checkpoints`) appear one by one, and ends as a finished run: its
checkpoint callback marks the last one final. `follow` evaluates each
checkpoint with `ciclo.follow_checkpoints` and appends `<step> <w>` to
`DIRECTORY/evaluated.txt` as the loop body's last act. With PAUSE `n`, its
n-th loop body prints `paused` before it evaluates and waits to be killed:
the steps before it are done, and the follower's progress file says so.
"""

from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp

import ciclo

MODE = sys.argv[1]
DIRECTORY = sys.argv[2]
CHECKPOINTS = os.path.join(DIRECTORY, "checkpoints")
STEPS = 12


@jax.jit
def add(state, batch):
    return None, {"w": state["w"] + batch}


def pace(state, batch):
    time.sleep(0.1)  # the follower sees the checkpoints appear as training goes, not all at its end


def train() -> None:
    ckpt = ciclo.checkpoint(CHECKPOINTS, keep=None)
    tasks = {ciclo.every(1): [add, pace], ciclo.at_step_end(ciclo.every(1)): [ckpt]}
    ciclo.loop({"w": jnp.float32(0)}, range(STEPS), tasks, stop=STEPS)


def follow(pause: int) -> None:
    followed = ciclo.follow_checkpoints(CHECKPOINTS, {"w": jnp.float32(0)}, poll=0.05)
    for count, (step, state) in enumerate(followed, start=1):
        if count == pause:
            print("paused", flush=True)
            time.sleep(300)  # killed meanwhile
            raise SystemExit(f"paused at the evaluation of step {step} and not killed in 300 s")
        with open(os.path.join(DIRECTORY, "evaluated.txt"), "a") as file:
            file.write(f"{step} {float(state['w'])}\n")
        print(f"evaluated {step}", flush=True)


if __name__ == "__main__":
    if MODE == "train":
        train()
    elif MODE == "follow":
        follow(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    else:
        raise SystemExit(f"unknown mode {MODE!r}")
