"""Checkpointing: save the loop's state with orbax, keep the latest or the best, restore it."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, TypedDict, TypeVar, Unpack, overload

import jax
import optax

from ciclo._src.base.batches import steps_of
from ciclo._src.base.checks import check_bool, check_directory, check_int
from ciclo._src.base.elapsed import Elapsed
from ciclo._src.base.files import check_closed, write_atomically
from ciclo._src.base.finite import all_finite
from ciclo._src.base.reprs import cut, key_names, short
from ciclo._src.base.roles import params_field
from ciclo._src.base.types import CallbackOutput
from ciclo._src.callbacks._monitor import population_size, snapshot_fields
from ciclo._src.engine.callback import Callback
from ciclo._src.logs.logs import LogsLike
from ciclo._src.logs.monitor import (
    Mode,
    ModeLike,
    monitored_value,
    present_keys,
    ranked_members,
    resolve_mode,
)
from ciclo._src.resume.backup import _MARKER as BACKUP_MARKER
from ciclo._src.resume.goodput import saving
from ciclo._src.resume.orbax_io import (
    TMP_MARK,
    RestoreReport,
    abstract,
    announce,
    check_device_axis,
    check_structure,
    epath,
    is_single_leaf,
    lost_peer,
    open_manager,
    orbax,
    partial_restore,
    restore_everywhere,
    sort_leaves,
    stored_tree,
)
from ciclo._src.resume.signals import held_interrupts
from ciclo._src.state.managed import AbstractManagedState
from ciclo._src.state.model_state import setting_behind

if TYPE_CHECKING:
    from ciclo._src.engine.loop_state import LoopState

S = TypeVar("S")
T = TypeVar("T")

SETTINGS_FILE = "ciclo_checkpoint.json"  # the monitor and mode that rank the checkpoints, for "best"
_STATE_KEYS = ("newest_step", "newest_at_start", "warned")
_LOSS = "loss"  # without `monitor`, the entry whose non-finite value keeps a state from being saved
_BARRIERS = "ciclo_checkpoint"  # the checkpoints' kind in orbax's barrier names
_MEMBERS = "ciclo_members"  # a population's metrics: each member's monitored value, beside the best one's

_log = logging.getLogger("ciclo")


def _absolute_directory(directory: object) -> str:
    if isinstance(directory, os.PathLike):
        directory = os.fspath(directory)
    if not isinstance(directory, str):
        raise TypeError(
            f"directory must be a str or os.PathLike[str], got {short(directory)} of type "
            f"{type(directory).__name__}"
        )
    if not directory:
        raise ValueError("directory must not be empty")
    if "://" in directory:  # gs://bucket/run and the like are already absolute
        return directory
    return os.path.abspath(os.path.expanduser(directory))


def _rank_fn(monitor: str, mode: Mode, member: int | None = None) -> Callable[[Any], float]:
    """The `best_fn` given to orbax: the monitored value (a population's `member`'s), missing or NaN worst."""
    worst = math.inf if mode == "min" else -math.inf

    def rank(metrics: Any) -> float:
        value = metrics.get(monitor if member is None else _MEMBERS) if isinstance(metrics, Mapping) else None
        if member is not None:
            value = value[member] if isinstance(value, list) and member < len(value) else None
        return worst if value is None or math.isnan(float(value)) else float(value)

    return rank


def _open_manager(
    directory: str,
    *,
    keep: int | None,
    monitor: str | None,
    mode: Mode,
    async_save: bool,
    create: bool,
    partial: bool = False,
) -> Any:
    ocp = orbax()
    policies = ocp.checkpoint_managers
    best_fn = None if monitor is None else _rank_fn(monitor, mode)
    return open_manager(
        directory,
        _BARRIERS,
        # What StandardCheckpointHandler saves, PyTreeCheckpointHandler reads, leaf by leaf when partial.
        item_handlers=ocp.PyTreeCheckpointHandler() if partial else ocp.StandardCheckpointHandler(),
        async_save=async_save,
        create=create,
        lightweight_initialize=not create,  # a reader opens without the metrics (a damaged one: "best")
        # best_fn and best_mode still drive `best_step()` and whether metrics are written.
        best_fn=best_fn,
        best_mode=mode,
        # orbax keeps the last `n` after an ascending sort; "min" sorts descending to keep the lowest.
        preservation_policy=policies.LatestN(n=keep)
        if best_fn is None
        else policies.BestN(get_metric_fn=best_fn, reverse=mode == "min", n=keep),
    )


def _settings(monitor: str | None, mode: Mode) -> dict[str, Any]:
    return {"monitor": monitor, "mode": mode if monitor is not None else None}


def _read_settings(directory: str) -> dict[str, Any] | None:
    path = epath(directory) / SETTINGS_FILE
    if not path.exists():
        return None
    try:
        settings = json.loads(path.read_text())
        monitor, mode = settings["monitor"], settings["mode"]
        if monitor is not None and not isinstance(monitor, str):
            raise TypeError(f"monitor is {short(monitor)}")
        return _settings(monitor, "min" if monitor is None else resolve_mode(mode, monitor))
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"cannot read the checkpoint settings in {path}: {error}") from error


def _write_json(where: str, data: dict[str, Any]) -> None:
    """Writes `data` to the file `where` from process 0, atomically, and only when it changes."""
    text = json.dumps(data, indent=2) + "\n"
    path = epath(where)
    if jax.process_index() == 0 and not (path.exists() and path.read_text() == text):
        if "://" in where:
            path.write_text(text)  # object stores replace whole objects: already atomic
        else:
            write_atomically(where, text)


def _recorded(manager: Any, directory: str, step: int) -> Any:
    """The metrics orbax recorded with `step`; a file that is not JSON is a damaged step."""
    try:
        return manager.metrics(step)
    except ValueError as error:  # json's JSONDecodeError, UnicodeDecodeError
        raise _damaged(manager, directory, step, f"holds metrics/metrics, not JSON ({error})") from error


def _resolve_step(
    manager: Any, directory: str, step: object, monitor: str | None, mode: Mode, member: int | None = None
) -> int:
    if isinstance(step, str):
        if step not in ("latest", "best"):
            raise ValueError(f"step must be an int, 'latest' or 'best', got {short(step)}")
    else:
        check_int(step, "step", why=", 'latest' or 'best'")
    steps = sorted(int(s) for s in manager.all_steps())
    empty = [s for s in steps if not any((epath(directory) / str(s)).iterdir())]
    if empty:  # a save cut before it wrote anything (orbax renames a step's directory once complete)
        _log.warning("skipping the empty checkpoint directories of steps %s in %s", short(empty), directory)
        steps = [s for s in steps if s not in empty]
    if not steps:
        raise FileNotFoundError(f"no checkpoint in {directory}")
    if step == "latest":
        return steps[-1]
    if step == "best":
        if monitor is None:
            raise ValueError(
                f"step='best' needs a monitored entry, but the checkpoints in {directory} were saved "
                "without `monitor`; restore step='latest' or a step number instead"
            )
        # Every save records the monitored value: a step without one was damaged, or saved without it.
        records = {s: _recorded(manager, directory, s) for s in steps}
        key = monitor if member is None else _MEMBERS
        have = {s: got for s, got in records.items() if isinstance(got, Mapping) and key in got}
        if list(have) != steps:
            raise ValueError(
                f"step='best' ranks the checkpoints in {directory} by {short(monitor)}"
                f"{'' if member is None else ' per member'}, but steps "
                f"{short(sorted(set(steps) - set(have)))} hold no readable value of it (steps that do: "
                f"{short(list(have))}); restore one of those with step=N, or step='latest'"
            )
        rank, sign = _rank_fn(monitor, mode, member), -1.0 if mode == "min" else 1.0
        return max(steps, key=lambda s: (sign * rank(have[s]), s))  # among equals, the newest (orbax's)
    if step not in steps:
        raise FileNotFoundError(
            f"no checkpoint for step {step} in {directory}; steps present: {short(steps)}"
        )
    return int(step)


def _damaged(manager: Any, directory: str, step: int, why: str | BaseException) -> ValueError:
    """The error for a checkpoint whose files cannot be read: which step, its files, the steps that open."""
    if isinstance(why, BaseException):
        while why.__cause__ is not None:  # tensorstore's own error, under orbax's
            why = why.__cause__
        text = str(why).split("[tensorstore_spec")[0].strip().split("\n")[0]  # not its 1,500-char spec
        why = f"cannot be read: {type(why).__name__}: {cut(text, 400)}"
    others = [
        int(s) for s in manager.all_steps() if int(s) != step and stored_tree(manager, int(s)) is not None
    ]
    fix = (
        f"restore another step with step=N: the files of steps {short(sorted(others))} open"
        if others
        else "no other step in it opens: train again, or resume the run's backup"
    )
    where = epath(directory) / str(step)
    return ValueError(f"the checkpoint of step {step} in {directory} is damaged: {where} {why}; {fix}")


class RestoreOptions(TypedDict, total=False):
    """The keywords of `ciclo.restore_checkpoint` and `Checkpoint.restore`, besides `report`.

    Attributes:
        step: `"latest"` (the default), `"best"` (the best monitored value), or
            a step number.
        partial: restore the target's leaves found in the checkpoint with their
            shape and dtype, keep the others (default False).
        params_from: the checkpoint's field to read the parameters from, e.g.
            `"ema_params"` (with `partial=True`).
        member: restore member `member` of a population's checkpoint into a
            one-model target; `step="best"` is then that member's best step.
    """

    step: int | Literal["latest", "best"]
    partial: bool
    params_from: str | None
    member: int | None


_RESTORE_OPTIONS: Final = frozenset(RestoreOptions.__optional_keys__)


def _restore_in(
    directory: str,
    target: T,
    monitor: str | None,
    mode: Mode,
    options: RestoreOptions,
    report: bool,
) -> T | tuple[T, RestoreReport]:
    unknown = sorted(set(options) - _RESTORE_OPTIONS)
    if unknown:
        raise TypeError(
            f"restore got the unknown keyword(s) {short(unknown)}; it takes {sorted(_RESTORE_OPTIONS)} "
            "and report (ciclo.types.RestoreOptions)"
        )
    step, partial = options.get("step", "latest"), options.get("partial", False)
    params_from, member = options.get("params_from"), options.get("member")
    for flag, value in (("partial", partial), ("report", report)):
        check_bool(value, flag)
    if member is not None:
        check_int(member, "member", 0, " (the population's member to restore) or None")
        if partial:
            raise ValueError(
                "member= restores every leaf of one member: pass partial=True or member=, not both"
            )
    if params_from is not None and (not isinstance(params_from, str) or not partial):
        raise (ValueError if isinstance(params_from, str) else TypeError)(
            f"params_from={short(params_from)} reads the target's parameters from another field of the "
            "checkpoint, and the checkpoint's own parameters are then left unused: pass partial=True too, "
            "e.g. restore_checkpoint(directory, target, partial=True, params_from='ema_params')"
        )
    reader = _open_manager(
        directory, keep=None, monitor=monitor, mode=mode, async_save=False, create=False, partial=partial
    )
    with contextlib.closing(reader) as manager:
        resolved = _resolve_step(manager, directory, step, monitor, mode, member)
        # orbax's StandardSave takes only containers, so a single-leaf state is saved as {"state": leaf}.
        wrapped = is_single_leaf(target) and member is None
        where = f"of step {resolved} in {directory}"
        stored = stored_tree(manager, resolved)
        item = {"state": target} if wrapped else target
        if member is not None:  # a population's: the target's leaves stacked
            item = _stacked(stored, target, member, where)
        if stored is None and partial:
            raise _damaged(manager, directory, resolved, "holds no readable metadata of its tree")
        check_device_axis(stored, target, "the checkpoint", where)  # a pmap state's device axis
        source = _source_of(target, stored, ("state",) if wrapped else (), params_from, where)
        if not partial:  # dtypes=False: restoring a checkpoint casts to the target's dtype (docs/guide.md)
            check_structure(
                stored, abstract(item), "the checkpoint", where, dtypes=False, explain=setting_behind
            )
        try:  # the tree matches the target (checked above): what fails is reading the step's files
            if partial:
                result, found = partial_restore(manager, resolved, stored, item, source=source)
            else:
                result = restore_everywhere(manager, resolved, orbax().args.StandardRestore(abstract(item)))
        except Exception as error:  # noqa: BLE001 - orbax and tensorstore raise plain Exceptions
            if lost_peer(error) is not None:
                raise
            raise _damaged(manager, directory, resolved, error) from error
        if partial:
            found = dataclasses.replace(found, params_from=params_from)
            announce("ciclo: restored the checkpoint %s partially: %s", where, found.summary())
        else:  # every leaf, cast to the target's dtype
            found = sort_leaves(resolved, stored, item, any_dtype=True)[1]
    if member is not None:  # the member's slice, placed as the target's leaf is
        result = jax.tree.map(
            lambda leaf, like: jax.device_put(leaf[member], like.sharding), result["members"], target
        )
    result = typing.cast(T, result["state"] if wrapped else result)
    return (result, found) if report else result


def _stacked(stored: Any, target: Any, member: int, where: str) -> dict[str, Any]:
    """What a population's checkpoint holds, as shapes: `target`'s leaves stacked, and the `active` mask."""
    active = stored.get("active") if isinstance(stored, Mapping) else None
    if active is None or "members" not in stored:
        raise ValueError(
            f"member={member}: the checkpoint {where} is not a population's (ciclo.population); "
            "restore it without member="
        )
    size = active.shape[0]
    if member >= size:
        raise IndexError(f"member={member}: the population checkpointed {where} has {size} members")
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def stack(leaf: Any) -> Any:
        return jax.ShapeDtypeStruct((size, *leaf.shape), leaf.dtype, sharding=device)  # type: ignore[no-untyped-call]

    return {"members": jax.tree.map(stack, target), "active": stack(jax.ShapeDtypeStruct((), bool))}  # type: ignore[no-untyped-call]


def _source_of(
    target: Any, stored: Any, prefix: tuple[str, ...], params_from: str | None, where: str
) -> Callable[[tuple[str, ...]], tuple[str, ...]]:
    if params_from is None:
        return lambda path: path
    name = params_field(type(target)) if isinstance(target, AbstractManagedState) else "params"
    node = stored
    for key in prefix:
        node = node.get(key) if isinstance(node, Mapping) else None
    # A training option's part keeps its arrays in opt_state, under a field of its own (`ema_params`).
    found = [
        path
        for path, value in optax.tree_utils.tree_get_all_with_path(node, params_from)
        if jax.tree.leaves(value)
    ]
    if not found:
        ema = params_from == "ema_params"
        raise ValueError(
            f"params_from={short(params_from)}: the checkpoint {where} holds no {params_from}"
            f"{' (the EMA of the weights: train with ema_decay=, e.g. 0.999)' if ema else ''}; restore "
            f"without params_from to read its {name}"
        )
    source = key_names(found[0])
    own = (*prefix, name)
    size = len(own)
    return lambda path: (*prefix, *source, *path[size:]) if path[:size] == own else path


@typing.final
class Checkpoint(Callback):
    """Saves the loop's state with orbax and keeps the latest or the best checkpoints.

    Create one with `ciclo.checkpoint`; put it under a schedule in `ciclo.loop`,
    in `ciclo.train_loop(callbacks=[...])`, or call `ckpt(elapsed, state, logs)`
    in a hand-written loop. Steps already saved, and states whose monitored value
    (or `loss`) is not finite, are skipped. Its attributes are
    `ciclo.checkpoint`'s arguments (read them only). Numbering, saves and Ctrl-C:
    docs/guide.md, "Runs that survive".

    Example:
        >>> import tempfile
        >>> import ciclo
        >>> import jax.numpy as jnp
        >>> ckpt = ciclo.checkpoint(tempfile.mkdtemp(), monitor="loss", mode="min")
        >>> for elapsed, loss in ciclo.elapse([0.5, 0.2, 0.4]):
        ...     logs = ciclo.logs().add_metric("loss", loss)
        ...     ckpt(elapsed, {"loss": jnp.float32(loss)}, logs)
        >>> ckpt.all_steps(), ckpt.best_step()
        ([2], 2)
        >>> ckpt.restore({"loss": jnp.float32(0)}, step="best")
        {'loss': Array(0.2, dtype=float32)}
        >>> ckpt.close()
    """

    hook: ClassVar[str | None] = "on_epoch_end"  # where train_loop(callbacks=[...]) places it

    def __init__(
        self,
        directory: str | os.PathLike[str],
        keep: int | None,
        monitor: str | None,
        mode: ModeLike,
        async_save: bool,
        overwrite: bool,
        resume: bool,
        name: str | None,
    ) -> None:
        for flag, value in (("async_save", async_save), ("overwrite", overwrite), ("resume", resume)):
            check_bool(value, flag)
        if resume and overwrite:
            raise ValueError("pass resume=True (save after the checkpoints) or overwrite=True, not both")
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"name must be a non-empty str or None, got {type(name).__name__}")
        if keep is not None:
            check_int(keep, "keep", 1, " (or None to keep every checkpoint)")
        if monitor is not None and (not isinstance(monitor, str) or not monitor):
            raise (ValueError if isinstance(monitor, str) else TypeError)(
                f"monitor must be an entry name such as 'loss' or 'metrics.loss', got {short(monitor)}"
            )
        self._name, self.keep, self.monitor = name, keep, monitor
        self.directory = _absolute_directory(directory)
        self.mode = resolve_mode(mode, monitor)
        self.async_save, self.overwrite = async_save, overwrite
        check_directory(self.directory, "checkpoint directory")
        check_closed(self.directory, "the checkpoint directory")
        if overwrite and epath(self.directory).exists() and jax.process_index() == 0:
            for child in epath(self.directory).iterdir():
                if child.name.isdigit() or TMP_MARK in child.name:
                    child.rmtree()
                elif child.name == SETTINGS_FILE or re.fullmatch(r"ciclo_follow_[\w-]+\.json", child.name):
                    child.unlink()  # the followers' progress belongs to the run it replaces
        self._manager: Any = None
        steps = self.all_steps()
        settings = _settings(monitor, self.mode)
        if steps:
            recorded = _read_settings(self.directory)
            if recorded is not None and recorded != settings:
                self.close()
                raise ValueError(
                    f"{self.directory} holds checkpoints saved with monitor={short(recorded['monitor'])}, "
                    f"mode={short(recorded['mode'])}, but this checkpoint has monitor={short(monitor)}, "
                    f"mode={short(settings['mode'])}; use another directory, or pass overwrite=True to "
                    "delete the old checkpoints"
                )
            steps = self._enforce_keep(steps)
        _write_json(os.path.join(self.directory, SETTINGS_FILE), settings)  # no "final" mark (on_end)
        self._found_newest: int | None = max(steps, default=None)
        self._newest = self._found_newest
        self._warned = False
        self._resumed = resume

    def _enforce_keep(self, steps: list[int]) -> list[int]:
        """Deletes what `keep` does not allow (a run killed between a save and its cleanup left more)."""
        if self.keep is None or len(steps) <= self.keep or jax.process_index() != 0:
            return steps
        ranked = sorted(steps)  # oldest first
        if self.monitor is not None:
            rank = _rank_fn(self.monitor, self.mode)
            sign = -1.0 if self.mode == "min" else 1.0
            # worst first; among equals, the oldest goes first (the sort is stable)
            ranked.sort(key=lambda step: sign * rank(self._manager.metrics(step) or {}))
        drop = ranked[: len(steps) - self.keep]
        with held_interrupts():
            for step in drop:
                self._manager.delete(step)
        _log.warning(
            "%s held more checkpoints than keep=%d: deleted steps %s",
            self.directory,
            self.keep,
            short(drop),
        )
        return sorted(set(steps) - set(drop))

    def _get_manager(self) -> Any:
        if self._manager is None:
            self._manager = _open_manager(
                self.directory,
                keep=self.keep,
                monitor=self.monitor,
                mode=self.mode,
                async_save=self.async_save,
                create=True,
            )
        return self._manager

    def __repr__(self) -> str:
        return (
            f"Checkpoint({self.directory!r}, keep={self.keep!r}, monitor={self.monitor!r}, "
            f"mode={self.mode!r}, async_save={self.async_save!r}, overwrite={self.overwrite!r})"
        )

    @saving()  # `ciclo.watchdog` does not count its blocking work as a hang
    def save(self, step: int, state: Any, logs: LogsLike | None = None) -> None:
        """Saves `state` as the checkpoint of `step` (the updates it holds), unless already saved.

        Raises KeyError if `monitor` is not in `logs`, and FileExistsError for
        another run's directory (see `ciclo.checkpoint`).
        """
        check_int(step, "step")
        self._refuse_another_run()
        if self._newest is not None and step <= self._newest:
            if self._found_newest is not None and step < self._found_newest and not self._warned:
                self._warned = True
                _log.warning(
                    "%s already holds checkpoints up to step %d, so earlier steps such as %d are not "
                    "saved; use a new directory for a new run",
                    self.directory,
                    self._found_newest,
                    step,
                )
            return
        source: LogsLike = {} if logs is None else logs
        guarded, value, members = self.monitor or _LOSS, None, population_size(state)
        if self.monitor is None:
            with contextlib.suppress(ValueError):  # a loss of several values (per example) is not checked
                value = monitored_value(source, _LOSS, members)
        elif (value := monitored_value(source, self.monitor, members)) is None:
            raise KeyError(
                f"checkpoint monitor {short(self.monitor)} not found in the logs at step {step}; "
                f"present: {present_keys(source)}"
            )
        metrics = None
        if members is not None and value is not None:  # a population: ranked by its best member
            metrics = {guarded: float(value[ranked_members(value, self.mode)[0]]), _MEMBERS: value.tolist()}
            value = metrics[guarded]
        # A finite loss can come with a NaN update (the gradient of sqrt at 0): the state decides too.
        # A population's diverged member is its own: it ranks last, the others are saved.
        why = f"{short(guarded)} is {value}" if value is not None and not math.isfinite(value) else None
        if why is None and members is None and not all_finite(state):
            why = "the state holds NaN or inf"
        if why is not None:
            _log.warning(
                "checkpoint of step %d not saved: %s; the checkpoints kept are still those of steps %s",
                step,
                why,
                short(self.all_steps()),
            )
            return
        wrapped = {"state": state} if is_single_leaf(state) else state
        metrics = None if self.monitor is None else metrics or {self.monitor: value}
        manager = self._get_manager()
        with held_interrupts():
            manager.save(step, args=orbax().args.StandardSave(wrapped), metrics=metrics, force=True)
        self._newest = step

    def __call__(self, elapsed: Elapsed, state: Any, logs: LogsLike | None = None) -> None:
        """Saves `state` after the step `ciclo.elapse` yielded `elapsed` for, as step `elapsed.steps + 1`."""
        if not isinstance(elapsed, Elapsed):
            raise TypeError(
                f"the first argument must be a ciclo.types.Elapsed, got {short(elapsed)}; "
                "call ckpt(elapsed, state)"
            )
        self.save(int(elapsed.steps) + 1, state, logs)

    def __loop_callback__(self, loop_state: LoopState[S], /) -> CallbackOutput[S]:
        """Saves the loop's state under the steps done with this step (monitor: accumulated logs)."""
        # In a step (at_step_end's too), the loop has not counted it yet; in on_end it has.
        steps = loop_state.steps + (steps_of(loop_state.batch) if loop_state.in_step else 0)
        self.save(steps, loop_state.state, loop_state.accumulated_logs)
        return {}, loop_state.state

    @property
    def state_key(self) -> str:
        """What its saved state is found by on resume: `name`, else `"Checkpoint(monitor, mode)"`."""
        if self._name:
            return self._name
        return f"Checkpoint({self.monitor}, {self.mode})" if self.monitor else "Checkpoint(latest)"

    def state_dict(self) -> dict[str, Any]:
        """What decides which steps are saved: those up to `newest_step` are skipped.

        Example:
            >>> import tempfile
            >>> import ciclo
            >>> ckpt = ciclo.checkpoint(tempfile.mkdtemp(), keep=2)
            >>> ckpt.save(3, {"w": 1.0})
            >>> ckpt.state_dict()
            {'newest_step': 3, 'newest_at_start': None, 'warned': False}
            >>> ckpt.close()
        """
        return {"newest_step": self._newest, "newest_at_start": self._found_newest, "warned": self._warned}

    def load_state_dict(self, state: Any, /) -> None:
        """Takes back a `state_dict()`; checkpoints newer than it are kept and their steps skipped."""
        fields = snapshot_fields(state, _STATE_KEYS, "checkpoint")
        # self._newest is at least the newest step in the directory when this object opened it.
        newest = [int(n) for n in (fields["newest_step"], self._newest) if n is not None]
        self._newest = max(newest, default=None)
        self._found_newest = None if fields["newest_at_start"] is None else int(fields["newest_at_start"])
        self._warned = bool(fields["warned"])
        self._resumed = True

    def _refuse_another_run(self) -> None:
        if self._found_newest is not None and not self._resumed:
            raise FileExistsError(
                f"{self.directory} holds the checkpoints of another run (steps {short(self.all_steps())}); "
                "to go on with that run, pass resume=True (or restore from this Checkpoint first, or "
                "resume the loop's backup); to replace them, pass overwrite=True; or use another directory"
            )

    def on_start(self, loop_state: LoopState[Any], /) -> None:
        self._refuse_another_run()
        _write_json(os.path.join(self.directory, SETTINGS_FILE), _settings(self.monitor, self.mode))

    def on_end(self, loop_state: LoopState[Any], error: BaseException | None, /) -> None:
        """Waits for the saves in flight, also after an error or Ctrl-C; a run that ended marks them final.

        The mark (the newest step, in `ciclo_checkpoint.json`) ends `ciclo.follow_checkpoints`.
        """
        self.wait()
        if error is None and self._newest is not None:
            final = {**_settings(self.monitor, self.mode), "final": self._newest}
            _write_json(os.path.join(self.directory, SETTINGS_FILE), final)

    @saving()  # `ciclo.watchdog` does not count its blocking work as a hang
    def wait(self) -> None:
        """Blocks until the saves in flight are complete (durable, and visible to other processes)."""
        if self._manager is not None:
            with held_interrupts():
                self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for the saves in flight and releases orbax's threads; a later save reopens."""
        if self._manager is not None:
            manager, self._manager = self._manager, None
            with held_interrupts():
                manager.close()

    def all_steps(self) -> list[int]:
        """The steps of the checkpoints kept, in increasing order (saves in flight included)."""
        return sorted(int(s) for s in self._get_manager().all_steps())

    def latest_step(self) -> int | None:
        """The step of the most recent checkpoint, or None if there is none."""
        return max(self.all_steps(), default=None)

    def best_step(self) -> int | None:
        """The step with the best monitored value, or None without `monitor` or checkpoints."""
        best = None if self.monitor is None else self._get_manager().best_step()
        return None if best is None else int(best)

    @overload
    def restore(
        self, target: T, *, report: Literal[False] = False, **options: Unpack[RestoreOptions]
    ) -> T: ...

    @overload
    def restore(
        self, target: T, *, report: Literal[True], **options: Unpack[RestoreOptions]
    ) -> tuple[T, RestoreReport]: ...

    def restore(
        self, target: T, *, report: bool = False, **options: Unpack[RestoreOptions]
    ) -> T | tuple[T, RestoreReport]:
        """Restores a checkpoint into the structure of `target`, as `ciclo.restore_checkpoint` does.

        Restoring makes the directory's checkpoints this run's: later saves go after them.
        """
        self.wait()
        restored = _restore_in(self.directory, target, self.monitor, self.mode, options, report)
        self._resumed = True
        return restored


def checkpoint(
    directory: str | os.PathLike[str],
    *,
    keep: int | None = 1,
    monitor: str | None = None,
    mode: ModeLike = "auto",
    async_save: bool = True,
    overwrite: bool = False,
    resume: bool = False,
    name: str | None = None,
) -> Checkpoint:
    """Creates a `Checkpoint` callback that saves the state in `directory` with orbax.

    Each checkpoint is numbered with the steps completed: `restore(step=N)`
    gives the state after N updates. A loop refuses a new `Checkpoint` on
    another run's checkpoints, unless `resume=True` or `overwrite=True` (or it
    restored from them, or a resumed backup handed it its state). A population's
    checkpoint records each member's monitored value and ranks by the best
    member's; `restore_checkpoint(..., member=i)` reads one member
    (docs/populations.md).

    Args:
        directory: where to save (created if missing), a sub-directory per step.
        keep: how many checkpoints to keep (also of those found in
            `directory`): the most recent, or with `monitor` the best. None: all.
        monitor: a logged entry (`"accuracy_test"`, `"metrics.accuracy_test"`)
            that ranks the checkpoints.
        mode: `"min"` if lower monitored values are better, `"max"` if higher;
            `"auto"`: `"max"` for accuracy-like names (docs/guide.md).
        async_save: write in the background while training goes on.
        overwrite: delete the checkpoints already in `directory`.
        resume: the checkpoints already in `directory` are this run's.
        name: the key its state is saved under in a backup (`state_key`).

    Raises:
        TypeError, ValueError: for an invalid argument, or a `directory` whose
            checkpoints were ranked with another monitor or mode.

    Example:
        >>> import tempfile
        >>> import ciclo
        >>> import jax.numpy as jnp
        >>> def train_step(state, batch):
        ...     return None, {"w": state["w"] + batch}
        >>> ckpt = ciclo.checkpoint(tempfile.mkdtemp(), keep=2)
        >>> state, history, elapsed = ciclo.loop(
        ...     {"w": jnp.float32(0)},
        ...     range(100),
        ...     {ciclo.every(1): [train_step], ciclo.at_step_end(ciclo.every(steps=3)): [ckpt]},
        ...     stop=10,
        ... )
        >>> ckpt.all_steps()
        [6, 9]
        >>> ckpt.restore({"w": jnp.float32(0)}, step=9)  # after 9 steps: 0 + 1 + ... + 8
        {'w': Array(36., dtype=float32)}
    """
    return Checkpoint(directory, keep, monitor, mode, async_save, overwrite, resume, name)


@overload
def restore_checkpoint(
    directory: str | os.PathLike[str],
    target: T,
    *,
    report: Literal[False] = False,
    **options: Unpack[RestoreOptions],
) -> T: ...


@overload
def restore_checkpoint(
    directory: str | os.PathLike[str],
    target: T,
    *,
    report: Literal[True],
    **options: Unpack[RestoreOptions],
) -> tuple[T, RestoreReport]: ...


def restore_checkpoint(
    directory: str | os.PathLike[str],
    target: T,
    *,
    report: bool = False,
    **options: Unpack[RestoreOptions],
) -> T | tuple[T, RestoreReport]:
    """Restores a checkpoint saved by `ciclo.checkpoint` into the structure of `target`.

    `"best"` uses the monitor and mode recorded in the directory. With
    `partial=True` the leaves that match are restored and the others kept
    (docs/after_training.md).

    Args:
        directory: the directory passed to `ciclo.checkpoint`.
        target: a pytree like the saved state: the result's structure, shapes,
            dtypes and shardings.
        report: also return a `ciclo.types.RestoreReport`.
        **options: `step`, `partial`, `params_from`, `member` (one member of a
            population's checkpoint): see `ciclo.types.RestoreOptions`.

    Raises:
        FileNotFoundError: if `directory` holds no checkpoint, or none for `step`.
        ValueError: for an invalid `step` or `params_from`, a `target` unlike
            the checkpoint without `partial`, a damaged step, `"best"` where a
            step has no value of the monitor, or a `ciclo.backup` directory.

    Example:
        >>> import tempfile
        >>> import ciclo
        >>> import jax.numpy as jnp
        >>> directory = tempfile.mkdtemp()
        >>> ckpt = ciclo.checkpoint(directory, keep=None, monitor="accuracy")  # mode "auto": max
        >>> for step, accuracy in enumerate([0.6, 0.9, 0.7], start=1):
        ...     logs = ciclo.logs().add_metric("accuracy", accuracy)
        ...     ckpt.save(step, {"accuracy": jnp.float32(accuracy)}, logs)
        >>> ckpt.close()
        >>> ciclo.restore_checkpoint(directory, {"accuracy": jnp.float32(0)}, step="best")
        {'accuracy': Array(0.9, dtype=float32)}
        >>> target = {"accuracy": jnp.float32(0), "loss": jnp.float32(-1)}
        >>> state, report = ciclo.restore_checkpoint(directory, target, partial=True, report=True)
        >>> state
        {'accuracy': Array(0.7, dtype=float32), 'loss': Array(-1., dtype=float32)}
        >>> print(report)
        step 3: restored 1 leaf, kept 1 from the target, 0 of the checkpoint unused
          kept loss: missing in the checkpoint
    """
    path = _absolute_directory(directory)
    if not epath(path).is_dir():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    if (epath(path) / BACKUP_MARKER).exists():
        raise ValueError(
            f"{path} is a ciclo.backup directory, not a ciclo.checkpoint one: to go on from it, run the same "
            f"loop again with backup={path!r} (a finished run returns its final state at once, with no step)"
        )
    check_closed(path, "the checkpoint directory")
    recorded = _read_settings(path) or _settings(None, "min")
    return _restore_in(path, target, recorded["monitor"], recorded["mode"] or "min", options, report)
