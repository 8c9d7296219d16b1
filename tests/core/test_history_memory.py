"""A long `ciclo.loop` keeps its history on the host: memory does not grow with device buffers per step.

The run happens in a fresh interpreter, so that its peak RSS is not polluted by the
tests that ran before; it reports its measurements as JSON on stdout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="measures peak RSS with the resource module")

STEPS = 100_000
METRICS = ("loss", "accuracy", "scale")

RSS_GROWTH_LIMIT_KIB = 100 * 1024
"""Peak RSS may grow by less than 100 MiB over the 100,000 steps (a few hundred bytes a row)."""

LIVE_ARRAYS_SLACK = 16
"""Device arrays alive after the run beyond those alive before it: the state and a few cached constants."""

IN_FLIGHT_LIMIT = 2_000
"""Before `collect`, the history may still hold the arrays of its last few hundred rows, not of every step."""

SCRIPT = textwrap.dedent(
    """
    import gc
    import itertools
    import json
    import resource
    import sys
    import time

    import jax
    import jax.numpy as jnp

    import ciclo

    steps = int(sys.argv[1])


    @jax.jit
    def train_step(state, batch):
        state = state * 0.999 + 0.001
        logs = ciclo.logs().add_loss("loss", state).add_metric("accuracy", 1.0 - state)
        return logs.add_metric("scale", jnp.float32(2.0) * state), state


    def run(n):
        tasks = {ciclo.every(1): [train_step]}
        return ciclo.loop(jnp.float32(1.0), itertools.repeat(None), tasks, stop=n)


    def peak_rss_kib():
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak // 1024 if sys.platform == "darwin" else peak  # bytes on macOS, KiB on Linux


    # Warm up: compile the step and the history's copies to the host, then forget it all.
    jax.block_until_ready(run(1_000)[0])
    gc.collect()
    live_before = len(jax.live_arrays())
    baseline = peak_rss_kib()

    start = time.perf_counter()
    state, history, elapsed = run(steps)
    jax.block_until_ready(state)
    seconds = time.perf_counter() - start
    live_after_run = len(jax.live_arrays())
    columns = history.collect("loss", "accuracy", "scale")
    gc.collect()
    live_after_collect = len(jax.live_arrays())
    peak = peak_rss_kib()

    print(json.dumps({
        "baseline_peak_rss_kib": baseline,
        "final_peak_rss_kib": peak,
        "live_arrays_before": live_before,
        "live_arrays_after_run": live_after_run,
        "live_arrays_after_collect": live_after_collect,
        "history_len": len(history),
        "steps": elapsed.steps,
        "collected": [len(column) for column in columns],
        "value_types": sorted({type(value).__name__ for column in columns for value in column}),
        "seconds": seconds,
    }))
    """
)


def run_measurement(steps: int) -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(steps)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_a_long_loop_keeps_scalars_on_the_host_and_memory_flat() -> None:
    result = run_measurement(STEPS)

    assert result["steps"] == STEPS
    assert result["history_len"] == STEPS
    assert result["collected"] == [STEPS] * len(METRICS)
    assert result["value_types"] == ["float"]

    growth_kib = result["final_peak_rss_kib"] - result["baseline_peak_rss_kib"]
    assert growth_kib < RSS_GROWTH_LIMIT_KIB, f"peak RSS grew by {growth_kib / 1024:.1f} MiB: {result}"

    assert result["live_arrays_after_run"] < IN_FLIGHT_LIMIT, result
    assert result["live_arrays_after_collect"] <= result["live_arrays_before"] + LIVE_ARRAYS_SLACK, result
