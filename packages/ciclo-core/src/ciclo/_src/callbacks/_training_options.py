"""What `train_loop` watches of a managed state's training options, with no device sync per step.

Under loss scaling, and with a `SpikeGuard(max_consecutive=N)`, every `CHECK_EVERY` steps it reads the
copy of the counts of steps skipped in a row that it started at the check before, so the loop seldom waits.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, ClassVar, Final, final

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ciclo._src.base.batches import steps_of
from ciclo._src.base.checks import check_int
from ciclo._src.base.elapsed import only_steps
from ciclo._src.base.reprs import short
from ciclo._src.callbacks._ema import managed_part
from ciclo._src.engine.callback import Callback
from ciclo._src.engine.loop_state import LoopState
from ciclo._src.state.population import Population
from ciclo._src.state.precision import MIN_SCALE
from ciclo._src.state.training_options import SpikeGuard, spike_stats

_log = logging.getLogger("ciclo")

SKIPPED_STEPS_WARNING: Final = 20
"""Steps skipped in a row under loss scaling after which `train_loop` warns that training is stuck."""

CHECK_EVERY: Final = 10
"""Training steps between two looks at the count of steps skipped in a row."""


@functools.partial(jax.jit, static_argnums=0)
def _stack(rows: int, *parts: jax.Array) -> jax.Array:
    """One row of the parts per member (one row for one model)."""
    return jnp.concatenate([part.reshape(rows, -1).astype(jnp.float32) for part in parts], axis=1)


def _first_copy(array: Any) -> jax.Array:
    """This process's first copy of a replicated array (several processes, `pmap`'s device axis)."""
    return array.addressable_shards[0].data if isinstance(array, jax.Array) else jnp.asarray(array)


def _mini_step(state: Any) -> int:
    """The micro-batches `optax.MultiSteps` has accumulated towards its next update (a host read)."""
    managed = managed_part(state)
    assert managed is not None
    mini_step = _first_copy(optax.tree_utils.tree_get(managed.opt_state, "mini_step"))
    return int(np.asarray(mini_step).reshape(-1)[0])


def watch_training_options(state: Any, max_skipped_steps: int | None) -> list[Callback]:
    """The watch a managed state (or population) under loss scaling, accumulation or a spike limit needs."""
    managed = managed_part(state)
    scaling = managed is not None and managed.loss_scale is not None
    if max_skipped_steps is not None:
        check_int(max_skipped_steps, "max_skipped_steps", 1, " or None")
        if not scaling:
            raise ValueError(
                f"max_skipped_steps={short(max_skipped_steps)} counts the steps a loss scale skips, and "
                "this state has none: it applies to a managed state created with precision='16-mixed'"
            )
    if managed is None:
        return []
    stats = spike_stats(managed.opt_state)
    spikes = None if stats is None or stats.guard.max_consecutive is None else stats.guard
    if not (scaling or spikes or managed.options.accumulate_steps > 1):
        return []
    return [
        TrainingOptionsWatch(
            loss_scaling=scaling,
            accumulate_steps=managed.options.accumulate_steps,
            max_skipped_steps=max_skipped_steps,
            spikes=spikes,
        )
    ]


@final
class TrainingOptionsWatch(Callback):
    """Warns of a stuck float16 run and of micro-batches left unapplied, stops a run past a spike limit."""

    hook: ClassVar[str | None] = "on_train_batch_end"

    def __init__(
        self,
        *,
        loss_scaling: bool,
        accumulate_steps: int,
        max_skipped_steps: int | None,
        spikes: SpikeGuard | None,
    ) -> None:
        self.loss_scaling = loss_scaling
        self.accumulate_steps = accumulate_steps
        self.max_skipped_steps = max_skipped_steps
        self.spikes = spikes  # a guard with a max_consecutive
        self._countdown = CHECK_EVERY
        self._pending: tuple[int, jax.Array] | None = None  # (steps, `_stall`'s copy) on its way
        self._warned = False  # about the stall in progress
        self._announced: int | None = None  # the unapplied micro-batches said before the first step

    def on_start(self, loop_state: LoopState[Any], /) -> None:
        """Before the first step (after a resume): the micro-batches the run's `stop` will leave unapplied."""
        stop = loop_state.stop_at
        stop_steps = None if stop is None else only_steps(stop)  # the loop's stop, if a number of steps
        if self.accumulate_steps == 1 or stop_steps is None:
            return
        remaining = stop_steps - loop_state.elapsed.steps
        left = (_mini_step(loop_state.state) + remaining) % self.accumulate_steps
        if remaining > 0 and left:
            self._announced = left
            self._warn_unapplied(left, f"will end at stop={stop_steps} steps", "will not be")

    def __loop_callback__(self, loop_state: LoopState[Any], /) -> None:
        """Every `CHECK_EVERY` steps: judges the copy started before, starts the next."""
        if not (self.loss_scaling or self.spikes):
            return
        self._countdown -= steps_of(loop_state.batch)
        if self._countdown > 0:
            return
        self._countdown = CHECK_EVERY
        pending, self._pending = self._pending, None
        if pending is not None:
            self._judge(pending[0], np.asarray(pending[1]), loop_state)
        if not loop_state.stop_iteration:
            copy = self._stall(loop_state.state)
            copy.copy_to_host_async()
            self._pending = (loop_state.elapsed.steps + steps_of(loop_state.batch), copy)

    def on_end(self, loop_state: LoopState[Any], error: BaseException | None, /) -> None:
        """The loop ended by itself: a stall not yet reported, and the micro-batches left unapplied."""
        if error is not None:
            return
        state, steps = loop_state.state, loop_state.elapsed.steps
        if self.spikes or (self.loss_scaling and not self._warned):
            self._judge(steps, np.asarray(self._stall(state)), None)
        if self.accumulate_steps > 1:
            left = _mini_step(state)
            if left and left != self._announced:
                self._warn_unapplied(left, f"ended after {steps} steps", "were not")

    def _stall(self, state: Any) -> jax.Array:
        """Per member: the loss scale's `[scale, in a row]`, the guard's `[in a row, values, thresholds]`."""
        managed = managed_part(state)
        assert managed is not None
        scale, stats = managed.loss_scale, spike_stats(managed.opt_state)
        parts = [] if scale is None else [scale.scale, scale.skipped_in_a_row]
        parts += [stats.skipped_in_a_row, stats.judged] if self.spikes and stats is not None else []
        if isinstance(state, Population):  # sharded over the members, not replicated
            return _stack(state.size, *parts)  # type: ignore[no-any-return]
        stall: jax.Array = _stack(1, *map(_first_copy, parts))  # a fresh array: the state's are donated
        return stall

    def _judge(self, steps: int, rows: np.ndarray[Any, Any], loop_state: LoopState[Any] | None) -> None:
        """Raises past the guard's limit; warns of a stall (once per stall), stops past max_skipped_steps.

        Of a population, the member with the most steps skipped in a row is judged.
        """
        if self.spikes is not None:
            member = int(np.argmax(rows[:, 2 * self.loss_scaling]))
            self._check_spikes(steps, self.spikes, rows[member, 2 * self.loss_scaling :], _of(rows, member))
        if not self.loss_scaling:
            return
        member = int(np.argmax(rows[:, 1]))
        scale, in_a_row = float(rows[member, 0]), int(rows[member, 1])
        if in_a_row == 0:
            self._warned = False
            return
        limit = self.max_skipped_steps
        stopping = loop_state is not None and limit is not None and in_a_row >= limit
        if not stopping and (self._warned or (in_a_row < SKIPPED_STEPS_WARNING and scale > MIN_SCALE)):
            return
        self._warned = True
        _log.warning(
            "train_loop: the last %d steps%s up to step %d were all skipped, and the loss scale is down to "
            "%g%s: their float16 gradients were not finite at any scale tried, so the parameters have not "
            "changed since. "
            "Likely cause: the loss or its gradients overflow float16 even unscaled (inputs that are not "
            "normalised, a learning rate too high, a loss that diverged) or the data holds NaN or inf; check "
            "them, or train with precision='bf16-mixed' or '32'.%s",
            in_a_row,
            _of(rows, member),
            steps,
            scale,
            " (its floor)" if scale <= MIN_SCALE else "",
            f" Stopping the loop: max_skipped_steps={limit}."
            if stopping
            else " train_loop(max_skipped_steps=N) stops such a run.",
        )
        if stopping:
            assert loop_state is not None
            loop_state.stop()

    @staticmethod
    def _check_spikes(steps: int, guard: SpikeGuard, values: np.ndarray[Any, Any], of: str) -> None:
        """Raises once the guard skipped `max_consecutive` optimizer steps in a row."""
        in_a_row, (judged, thresholds) = int(values[0]), values[1:].reshape(2, -1)
        limit = guard.max_consecutive
        if limit is None or in_a_row < limit:
            return
        spikes = "; ".join(
            f"{name} was {value:.6g}"
            + (f", above its threshold {threshold:.6g}" if np.isfinite(value) else ", not finite")
            for name, value, threshold in zip(guard.on, judged, thresholds, strict=True)
            if not value <= threshold
        )
        raise RuntimeError(
            f"train_loop: the spike guard skipped the last {in_a_row} optimizer steps{of} up to step "
            f"{steps}, max_consecutive={limit}; at the last, {spikes} (the mean of the last {guard.window} "
            f"accepted steps plus factor={guard.factor:g} standard deviations). The run has diverged "
            "or its data went bad: resume from a checkpoint before the spikes with a lower learning rate "
            "or other data, or give ciclo.SpikeGuard a higher factor= or max_consecutive="
        )

    def _warn_unapplied(self, left: int, when: str, applied: str) -> None:
        k = self.accumulate_steps
        _log.warning(
            "train_loop: the run %s, with %d micro-batch(es) accumulated after its last optimizer step of "
            "accumulate_steps=%d: their gradients %s applied to the parameters (they stay in the state's "
            "optimizer state, for a train_loop that goes on from it). Make the run's length a multiple of %d "
            "steps to train on every batch.",
            when,
            left,
            k,
            applied,
            k,
        )


def _of(rows: np.ndarray[Any, Any], member: int) -> str:
    """Names the member in a message about a population (of one model: nothing)."""
    return f" of member {member}" if len(rows) > 1 else ""
