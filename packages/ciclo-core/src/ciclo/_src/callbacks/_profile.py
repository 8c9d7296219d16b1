"""Profiling: a `jax.profiler` trace of chosen steps of a loop."""

from __future__ import annotations

import os
from typing import Any, ClassVar, Literal, final

import jax

from ciclo._src.base.batches import steps_of
from ciclo._src.base.checks import check_int, check_path
from ciclo._src.base.reprs import short
from ciclo._src.engine.callback import Callback
from ciclo._src.engine.loop_state import LoopState

STEP_ANNOTATION = "step"
"""The name of the step markers in the trace (`jax.profiler.StepTraceAnnotation`)."""

_Status = Literal["waiting", "tracing", "done"]


@final
class Profile(Callback):
    """Captures a `jax.profiler` trace of chosen steps of a loop; see `ciclo.profile`."""

    hook: ClassVar[str | None] = "on_train_batch_begin"

    def __init__(
        self, logdir: str | os.PathLike[str], steps: int | tuple[int, int], *, perfetto: bool = False
    ) -> None:
        self.logdir = check_path(logdir, "logdir")
        """The directory the trace is written under (in `plugins/profile/<run>/`)."""
        first, last = steps if isinstance(steps, tuple) and len(steps) == 2 else (steps, steps)
        for value in (first, last):
            check_int(
                value, "a step to profile", 0, f" (steps= is a step or a (first, last) pair: {short(steps)})"
            )
        if last < first:
            raise ValueError(f"steps must be (first, last) with first <= last, got {short(steps)}")
        self.steps = (first, last)
        """The first and last step profiled (both included)."""
        self._perfetto = bool(perfetto)
        self.status: _Status = "waiting"
        """`"waiting"` for the first step, `"tracing"`, or `"done"` (the trace is written)."""
        self._annotation: Any = None  # the open marker of the step being traced

    def __loop_callback__(self, loop_state: LoopState[Any]) -> None:
        steps, (first, last) = loop_state.elapsed.steps, self.steps
        # A `ciclo.stacked` group of steps is traced whole if it reaches into the window.
        if self.status == "waiting" and first < steps + steps_of(loop_state.batch) and steps <= last:
            jax.profiler.start_trace(self.logdir, create_perfetto_trace=self._perfetto)
            self.status = "tracing"
        if self.status == "tracing":
            self._annotation = jax.profiler.StepTraceAnnotation(STEP_ANNOTATION, step_num=steps)
            self._annotation.__enter__()

    def on_step_end(self, loop_state: LoopState[Any], /) -> None:
        self._end_step(loop_state, stop=loop_state.elapsed.steps > self.steps[1])

    def on_end(self, loop_state: LoopState[Any], error: BaseException | None) -> None:
        # Ended inside the window (the data ran out, `stop`, an error): the steps that ran are traced.
        self._end_step(loop_state, stop=True)

    def _end_step(self, loop_state: LoopState[Any], *, stop: bool) -> None:
        if self.status != "tracing":
            return
        annotation, self._annotation = self._annotation, None
        if annotation is not None:
            annotation.__exit__(None, None, None)
        if stop:
            self.status = "done"
            try:
                # The device may still be running the profiled steps, which the trace must contain.
                jax.block_until_ready(loop_state.state)  # type: ignore[no-untyped-call]
            finally:
                jax.profiler.stop_trace()  # type: ignore[no-untyped-call]

    def __repr__(self) -> str:
        return f"ciclo.profile({self.logdir!r}, steps={self.steps!r})"


def profile(
    logdir: str | os.PathLike[str], steps: int | tuple[int, int], *, perfetto: bool = False
) -> Profile:
    """Creates a callback that captures a `jax.profiler` trace of the chosen steps.

    The trace, with a `jax.profiler.StepTraceAnnotation` named `"step"` per
    step, is written under `logdir/plugins/profile/<date>/<host>.xplane.pb`
    once the last step has finished on the device (the one time it waits).
    Steps are numbered from 0 as `elapsed.steps` counts them: skip the first
    ones, which compile. In `ciclo.loop`, list it *before* the step. See
    docs/logging.md, "Profiling".

    Args:
        logdir: the directory to write the trace under (a TensorBoard log directory).
        steps: the step to profile, or `(first, last)`, both included.
        perfetto: also write `perfetto_trace.json.gz` for the Perfetto UI.

    Example:
        >>> import pathlib, tempfile
        >>> import jax.numpy as jnp
        >>> import ciclo
        >>> logdir = tempfile.mkdtemp()
        >>> profiler = ciclo.profile(logdir, steps=(2, 3))
        >>> def train_step(state, batch):
        ...     return None, state + batch
        >>> _ = ciclo.loop(jnp.float32(0.0), jnp.ones(5), {ciclo.every(1): [profiler, train_step]})
        >>> profiler.status, len(list(pathlib.Path(logdir).glob("plugins/profile/*/*.xplane.pb")))
        ('done', 1)
    """
    return Profile(logdir, steps, perfetto=perfetto)
