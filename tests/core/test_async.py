"""Nothing in the loop, History, the bars or the managed steps waits for the device at each step.

Each step here is slow on purpose (chained matmuls), so dispatching steps is far
faster than running them, and a probe after the bar checks at each step that the
loop is running ahead of the device: that the previous step's state is still
being computed, at every step but around those the bar draws (it shows step 1 at
once on a terminal, both bars redraw at most 10 times a second, and in a log
keras_bar prints a line every 10%).
"""

from __future__ import annotations

import io
from typing import Any

import jax
import jax.numpy as jnp
import optax
import pytest

import ciclo

SIZE, DEPTH, STEPS = 384, 12, 30


def heavy(w: jax.Array, x: jax.Array) -> jax.Array:
    for _ in range(DEPTH):
        x = jnp.tanh(x @ w)
    return x


@jax.jit
def train_step(state: jax.Array, batch: jax.Array) -> tuple[ciclo.Logs, jax.Array]:
    out = heavy(state, batch)
    logs = ciclo.logs().add_loss("loss", jnp.mean(out**2)).add_metric("norm", jnp.abs(out).max())
    return logs, state + 1e-6 * out.mean()


class Probe:
    """At each step: was the *previous* step's state computed, and did the bar draw?

    With nothing waiting for the device, the loop dispatches steps far faster
    than the device runs them, so at step k the state of step k - 1 is still in
    flight. A wait anywhere in a step (a logged value read, the history's commit,
    a bar's draw) makes that step's state ready before the next step begins.
    """

    def __init__(self, screen: io.StringIO) -> None:
        self.screen = screen
        self.ready: list[bool] = []
        self.drawn: list[bool] = []
        self._previous: Any = None
        self._written = 0

    def __call__(self, state: Any) -> None:
        newest = getattr(state, "params", state)  # a managed state's newest update
        if self._previous is not None:
            self.ready.append(all(leaf.is_ready() for leaf in jax.tree.leaves(self._previous)))
        self._previous = newest
        written = len(self.screen.getvalue())
        self.drawn.append(written > self._written)
        self._written = written

    def check(self) -> None:
        assert len(self.ready) == STEPS - 1
        # A bar draw at step k waits for state k, and so for state k - 1, which the probe of step k
        # checks: only states the bar showed, or that precede one it showed, may be ready.
        shown = [now or after for now, after in zip(self.drawn, self.drawn[1:], strict=False)]
        waited = [
            step for step, (ready, ok) in enumerate(zip(self.ready, shown, strict=True)) if ready and not ok
        ]
        assert waited == [], (self.ready, self.drawn)
        assert self.ready.count(False) >= STEPS // 4  # the loop did run ahead


def batches() -> list[jax.Array]:
    return [jnp.full((SIZE, SIZE), 0.01 * (i + 1)) for i in range(STEPS)]


@pytest.mark.parametrize("bar", [ciclo.keras_bar, ciclo.tqdm_bar])
def test_loop_with_jitted_step_and_bar_runs_ahead_of_the_device(bar: Any) -> None:
    state = jnp.eye(SIZE) * 0.5
    data = batches()
    jax.block_until_ready(train_step(state, data[0]))  # compile outside the loop
    probe = Probe(io.StringIO())
    state, history, _ = ciclo.loop(
        state,
        data,
        {ciclo.every(1): [train_step, bar(total=STEPS, file=probe.screen), probe]},
    )
    probe.check()
    assert len(history.collect("loss")) == STEPS


@pytest.mark.parametrize("strategy", ["jit", "data_parallel"])
def test_train_loop_with_a_managed_model_state_runs_ahead_of_the_device(strategy: str) -> None:
    class Heavy:
        def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Any, Any]:
            return jnp.eye(SIZE) * 0.5, None

        def apply(self, params, model_state, inputs, *, key, training):
            return heavy(params, inputs), model_state

    state = ciclo.create_model_state(
        Heavy(),
        inputs=jnp.zeros((SIZE, SIZE)),
        tx=optax.sgd(1e-6),
        losses={"loss": lambda preds: jnp.mean(preds**2)},
        metrics={"norm": lambda preds: jnp.abs(preds).max()},
        strategy=strategy,
    )
    data = batches()
    jax.block_until_ready(state.train_step(data[0]))  # compile outside the loop
    probe = Probe(io.StringIO())
    bar = ciclo.keras_bar(total=STEPS, file=probe.screen)
    # The probe runs after the bar: on_train_batch_end, registered last.
    state, history, _ = ciclo.train_loop(state, data, {ciclo.on_train_batch_end: [bar, probe]})
    probe.check()
    assert len(history.collect("loss")) == STEPS
