"""`ciclo.follow_checkpoints`: each checkpoint of a directory once, in step order, as a run writes them."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Iterator
from typing import TypeVar, Unpack

import ciclo._src.callbacks._checkpoint as checkpoints
from ciclo._src.base.files import check_closed
from ciclo._src.base.reprs import short
from ciclo._src.resume.orbax_io import epath

T = TypeVar("T")

_NAME = re.compile(r"[A-Za-z0-9_-]+")
_log = logging.getLogger("ciclo")


def follow_checkpoints(
    directory: str | os.PathLike[str],
    target: T,
    *,
    poll: float = 1.0,
    timeout: float | None = None,
    name: str = "default",
    **options: Unpack[checkpoints.RestoreOptions],
) -> Iterator[tuple[int, T]]:
    """Yields `(step, state)` for each checkpoint of `directory` once, in step order, as it appears.

    Each state is restored as `ciclo.restore_checkpoint(directory, target,
    step=step, **options)` does. Only complete checkpoints are seen (orbax's
    list of steps). A step counts as done once the loop body is finished with it
    (the next step is asked for): the file `ciclo_follow_<name>.json` in
    `directory` keeps the last step done, so a follower killed and started
    again goes on with the first step it had not finished. It ends once the
    run wrote its final checkpoint (a loop with `ciclo.checkpoint` that ended
    by itself marks it) and every step is done, or after `timeout` seconds
    with no new checkpoint. See docs/resume.md, "Evaluation that follows the
    checkpoints".

    Args:
        directory: the directory of a `ciclo.checkpoint`.
        target: a pytree like the saved state: the result's structure, shapes,
            dtypes and shardings.
        poll: seconds between two looks at the directory.
        timeout: seconds to wait for a new checkpoint before ending; None: until
            the run's final checkpoint.
        name: this follower's progress (letters, digits, `_`, `-`): followers
            of one directory with other names keep their own.
        **options: `partial`, `params_from`: see `ciclo.types.RestoreOptions`.

    Raises:
        ValueError: for an invalid `poll`, `timeout` or `name`, or an
            unreadable progress file; and what `ciclo.restore_checkpoint` raises.

    Example:
        >>> import tempfile
        >>> import ciclo
        >>> import jax.numpy as jnp
        >>> def train_step(state, batch):
        ...     return None, {"w": state["w"] + batch}
        >>> directory = tempfile.mkdtemp()
        >>> _ = ciclo.train_loop(
        ...     {"w": jnp.float32(0)},
        ...     range(6),
        ...     {ciclo.on_train_step: [train_step]},
        ...     callbacks=[ciclo.checkpoint(directory, keep=None)],
        ...     epoch_duration=2,
        ... )
        >>> for step, state in ciclo.follow_checkpoints(directory, {"w": jnp.float32(0)}):
        ...     print(step, state["w"])
        2 1.0
        4 6.0
        6 15.0
    """
    path = checkpoints._absolute_directory(directory)
    if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not poll > 0:
        raise ValueError(f"poll must be a number of seconds > 0, got {short(poll)}")
    wait = math.inf if timeout is None else timeout
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not wait >= 0:
        raise ValueError(f"timeout must be None or a number of seconds >= 0, got {short(timeout)}")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"name must be letters, digits, '_' or '-' (a file's name), got {short(name)}")
    if "step" in options:
        raise TypeError("follow_checkpoints restores every step in turn: pass no step= (partial= may be)")
    check_closed(path, "the checkpoint directory")  # the files read below are no links
    progress = epath(os.path.join(path, f"ciclo_follow_{name}.json"))
    try:
        done = json.loads(progress.read_text())["done"] if progress.exists() else None
        if isinstance(done, bool) or not isinstance(done, int | None):
            raise TypeError(f"done is {short(done)}")
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(
            f"cannot read the progress file {progress}: {error}; delete it to evaluate every checkpoint again"
        ) from error
    settings, since = epath(path) / checkpoints.SETTINGS_FILE, time.monotonic()
    manager = checkpoints._open_manager(
        path, keep=None, monitor=None, mode="min", async_save=False, create=False
    )
    with contextlib.closing(manager):
        while True:
            # Read before the steps: a mark the run wrote after its last save covers every step listed.
            final = settings.exists() and "final" in json.loads(settings.read_text())
            manager.reload()
            new = sorted(int(s) for s in manager.all_steps() if done is None or int(s) > done)
            for step in new:
                try:
                    options["step"] = step
                    state = checkpoints.restore_checkpoint(path, target, **options)
                except FileNotFoundError:  # deleted by the run's `keep` meanwhile, or a cut save (empty)
                    _log.warning("skipping the checkpoint of step %d in %s: deleted, or empty", step, path)
                    done = step  # not listed again; the file records only steps evaluated
                    continue
                yield step, state
                done = step  # the loop body is done with it: it asked for the next
                checkpoints._write_json(str(progress), {"done": step})
            if new:
                since = time.monotonic()
            elif final or time.monotonic() - since >= wait:
                return
            else:
                time.sleep(poll)
