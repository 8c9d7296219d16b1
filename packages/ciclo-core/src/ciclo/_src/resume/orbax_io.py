"""The one orbax layer of `ciclo.checkpoint` and `ciclo.backup`: they share this and nothing else."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import re
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, final

import jax
import numpy as np

from ciclo._src.base.reprs import cut, key_names, path_name, short
from ciclo._src.state.managed import AbstractManagedState

_log = logging.getLogger("ciclo")


class _Stderr(logging.Handler):
    """Writes each record's message alone to the `sys.stderr` of the moment it is written."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging's own rule: a handler never raises
            self.handleError(record)


_announce = logging.getLogger("ciclo.resume")
_announce.addHandler(_Stderr())
_announce.propagate = False  # printed once, whatever the root logger's handlers


def announce(message: str, *args: Any) -> None:
    """One line on stderr (the `ciclo.resume` logger): a resume, a lost process..."""
    _announce.warning(message, *args)


TMP_MARK = ".orbax-checkpoint-tmp"  # in the name of a step orbax is writing (renamed when complete)

_ORBAX_PATH_PART = f"{os.sep}orbax{os.sep}checkpoint{os.sep}"

# Every manager `open_manager` made and still alive: its kind ("ciclo_backup", ...) and directory.
_open_managers: weakref.WeakKeyDictionary[Any, tuple[str, str]] = weakref.WeakKeyDictionary()


def _not_orbax_chatter(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or _ORBAX_PATH_PART not in record.pathname


def orbax() -> Any:
    """`orbax.checkpoint`, imported on first use; without it, an ImportError naming the `checkpoint` extra."""
    try:
        # absl.logging must create the "absl" logger itself (a plain one would report absl's own file as
        # every record's origin), before orbax logs its fifty records a save: those below WARNING go.
        from absl import logging as absl_logging

        absl_logging.get_absl_logger().addFilter(_not_orbax_chatter)  # added once, however many calls
        import orbax.checkpoint as ocp  # type: ignore[import-untyped]
    except ImportError as error:
        raise ImportError(
            f'ciclo\'s checkpoints need orbax-checkpoint ({error}): pip install "ciclo-core[checkpoint]"'
        ) from error
    return ocp


def epath(path: str) -> Any:
    """An `etils.epath.Path` (orbax's path type), so that remote URLs work like local paths."""
    orbax()  # etils comes with orbax
    from etils import epath as etils_epath  # type: ignore[import-untyped]

    return etils_epath.Path(path)


def _barriers(kind: str, directory: str) -> str:
    return f"{kind}_{hashlib.sha1(os.path.abspath(directory).encode()).hexdigest()[:12]}"


def open_manager(
    directory: str,
    kind: str,
    *,
    item_handlers: Any,
    async_save: bool = True,
    create: bool = True,
    **options: Any,
) -> Any:
    """An orbax `CheckpointManager` on `directory`; `create`: also remove a killed run's unfinished steps."""
    ocp = orbax()
    barrier = ocp.multihost.get_barrier_sync_fn()

    def noting_barrier(*, key: str, timeout_ms: int) -> None:  # orbax's, of a save's end
        with _noting():
            barrier(key=key, timeout_ms=timeout_ms)

    for child in epath(directory).iterdir() if create and os.path.isdir(directory) else []:
        if TMP_MARK in child.name:  # orbax's cleanup_tmp_directories removes it
            _log.warning("removing the unfinished save %s", os.path.join(directory, child.name))
    manager_options = ocp.CheckpointManagerOptions(
        create=create,
        enable_async_checkpointing=async_save,
        cleanup_tmp_directories=create,
        multiprocessing_options=ocp.options.MultiprocessingOptions(
            barrier_sync_key_prefix=_barriers(kind, directory)
        ),
        # orbax's own barriers and timeout (1200 s for a whole save); a lost process fails them
        # sooner, when JAX's heartbeat timeout declares it dead. They only say so now.
        async_options=ocp.AsyncOptions(barrier_sync_fn=noting_barrier),
        **options,
    )
    manager = ocp.CheckpointManager(directory, options=manager_options, item_handlers=item_handlers)
    _install_exit_hook()
    _open_managers[manager] = (kind, directory)
    return manager


def restore_everywhere(manager: Any, step: int, args: Any) -> Any:
    """`manager.restore(step, args=args)`, done or failed on every process together.

    A process that fails joins the barrier that ends orbax's restore, then all
    share whether each could read.
    """
    if jax.process_count() == 1:
        return manager.restore(step, args=args)
    from jax.experimental import multihost_utils

    ocp = orbax()
    error: Exception | None = None
    try:
        with _noting():
            restored = manager.restore(step, args=args)
    except Exception as failure:  # noqa: BLE001 - orbax and tensorstore raise anything
        error = failure
        with _noting():
            ocp.multihost.sync_global_processes(
                ocp.multihost.unique_barrier_key(
                    "Checkpointer:restore", prefix=_barriers(*_open_managers[manager])
                )
            )
    with _noting():
        done = np.asarray(
            multihost_utils.process_allgather(np.asarray([error is None], np.int32), tiled=True)
        )
    if error is not None:
        raise error
    failed = [index for index, ok in enumerate(done) if not ok]
    if failed:
        raise RuntimeError(f"process {', '.join(map(str, failed))} could not read its part of step {step}")
    return restored


_LOST_PEER = (
    # JAX's coordination service, once a process missed its heartbeats (JAX 0.10 words them so).
    re.compile(r"[Tt]ask (\d+) heartbeat timeout"),
    re.compile(r"stopped sending heartbeats\):\s*(\d+)"),
    # gloo, the CPU collectives, when the other end of a connection is gone: it names no process.
    re.compile(r"Gloo \w+ failed.*(?:Connection reset by peer|Connection closed by peer|Socket closed)()"),
)
"""What JAX and gloo say when a process of the run is gone; the group is that process's number, if named."""

_lost_peer_noted = threading.Lock()  # taken by the first note: threads that see the loss print one line


def lost_peer(error: BaseException) -> str | None:
    """Which process `error` (or its causes and contexts) says is gone ("process 1"), or None.

    Example:
        >>> lost_peer(RuntimeError("UNAVAILABLE: Task 1 heartbeat timeout. This indicates ..."))
        'process 1'
        >>> lost_peer(ValueError("a shape differs")) is None
        True
    """
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        text = str(current)
        for pattern in _LOST_PEER:
            match = pattern.search(text)
            if match is not None:
                if match[1]:
                    return f"process {match[1]}"
                if jax.process_count() == 2:
                    return f"process {1 - jax.process_index()}"
                return "another process"
        pending += [current.__cause__, current.__context__]
    return None


def note_lost_peer(error: BaseException) -> None:
    """Announces once which process `error` says is gone, and the last complete backup to restart from."""
    if jax.process_count() == 1:
        return
    lost = lost_peer(error)
    if lost is None or not _lost_peer_noted.acquire(blocking=False):
        return
    saves = list(_open_managers.values())
    what = "backup" if any(kind == "ciclo_backup" for kind, _ in saves) else "checkpoint"
    places = []
    for directory in sorted({directory for kind, directory in saves if kind == f"ciclo_{what}"}):
        try:  # a step being written has a temporary name (`10.orbax-checkpoint-tmp-...`)
            names = [child.name for child in epath(directory).iterdir()]
        except OSError:
            names = []
        steps = sorted(int(name) for name in names if name.isdigit())
        # Another thread may be finishing a save as the peer is found gone: say that step too.
        prefixes = (name.split(".")[0] for name in names if not name.isdigit())
        writing = [int(prefix) for prefix in prefixes if prefix.isdigit()]
        place = (
            f"the last complete {what} is step {steps[-1]} in {directory}"
            if steps
            else f"{directory} holds no complete {what} yet"
        )
        if writing and max(writing) > (steps[-1] if steps else -1):
            place += f" (step {max(writing)} was being written: if it completed, a rerun goes on from it)"
        places.append(place)
    cause = str(error).strip().split("\n")[0]
    cause = re.sub(r"^(?:\w+: )?(?:Error dispatching computation: )+", "", cause)
    resume = f"; {'; '.join(places)}: start every process again to resume" if places else ""
    announce(
        "ciclo: process %d of %d lost %s (%s: %s)%s",
        jax.process_index(),
        jax.process_count(),
        lost,
        type(error).__name__,
        cut(cause, 160),
        resume,
    )


@contextlib.contextmanager
def _noting() -> Iterator[None]:
    try:
        yield
    except Exception as error:
        note_lost_peer(error)
        raise


def _finish_saves_at_exit() -> None:
    for manager in list(_open_managers.keys()):
        with contextlib.suppress(Exception):
            manager.wait_until_finished()


@functools.cache
def _install_exit_hook() -> None:
    # orbax finalises a save on a thread that submits to a concurrent.futures pool; pools refuse work
    # once threading's exit hooks ran ("cannot schedule new futures after interpreter shutdown", the
    # traceback a double Ctrl-C used to print). threading runs these hooks in reverse order, so one
    # registered now runs before the pools' own.
    threading._register_atexit(_finish_saves_at_exit)  # type: ignore[attr-defined]


def _leaf_table(tree: Any) -> dict[tuple[str, ...], tuple[Any, Any]]:
    """`{path's key names: (shape, dtype)}` of a tree's leaves (`path_name` prints a path)."""
    table = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if shape is None:
            shape = np.shape(leaf)
            dtype = np.asarray(leaf).dtype
        elif dtype is not None and jax.numpy.issubdtype(dtype, jax.dtypes.prng_key):
            # orbax stores a typed key (an nnx module's rng streams) as its raw uint32 data.
            data = jax.eval_shape(jax.random.key_data, leaf)
            shape, dtype = data.shape, data.dtype
        table[key_names(path)] = (tuple(shape), np.dtype(dtype) if dtype is not None else None)
    return table


def stored_tree(manager: Any, step: int, *keys: str) -> Any:
    """The tree of array metadata orbax stored for `step` (under `keys`), or None where it has none."""
    try:
        metadata = manager.item_metadata(step)
        for key in keys:
            metadata = getattr(metadata[key], "tree", metadata[key])
        return getattr(metadata, "tree", metadata)
    except Exception:  # noqa: BLE001 - no metadata to compare with (an older format): orbax's own checks remain
        return None


Explain = Callable[[tuple[str, ...]], "tuple[str, str] | None"]
"""`explain(path)`: the option that explains a leaf on one side only, and what the leaf holds; or None."""

_MAX_ERROR = 2000  # the longest structure error: the leaves are summarised, never all listed


def check_structure(
    stored: Any, item: Any, kind: str, where: str, *, dtypes: bool, explain: Explain | None = None
) -> None:
    """Refuses a target tree unlike the metadata tree orbax stored (None: no check), naming the leaves.

    `dtypes`: a dtype alone that differs is refused too (a checkpoint's restore
    casts). Leaves that `explain` explains are summarised per option.
    """
    if stored is None:
        return
    stored_table = _leaf_table(stored)
    wanted = _leaf_table(item)
    problems: list[str] = []
    explained: dict[str, tuple[str, list[str]]] = {}  # option -> (what its leaves hold, examples)

    def one_side(path: tuple[str, ...], problem: str) -> None:
        reason = None if explain is None else explain(path)
        if reason is None:
            problems.append(problem)
        else:
            explained.setdefault(reason[0], (reason[1], []))[1].append(problem)

    for path, (shape, dtype) in wanted.items():
        name = path_name(path) or "<root>"
        if path not in stored_table:
            one_side(path, f"{name}: in the target ({shape}, {dtype}) but not in {kind}")
            continue
        stored_shape, stored_dtype = stored_table[path]
        if stored_shape != shape:
            problems.append(
                f"{name}: {kind} holds shape {stored_shape} {stored_dtype}, "
                f"the target has shape {shape} {dtype}"
            )
        elif dtypes and stored_dtype is not None and dtype is not None and stored_dtype != dtype:
            problems.append(
                f"{name}: {kind} holds dtype {stored_dtype} (shape {stored_shape}), "
                f"the target has dtype {dtype}"
            )
    for path, (shape, dtype) in stored_table.items():
        if path not in wanted:
            name = path_name(path) or "<root>"
            one_side(path, f"{name}: in {kind} ({shape}, {dtype}) but not in the target")
    count = len(problems) + sum(len(examples) for _, examples in explained.values())
    if not count:
        return
    lines = [
        f"{len(examples)} leaf(s) of {what}: the states differ in {option} (e.g. {cut(examples[0], 160)})"
        for option, (what, examples) in explained.items()
    ]
    lines += [cut(problem, 160) for problem in problems[:8]]
    if len(problems) > 8:
        lines.append(f"... and {len(problems) - 8} more")
    fix = "Restore into a state built like the one that was saved (same model, optimizer, shapes" + (
        " and dtypes)" if dtypes else ")"
    )
    if explained:
        fix = (
            f"Create the target with the same {', '.join(explained)} as the state saved, or restore with "
            "partial=True (ciclo.restore_checkpoint) to take the leaves that match and keep the others"
        )
    head = f"{kind} {where} does not match the target state ({count} difference(s)):"
    while lines and len(head) + len(fix) + sum(len(line) + 3 for line in lines) > _MAX_ERROR - 40:
        lines.pop()
    shown = "\n  ".join(lines)
    raise ValueError(f"{head}\n  {shown}\n{fix}.")


def check_device_axis(stored: Any, target: Any, kind: str, where: str) -> None:
    """Refuses a `pmap` state's save (a leading device axis) onto another device count or strategy."""
    if stored is None or not isinstance(target, AbstractManagedState):
        return
    found = _leaf_table(stored).get(("step",))
    if found is None:
        return
    saved_shape, target_shape = found[0], np.shape(target.step)
    saved = saved_shape[0] if len(saved_shape) == 1 else None
    wanted = target_shape[0] if len(target_shape) == 1 else None
    if saved == wanted:
        return
    onto = (
        f"a pmap state on {wanted} device(s)"
        if wanted is not None
        else f"a state of strategy {short(target.strategy)}, without pmap's device axis"
    )
    if saved is not None:
        raise ValueError(
            f"{kind} {where} holds a pmap state saved on {saved} device(s): each of its arrays has a "
            f"leading device axis of {saved} (step has shape {saved_shape}), which cannot be restored onto "
            f"{onto}. Restore it onto strategy='pmap' on {saved} device(s) (then state.with_strategy(...) "
            "moves it), or save from a data_parallel state (state.with_strategy('data_parallel')), which "
            "restores onto any device count and strategy"
        )
    raise ValueError(
        f"{kind} {where} holds a state saved without pmap's device axis (step has shape {saved_shape}), "
        f"which cannot be restored onto {onto}. Restore it onto the strategy it was saved under, then "
        "move it with state.with_strategy('pmap')"
    )


def is_single_leaf(tree: Any) -> bool:
    """Whether orbax would refuse `tree` at the root (a single leaf, or None): it is saved wrapped."""
    return jax.tree_util.treedef_is_leaf(jax.tree.structure(tree))


def abstract(tree: Any) -> Any:
    """Shape, dtype and sharding of the target's arrays, so that restoring never reads their values."""

    def leaf(x: Any) -> Any:
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)  # type: ignore[no-untyped-call]
        return x

    return jax.tree.map(leaf, tree)


@final
@dataclasses.dataclass(frozen=True)
class RestoreReport:
    """What a restore (`ciclo.restore_checkpoint(..., report=True)`) did, leaf by leaf.

    Attributes:
        step: the checkpoint's step.
        restored: the target's leaves read from the checkpoint, named as
            `ciclo.summary` and ciclo's errors name them: "/"-joined, without
            an nnx variable's last `value` (`params/head/w`).
        kept: `(leaf, reason)` for each leaf of the target left as it was.
        unused: the checkpoint's leaves that no leaf of the target took.
        params_from: the checkpoint's field the parameters were read from, or None.
        cast: `(leaf, "float32 to bfloat16")` for each restored leaf cast to the target's
            floating dtype (a float32 checkpoint into bfloat16 parameters).

    Example:
        >>> report = RestoreReport(3, ("params/w",), (("params/b", "missing in the checkpoint"),), ())
        >>> print(report)
        step 3: restored 1 leaf, kept 1 from the target, 0 of the checkpoint unused
          kept params/b: missing in the checkpoint
    """

    step: int
    restored: tuple[str, ...]
    kept: tuple[tuple[str, str], ...]
    unused: tuple[str, ...]
    params_from: str | None = None
    cast: tuple[tuple[str, str], ...] = ()

    def summary(self) -> str:
        """The first line of `str(report)`: the counts."""
        source = "" if self.params_from is None else f" (params from {self.params_from})"
        restored = f"{len(self.restored)} " + ("leaf" if len(self.restored) == 1 else "leaves")
        restored += f" ({len(self.cast)} cast to the target's dtype)" if self.cast else ""
        return (
            f"step {self.step}{source}: restored {restored}, kept {len(self.kept)} from the target, "
            f"{len(self.unused)} of the checkpoint unused"
        )

    def __str__(self) -> str:
        lines = [self.summary()]
        for word, leaves in (
            ("kept", [f"{leaf}: {why}" for leaf, why in self.kept]),
            ("cast", [f"{leaf}: {dtypes}" for leaf, dtypes in self.cast]),
            ("unused", self.unused),
        ):
            lines += [f"  {word} {leaf}" for leaf in leaves[:20]]
            lines += [f"  ... and {len(leaves) - 20} more {word}"] if len(leaves) > 20 else []
        return "\n".join(lines)


Source = Callable[[tuple[str, ...]], tuple[str, ...]]
"""`source(path)`: where the target's leaf at `path` (its key names) is in the checkpoint."""


def sort_leaves(
    step: int, stored: Any, target: Any, source: Source = lambda path: path, *, any_dtype: bool = False
) -> tuple[dict[tuple[str, ...], Any], RestoreReport]:
    """The leaves of `target` a restore takes (`{path in the checkpoint: abstract leaf}`), and its report.

    A leaf of another shape or missing is kept; of another dtype, cast to the
    target's where both are floating or `any_dtype` (a strict restore casts
    every leaf), else kept. `stored` (the checkpoint's metadata tree) None: the
    restore read the target's tree, casts unknown.
    """
    targets = _leaf_table(target)
    stored_table = targets if stored is None else _leaf_table(stored)
    take: dict[tuple[str, ...], Any] = {}
    restored, kept, cast = [], [], []
    for (path, (shape, dtype)), leaf in zip(targets.items(), jax.tree.leaves(abstract(target)), strict=True):
        name, found = path_name(path), stored_table.get(source(path))
        if found is None:
            kept.append((name, "missing in the checkpoint"))
        elif found[0] != shape:
            kept.append((name, f"other shape: the checkpoint's {found[0]}, the target's {shape}"))
        elif (
            found[1] != dtype
            and not any_dtype
            and not all(jax.numpy.issubdtype(k, jax.numpy.floating) for k in (found[1], dtype))
        ):
            kept.append((name, f"other dtype: the checkpoint's {found[1]}, the target's {dtype}"))
        else:
            take[source(path)] = leaf
            restored.append(name)
            cast += [(name, f"{found[1]} to {dtype}")] if found[1] != dtype else []
    unused = tuple(path_name(path) for path in stored_table if path not in take)
    return take, RestoreReport(step, tuple(restored), tuple(kept), unused, cast=tuple(cast))


def partial_restore(
    manager: Any, step: int, stored: Any, target: Any, *, source: Source
) -> tuple[Any, RestoreReport]:
    """Restores the leaves of `target` found in the checkpoint (`sort_leaves`); keeps the others.

    `manager` has orbax's `PyTreeCheckpointHandler`: only the leaves taken are
    read. `stored`: the checkpoint's metadata tree.
    """
    take, report = sort_leaves(step, stored, target, source)
    values, treedef = jax.tree.flatten(target)
    if take:
        ocp = orbax()
        item = jax.tree_util.tree_map_with_path(lambda p, _: take.get(key_names(p), ocp.PLACEHOLDER), stored)
        restore_args = ocp.checkpoint_utils.construct_restore_args(item)
        read = restore_everywhere(manager, step, ocp.args.PyTreeRestore(item, restore_args=restore_args))
        read_leaves = {key_names(p): leaf for p, leaf in jax.tree_util.tree_leaves_with_path(read)}
        values = [
            read_leaves[source(path)] if source(path) in take else leaf
            for path, leaf in zip(_leaf_table(target), values, strict=True)
        ]
    return jax.tree_util.tree_unflatten(treedef, values), report
