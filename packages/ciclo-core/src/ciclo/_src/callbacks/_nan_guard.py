"""A NaN guard: stop the loop soon after a monitored value turns NaN or infinite, with no per-step sync."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Generic, final

import jax
import jax.numpy as jnp
import numpy as np

from ciclo._src.base.checks import check_int
from ciclo._src.base.reprs import short
from ciclo._src.base.types import S
from ciclo._src.engine.callback import Callback
from ciclo._src.engine.loop_state import LoopState
from ciclo._src.logs.logs import Logs
from ciclo._src.logs.monitor import present_keys

_log = logging.getLogger("ciclo")


@jax.jit
def _first_bad(first: jax.Array, step: jax.Array, value: jax.Array) -> jax.Array:
    """`step` if `value` has a non-finite element and no earlier step did, else `first` (-1: none)."""
    bad = jnp.logical_not(jnp.all(jnp.isfinite(value)))
    return jnp.where((first < 0) & bad, step, first)


@final
class TerminateOnNaN(Callback, Generic[S]):
    """Stops a loop within `check_every` steps of a monitored value turning non-finite: `terminate_on_nan`."""

    hook: ClassVar[str | None] = "on_train_batch_end"

    def __init__(self, monitor: str | Sequence[str], check_every: int) -> None:
        names = (monitor,) if isinstance(monitor, str) else tuple(monitor)
        if not names or not all(isinstance(name, str) and name for name in names):
            raise TypeError(f"monitor must be an entry name or a list of them, got {short(monitor)}")
        check_int(check_every, "check_every", 1)
        self.monitor = names
        self.check_every = check_every
        self.step: int | None = None
        """The step whose logs first held a non-finite value (None while all are finite)."""
        self.entry: str | None = None
        """The monitored entry that was non-finite there."""
        self._paths: dict[str, tuple[str, str]] = {}
        self._pending: dict[str, jax.Array] = {}  # per entry: the first bad step on the device, or -1
        self._calls = 0
        self._seen = False

    def _value(self, logs: Mapping[str, Mapping[str, Any]], name: str) -> Any:
        path = self._paths.get(name)
        if path is None:
            found = (logs if isinstance(logs, Logs) else Logs(logs)).entry_path(name)
            if found is None:
                return None
            path = self._paths[name] = found
        entries = logs.get(path[0])
        return None if entries is None else entries.get(path[1])

    def _found(self, step: int, name: str) -> None:
        if self.step is None or step < self.step:
            self.step, self.entry = step, name

    def _read_pending(self) -> None:
        """Copies the device flags to the host: the one sync."""
        for name, first in self._pending.items():
            step = int(first)
            if step >= 0:
                self._found(step, name)
        self._pending = {}

    def __loop_callback__(self, loop_state: LoopState[S], /) -> None:
        logs = loop_state.step_logs  # read only: the loop's own logs need no copy
        step = int(loop_state.elapsed.steps)
        for name in self.monitor if logs else ():
            value = self._value(logs, name)
            if value is None:
                continue
            self._seen = True
            if isinstance(value, jax.Array):
                first = self._pending.get(name)
                self._pending[name] = _first_bad(
                    jnp.int32(-1) if first is None else first, jnp.int32(step), value
                )
            elif not np.all(np.isfinite(np.asarray(value, dtype=np.float64))):
                self._found(step, name)  # a host value: checked at once, for free
        self._calls += 1
        if self._calls % self.check_every == 0:
            if not self._seen:
                raise KeyError(
                    f"terminate_on_nan monitors {list(self.monitor)}, none of which was logged in "
                    f"{self._calls} steps; present now: {present_keys(logs)}"
                )
            self._read_pending()
        if self.step is not None:
            _log.warning(
                "terminate_on_nan: %r is NaN or infinite at step %d; stopping the loop at step %d",
                self.entry,
                self.step,
                step,
            )
            loop_state.stop()

    def on_end(self, loop_state: LoopState[S], error: BaseException | None, /) -> None:
        """Reports a NaN the last steps left on the device."""
        if self._pending and self.step is None:
            self._read_pending()
            if self.step is not None:
                _log.warning(
                    "terminate_on_nan: %r is NaN or infinite at step %d (found as the loop ended)",
                    self.entry,
                    self.step,
                )

    def __repr__(self) -> str:
        return f"TerminateOnNaN(monitor={list(self.monitor)!r}, check_every={self.check_every!r})"


def terminate_on_nan(monitor: str | Sequence[str] = "loss", *, check_every: int = 10) -> TerminateOnNaN[Any]:
    """Stops the loop soon after a monitored entry turns NaN or infinite, without a per-step sync.

    Each step folds "is every monitored value finite?" into a flag on the
    device, read every `check_every` steps (host values are checked at once).
    Its warning, and its attributes `step` and `entry`, name the step and the
    entry. Put it after the step, or in `train_loop(callbacks=[...])`.

    Args:
        monitor: an entry name (`"loss"`, `"losses.loss"`) or a list of them.
        check_every: steps between two reads of the flag: the most the loop runs
            on after a NaN.

    Example:
        >>> import ciclo
        >>> import jax.numpy as jnp
        >>> def train_step(state, batch):
        ...     loss = jnp.float32(1.0) / (5 - batch)  # infinite at step 5
        ...     return ciclo.logs().add_loss("loss", loss), state + 1
        >>> guard = ciclo.terminate_on_nan("loss", check_every=4)
        >>> state, _, elapsed = ciclo.loop(0, range(100), {ciclo.every(1): [train_step, guard]})
        >>> guard.step, guard.entry, elapsed.steps
        (5, 'loss', 8)
    """
    return TerminateOnNaN(monitor, check_every)
