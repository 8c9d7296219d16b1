"""Nothing in the loop, History, the bars or the managed steps waits for the device at each step.

A host callback inside the step holds step `GATED` on the device until the loop
has run `AHEAD` steps past it: a loop callback after the bar counts the steps
and then lets the held step finish. Anything in those steps that waits for the
device (reading a logged value, `block_until_ready`, `float()`) waits for the
held step, so the loop never gets that far: the hold gives up after `TIMEOUT`
seconds and the test fails saying how far the loop got. Nothing depends on how
fast the device or the host is.

The bars draw only at their first and their last step (they are on a terminal,
with a redraw interval of an hour), outside the held steps: a bar reads the
values it shows when it draws.

On CPU, JAX runs a computation that contains a host callback synchronously, in
the calling thread, unless something it waits for is still being computed
(then it is queued and runs on a thread of the CPU client). So that the held
step is queued, `Gate` first pauses the device: it queues callback-free matrix
products, then a computation whose host callback waits; the held step is
dispatched behind it, and the pause ends once it is.
"""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.experimental import io_callback

import ciclo
from ciclo._src.logs import logs as logs_module

GATED = 2  # the held step: after the bars' first draw, at step 0
# Steps the loop must run past the held one. Few: the CPU client makes a dispatch wait while
# too many computations are in flight (16 where this was written), and the loop queues about
# one per step.
AHEAD = 3
STEPS = 8
FEATURES = 16
TIMEOUT = 60.0  # seconds the device is held at most
INTERVAL = 3600.0  # the bars' redraw interval: they draw at their first and last step only


def busy(x: jax.Array) -> jax.Array:
    """Callback-free matrix products: the device runs them asynchronously, for a while."""
    for _ in range(8):
        x = jnp.tanh(x @ x)
    return x


class Gate:
    """Holds the device at step `GATED` of a loop until the loop has run `AHEAD` steps past it.

    `hold(step)` goes inside the jitted step, through `io_callback`, and its
    result into the step's outputs. The gate itself is a loop callback, called
    after each step: it pauses the device after step `GATED - 1`, ends the pause
    once step `GATED` is dispatched, and lets step `GATED` finish after step
    `GATED + ahead`.
    """

    def __init__(self, ahead: int = AHEAD) -> None:
        self.ahead = ahead
        self.loop_thread = threading.get_ident()
        self.last_step = -1  # the last step after which the loop called the gate
        self.paused = False  # whether the device was paused before step GATED was dispatched
        self.queued = False  # whether step GATED ran off the loop thread, so its dispatch had returned
        self.released = False  # whether step GATED was let through by the loop, not by the timeout
        self.reached: int | None = None  # the last step the loop ran while step GATED was held
        self._deadline = 0.0
        self._pausing = False
        self._ran_inline = False
        self._resume = threading.Event()
        self._release = threading.Event()
        self._work = jnp.eye(256, dtype=jnp.float32) * 0.5
        self._busy = jax.jit(busy)
        self._pause_device = jax.jit(
            lambda x: x[0, 0] + io_callback(self._wait, jax.ShapeDtypeStruct((), jnp.float32), x[0, 0])
        )
        # Compiled now, so that pausing dispatches without compiling.
        jax.block_until_ready(self._pause_device(self._busy(self._work)))

    def hold(self, step: Any) -> np.ndarray:
        """Host side of the step's callback: waits at step `GATED`, on a thread of the device."""
        if int(step) == GATED:
            # Run in the loop's thread, the step was not queued: waiting would wait for ourselves.
            self.queued = threading.get_ident() != self.loop_thread
            if self.queued:
                self.released = self._release.wait(self._remaining())
                if not self.released:
                    self.reached = self.last_step
        return np.zeros((), np.float32)

    def __call__(self, state: Any, batch: Any, elapsed: ciclo.types.Elapsed) -> None:
        step = elapsed.steps
        self.last_step = step
        if step == GATED - 1:
            self._pause()
        elif step == GATED:
            self._resume.set()  # step GATED is dispatched: the device may start it, and wait in `hold`
        elif step == GATED + self.ahead:
            self._release.set()

    def check(self) -> None:
        assert self.paused, "could not pause the device before the held step"
        assert self.queued, f"step {GATED} ran in the loop's thread: its dispatch did not return at once"
        assert self.released, (
            f"the loop waited for the device: while step {GATED} was held it reached step "
            f"{self.reached} in {TIMEOUT:.0f} s, and it should have run on to step {GATED + self.ahead} "
            "without waiting"
        )
        assert self.last_step == STEPS - 1

    def _remaining(self) -> float:
        return max(self._deadline - time.monotonic(), 0.0)

    def _wait(self, _: Any) -> np.ndarray:
        if self._pausing:
            if threading.get_ident() == self.loop_thread:
                self._ran_inline = True
            else:
                self._resume.wait(self._remaining())
        return np.zeros((), np.float32)

    def _pause(self) -> None:
        """Queues a computation that waits for `_resume`, so that what follows is queued behind it.

        It is queued only if the device is still busy with the products
        dispatched just before it; if the device was faster, its callback ran in
        this thread, at once, and the pause is tried again with more products.
        """
        self._deadline = time.monotonic() + TIMEOUT
        self._pausing = True
        for attempt in range(2, 10):  # 4 to 512 products
            self._ran_inline = False
            x = self._work
            for _ in range(2**attempt):
                x = self._busy(x)
            self._pause_device(x)
            if not self._ran_inline:
                self.paused = True
                return


class Screen(io.StringIO):
    """A terminal for the bars: there they draw at their first step, then at most once per interval."""

    def isatty(self) -> bool:
        return True


def step_batches() -> list[dict[str, np.ndarray]]:
    """One batch per step; each holds its step's number, which the step's callback reads."""
    return [
        {"step": np.int32(i), "x": np.full((4, FEATURES), 0.1 * (i + 1), np.float32)} for i in range(STEPS)
    ]


def make_train_step(gate: Gate) -> Any:
    @jax.jit
    def train_step(state: jax.Array, batch: dict[str, Any]) -> tuple[ciclo.types.Logs, jax.Array]:
        held = io_callback(gate.hold, jax.ShapeDtypeStruct((), jnp.float32), batch["step"])
        out = jnp.tanh(batch["x"] @ state) + held  # the step's outputs wait for the callback
        logs = ciclo.logs().add_loss("loss", jnp.mean(out**2)).add_metric("norm", jnp.abs(out).max())
        return logs, state + 1e-3 * out.mean()

    return train_step


@pytest.mark.parametrize("bar", [ciclo.keras_bar, ciclo.tqdm_bar])
def test_loop_with_jitted_step_and_bar_runs_ahead_of_the_device(bar: Any) -> None:
    gate = Gate()
    train_step = make_train_step(gate)
    state = jnp.eye(FEATURES) * 0.5
    data = step_batches()
    jax.block_until_ready(train_step(state, data[0]))  # compiled outside the loop
    screen = Screen()
    state, history, _ = ciclo.loop(
        state,
        data,
        {ciclo.every(1): [train_step, bar(total=STEPS, interval=INTERVAL, file=screen), gate]},
    )
    gate.check()
    assert len(history.collect("loss")) == STEPS
    assert "loss" in screen.getvalue()


def test_history_starts_copying_rows_the_device_is_still_computing_and_never_waits_for_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Rows age past the lag within the held steps: the history starts copying the held step's
    # row while it is held (after step GATED + 3, with a lag of 2 rows), and must take that copy
    # only once it is done. Its first copies start once the held step is queued (after step
    # GATED + 1), so that they do not change how the device runs it. Each window of copies is a
    # computation in flight too: the loop runs one step past the window, no more (see AHEAD).
    monkeypatch.setattr(logs_module, "_LAG", 2)
    ahead = 4
    gate = Gate(ahead)
    train_step = make_train_step(gate)
    state = jnp.eye(FEATURES) * 0.5
    data = step_batches()
    jax.block_until_ready(train_step(state, data[0]))  # compiled outside the loop
    seen: dict[int, tuple[int, int]] = {}  # step -> (rows whose copies started, rows on the host)

    def watch(elapsed: ciclo.types.Elapsed, loop_state: ciclo.types.LoopState[Any]) -> None:
        history = loop_state.history
        seen[elapsed.steps] = (len(history) - len(history._pending), history.on_host)

    bar = ciclo.keras_bar(total=STEPS, interval=INTERVAL, file=Screen())
    state, history, _ = ciclo.loop(state, data, {ciclo.every(1): [train_step, bar, gate, watch]})
    gate.check()
    started, on_host = seen[GATED + ahead]
    assert started > GATED, "the held step's row was not being copied while it was held"
    assert on_host <= GATED, "a row of the held step was taken before the device computed it"
    assert len(history.collect("loss")) == STEPS and history.on_host == STEPS


class GatedModel:
    """A plain-JAX model adapter whose `apply` holds the device at step `GATED`."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def init(self, key: jax.Array, inputs: Any) -> tuple[Any, Any]:
        return jnp.eye(FEATURES) * 0.5, None

    def apply(
        self, params: Any, model_state: Any, inputs: Any, *, key: Any, training: bool
    ) -> tuple[Any, Any]:
        # Every input of step i is i: the callback reads the step's number from them.
        held = io_callback(self.gate.hold, jax.ShapeDtypeStruct((), jnp.float32), inputs[0, 0])
        return jnp.tanh(inputs @ params) + held, model_state


@pytest.mark.parametrize("strategy", ["jit", "data_parallel"])
def test_train_loop_with_a_managed_model_state_runs_ahead_of_the_device(strategy: str) -> None:
    if strategy == "data_parallel" and jax.default_backend() == "cpu" and jax.device_count() > 1:
        # Not ciclo's doing: XLA:CPU dispatches a computation over several devices only once the
        # previous one has finished, so no loop runs two such steps ahead of the devices.
        pytest.skip("XLA:CPU runs multi-device steps one at a time")
    gate = Gate()
    state = ciclo.create_model_state(
        GatedModel(gate),
        inputs=jnp.zeros((4, FEATURES)),
        tx=optax.sgd(1e-3),
        losses={"loss": lambda preds: jnp.mean(preds**2)},
        metrics={"norm": lambda preds: jnp.abs(preds).max()},
        strategy=strategy,
    )
    data = [np.full((4, FEATURES), float(i), np.float32) for i in range(STEPS)]
    jax.block_until_ready(state.train_step(data[0]))  # compiled outside the loop
    screen = Screen()
    bar = ciclo.keras_bar(total=STEPS, interval=INTERVAL, file=screen)
    # on_train_batch_end runs after the step, in the order registered.
    state, history, _ = ciclo.train_loop(state, data, {ciclo.on_train_batch_end: [bar, gate]})
    gate.check()
    assert len(history.collect("loss")) == STEPS
    assert "loss" in screen.getvalue()
