"""A Keras-style progress bar, written by ciclo (no keras dependency)."""

from __future__ import annotations

import math
import sys
import typing
from typing import TextIO

from ciclo._src.base.checks import check_int
from ciclo._src.base.elapsed import PeriodLike
from ciclo._src.base.reprs import short
from ciclo._src.callbacks._progress import ProgressCallback

# Without a terminal: a line at each tenth of a known total, else at most every 30 seconds.
_LOG_LINES, _LOG_PERIOD = 10, 30.0


def is_notebook_stream(file: object) -> bool:
    """Whether `file` is a Jupyter kernel's output stream, rendering carriage returns as a terminal does."""
    out_stream = getattr(sys.modules.get("ipykernel.iostream"), "OutStream", None)
    if isinstance(out_stream, type) and isinstance(file, out_stream):
        return True
    if file is not sys.stdout and file is not sys.stderr:
        return False
    # Asked of IPython as tqdm and Keras do; never imported (a kernel has imported it).
    get_ipython = getattr(sys.modules.get("IPython"), "get_ipython", None)
    if not callable(get_ipython):
        return False
    try:
        shell = get_ipython()
        config = getattr(shell, "config", None) or {}
        return "IPKernelApp" in config or any(
            cls.__name__ == "ZMQInteractiveShell" for cls in type(shell).__mro__
        )
    except Exception:  # a stand-in IPython, or one half torn down
        return False


def format_duration(seconds: float) -> str:
    """Formats a duration like Keras: `42s`, `3:05` or `1:02:03`."""
    seconds = max(seconds, 0.0)
    if seconds >= 3600:
        return f"{int(seconds // 3600)}:{int(seconds % 3600 // 60):02d}:{int(seconds % 60):02d}"
    if seconds >= 60:
        return f"{int(seconds // 60)}:{int(seconds % 60):02d}"
    return f"{seconds:.0f}s"


def format_rate(seconds_per_unit: float, label: str) -> str:
    """Formats the time per unit like Keras: `2s/step`, `530ms/step`, `12us/sample`."""
    if seconds_per_unit >= 1 or seconds_per_unit == 0:
        return f"{seconds_per_unit:.0f}s/{label}"
    if seconds_per_unit >= 1e-3:
        return f"{seconds_per_unit * 1e3:.0f}ms/{label}"
    return f"{seconds_per_unit * 1e6:.0f}us/{label}"


@typing.final
class KerasBar(ProgressCallback):
    """A progress bar like Keras': `80/100 [=======>...] - ETA: 42s - loss: 1.5371`; see `ciclo.keras_bar`."""

    def __init__(
        self,
        total: PeriodLike | None = None,
        *,
        interval: float = 0.1,
        width: int = 30,
        file: TextIO | None = None,
    ) -> None:
        check_int(width, "width", 1)
        file = sys.stdout if file is None else file
        if not callable(getattr(file, "write", None)):
            raise TypeError(f"file must be a text stream with a write method, got {short(file)}")
        super().__init__(total, interval)
        if self.unit.total is not None and not self.unit.total > 0:
            raise ValueError(f"total must be > 0 (a bar full at once), got {short(total)}")
        self._width = width
        self._file = file
        try:  # redrawn in place? A stream without isatty, closed or detached is no terminal.
            self._terminal = bool(file.isatty()) or is_notebook_stream(file)
        except (AttributeError, OSError, ValueError):
            self._terminal = False
        self._drawn_width = 0

    def _schedule(self, now: float, count: float, first: bool) -> bool:
        if self._terminal:
            return super()._schedule(now, count, first)
        total = self.unit.total
        if total is None:
            self._next_time = now + _LOG_PERIOD
        else:
            self._next_time = math.inf
            self._next_count = min((count * _LOG_LINES // total + 1) * total / _LOG_LINES, total)
        return not first  # the first call only starts the bar's clock

    def _draw(self, now: float, count: float, steps: float, *, final: bool) -> None:
        total, field = self.unit.total, self.unit.field
        if total is None:
            parts = [f"{int(count):7d}/Unknown"]
        else:
            progress = min(count / total, 1.0) if total > 0 else 1.0
            filled = int(self._width * progress)
            bar = "=" * (filled - 1) + (">" if count < total else "=") if filled else ""
            parts = [
                f"{int(count):{len(str(int(total)))}d}/{int(total)} [{bar}{'.' * (self._width - filled)}]"
            ]
        # Per unit counted (per step for time bars), over the steps since the first call.
        start_time, start_steps = self._start or (now, steps)
        seconds = now - start_time
        per_unit = seconds / (steps - start_steps) if steps > start_steps else None
        if per_unit is not None and field == "samples":
            per_unit = per_unit * steps / count if count > 0 else None
        if final or total is None:
            label = "sample" if field == "samples" else "step"
            rate = "" if per_unit is None else " " + format_rate(per_unit, label)
            parts.append(f"{format_duration(seconds)}{rate}")
        else:
            per_count = 1.0 if field == "time" else per_unit  # a time bar's remaining count is its ETA
            if per_count is not None:
                parts.append(f"ETA: {format_duration((total - count) * per_count)}")
        parts.extend(f"{name}: {text}" for name, text in self._shown_values())
        line = " - ".join(parts)
        if self._terminal:
            # Padded so that a shorter line fully covers the longer one it overwrites.
            text = "\r" + line.ljust(self._drawn_width) + ("\n" if final else "")
            self._drawn_width = 0 if final else len(line)
        else:
            text = line + "\n"
        self._file.write(text)
        self._file.flush()


def keras_bar(
    total: PeriodLike | None = None, *, interval: float = 0.1, width: int = 30, file: TextIO | None = None
) -> KerasBar:
    """Creates a Keras-style progress bar callback.

    Shows the latest value of each scalar entry of `losses`, `metrics` and
    `stateful_metrics`; runs after the step, after each batch of the predefined
    loops, or by hand as `bar(elapsed, logs)`. On a terminal or in a notebook
    the line is redrawn in place; elsewhere a line is written at each tenth of
    the total (every 30 seconds if unknown). See docs/logging.md, "Notebooks".

    Args:
        total: where the bar is full (> 0): an int (steps), a `ciclo.types.Period`
            of steps, samples or time (the unit counted), or None if unknown.
        interval: on a terminal or in a notebook, the least seconds between redraws.
        width: the number of characters of the bar itself.
        file: where to write; `sys.stdout` (as it is when the bar is created) by default.

    Example:
        >>> import io
        >>> import ciclo
        >>> buffer = io.StringIO()
        >>> bar = ciclo.keras_bar(total=4, file=buffer)
        >>> for elapsed, batch in ciclo.elapse([0.4, 0.3, 0.2, 0.1]):
        ...     bar(elapsed, ciclo.logs().add_metric("loss", batch))
        >>> print(buffer.getvalue().splitlines()[-1])  # doctest: +ELLIPSIS
        4/4 [==============================] - 0s ...s/step - loss: 0.1000
    """
    return KerasBar(total, interval=interval, width=width, file=file)
