"""One training's time to its first step, in a fresh process: the child of bench.py's "time to first step".

It imports, creates the workload's flax state (`bench.flax_state`) and runs
`ciclo.train_loop(state, numpy batches, stop=1)` to the end of its first step;
then prints one JSON line: the seconds its imports took, the seconds from there
to the first step's end (the state, the loop's start and the step, with their
compiles), and what the loop compiled (`compiled N programs, M from the cache`).
The persistent compilation cache is whatever the environment sets
(`CICLO_COMPILE_CACHE`; bench.py gives each cold and warm pair a fresh one).

Usage:
    python benchmarks/first_step.py medium
"""

from __future__ import annotations

import time

START = time.perf_counter()

import json  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
from bench import WORKLOADS, flax_state, host_iter  # noqa: E402

import ciclo  # noqa: E402
from ciclo._src.base.compile_cache import compiled  # noqa: E402


def main() -> None:
    imported = time.perf_counter()
    workload = WORKLOADS[sys.argv[1]]
    state, _, _ = ciclo.train_loop(flax_state(workload), host_iter(workload), stop=1)
    jax.block_until_ready(state)
    first_step = time.perf_counter()
    times = {"import": imported - START, "first_step": first_step - imported}
    print(json.dumps({**times, "compiled": compiled()}))


if __name__ == "__main__":
    main()
