"""`ciclo.follow_checkpoints`: each checkpoint of a directory once, in step order, as a run writes them."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from typing import TypeVar, Unpack

import jax

from ciclo._src.base.files import check_closed, open_own, write_atomically
from ciclo._src.base.reprs import short
from ciclo._src.callbacks._checkpoint import (
    SETTINGS_FILE,
    RestoreOptions,
    _absolute_directory,
    _open_manager,
    restore_checkpoint,
)
from ciclo._src.resume.orbax_io import epath

T = TypeVar("T")

_NAME = re.compile(r"[A-Za-z0-9_-]+")
_log = logging.getLogger("ciclo")


def _read_done(path: str) -> int | None:
    """The last step the follower finished (its progress file), or None before any."""
    try:
        if "://" in path:
            text = epath(path).read_text()
        else:
            with open_own(path, "r") as file:  # never through a link
                text = file.read()
    except FileNotFoundError:
        return None
    try:
        done = json.loads(text)["done"]
        if isinstance(done, bool) or not isinstance(done, int):
            raise TypeError(f"done is {short(done)}")
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(
            f"cannot read the progress file {path}: {error}; delete it to evaluate every checkpoint again"
        ) from error
    return done


def follow_checkpoints(
    directory: str | os.PathLike[str],
    target: T,
    *,
    poll: float = 1.0,
    timeout: float | None = None,
    name: str = "default",
    **options: Unpack[RestoreOptions],
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
    path = _absolute_directory(directory)
    if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not poll > 0:
        raise ValueError(f"poll must be a number of seconds > 0, got {short(poll)}")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0
    ):
        raise ValueError(
            f"timeout must be a number of seconds >= 0, or None to wait for the run's final checkpoint, "
            f"got {short(timeout)}"
        )
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"name must be letters, digits, '_' or '-' (it names the file ciclo_follow_<name>.json in "
            f"{path}), got {short(name)}"
        )
    if "step" in options:
        raise TypeError("follow_checkpoints restores every step in turn: pass no step= (partial= may be)")
    check_closed(path, "the checkpoint directory")
    progress = os.path.join(path, f"ciclo_follow_{name}.json")
    done, since = _read_done(progress), time.monotonic()
    settings = epath(path) / SETTINGS_FILE
    with contextlib.closing(
        _open_manager(path, keep=None, monitor=None, mode="min", async_save=False, create=False)
    ) as manager:
        while True:
            # Read before the steps: a mark the run wrote after its last save covers every step listed.
            final = settings.exists() and "final" in json.loads(settings.read_text())
            manager.reload()
            new = sorted(int(s) for s in manager.all_steps() if done is None or int(s) > done)
            for step in new:
                try:
                    options["step"] = step
                    state = restore_checkpoint(path, target, **options)
                except FileNotFoundError:  # deleted by the run's `keep` meanwhile, or a cut save (empty)
                    _log.warning("skipping the checkpoint of step %d in %s: deleted, or empty", step, path)
                    done = step  # not listed again; the file records only steps evaluated
                    continue
                yield step, state
                done = step  # the loop body is done with it: it asked for the next
                if jax.process_index() == 0:
                    text = json.dumps({"done": step}) + "\n"
                    if "://" in path:
                        epath(progress).write_text(text)  # object stores replace whole objects
                    else:
                        write_atomically(progress, text)
            if new:
                since = time.monotonic()
            elif final or (timeout is not None and time.monotonic() - since >= timeout):
                return
            else:
                time.sleep(poll)
