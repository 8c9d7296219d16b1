"""`ciclo.wandb_logger`: logs to a Weights & Biases run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, final

from ciclo._src.callbacks._loggers._base import Logger, Row, import_extra


@final
class WandbSink:
    """Logs rows to a W&B run, one `run.log(scalars, step=step)` per row; see `ciclo.wandb_logger`."""

    def __init__(self, run: Any, init_kwargs: Mapping[str, Any]) -> None:
        self._wandb = import_extra("wandb", "wandb", "ciclo.wandb_logger")
        self._run = run
        self._owned = run is None  # a run the sink started: it finishes it when closed
        self._run_id: str | None = None if run is None else run.id
        self._init_kwargs = dict(init_kwargs)

    @property
    def run(self) -> Any:
        """The `wandb` run written to; started (or resumed) on the first write."""
        if self._run is None:
            kwargs = dict(self._init_kwargs)
            if self._run_id is not None:
                kwargs.update(id=self._run_id, resume="allow")
            self._run = self._wandb.init(**kwargs)
            self._run_id = self._run.id
        return self._run

    def write(self, rows: Sequence[Row]) -> None:
        """Logs each row at its step (W&B keeps the steps of a run increasing)."""
        log = self.run.log
        for row in rows:
            log(dict(row.scalars), step=row.step, commit=True)

    def flush(self) -> None:
        """Nothing to do: W&B's own process sends what `run.log` was given."""

    def close(self) -> None:
        """Finishes the run the logger started (a run passed to `wandb_logger` is left running)."""
        if self._run is not None and self._owned:
            self._run.finish()
            self._run = None

    def state(self) -> dict[str, Any]:
        """The run id, so that a resumed logger resumes the same run."""
        return {"run_id": self._run_id}

    def restore(self, state: Mapping[str, Any], after_step: int | None) -> None:
        """Resumes the run `state["run_id"]` on the next write (W&B ignores steps it already has)."""
        run_id = state.get("run_id")
        if run_id is not None and self._run is None:
            self._run_id = str(run_id)

    def __repr__(self) -> str:
        return f"WandbSink(run_id={self._run_id!r})"


def wandb_logger(run: Any = None, **init_kwargs: Any) -> Logger:
    """A logger that writes every scalar entry to a Weights & Biases run, at its step.

    Needs wandb (`pip install "ciclo-core[wandb]"`). With no `run`, the logger
    starts one with `wandb.init(**init_kwargs)` on its first write and
    finishes it when the loop ends; a logger restored with
    `load_state_dict` resumes the same run (`wandb.init(id=...,
    resume="allow")`). A `run` you started yourself is written to and left
    running. W&B's own settings apply: `WANDB_MODE=offline` writes the run to
    `WANDB_DIR` without a network, for `wandb sync` later.

    Args:
        run: a run from `wandb.init(...)` to log into, or None to start one.
        **init_kwargs: arguments of `wandb.init` (`project`, `name`, `config`,
            `dir`, `mode`, ...), when `run` is None.

    Returns:
        A `Logger` (see `Logger`).

    Raises:
        ImportError: if wandb is not installed.
        TypeError: if both `run` and `init_kwargs` are given.
    """
    if run is not None and init_kwargs:
        raise TypeError("wandb_logger takes a run or wandb.init arguments, not both")
    return Logger(WandbSink(run, init_kwargs))
