"""The recompile watch: warns when a managed step compiles again for inputs unlike its first step's."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from typing import Any, ClassVar, NamedTuple, final

import jax

from ciclo._src.base.checks import RecompileWarning, warn
from ciclo._src.base.reprs import short
from ciclo._src.engine.callback import Callback
from ciclo._src.engine.loop_state import LoopState
from ciclo._src.state.managed import _ARRAY_LEAVES, ManagedStep
from ciclo._src.strategies._protocols import Strategy

_BATCH_FIX = (
    "If the last batch of an epoch is smaller, drop it (drop_remainder=True where the batches are made) "
    "or pad it to the full size and mask the padding"
)
_SCALAR_FIX = (
    "Keep Python scalars out of the state: jax compiles a Python number as a weakly typed value and the "
    "step's result as a strongly typed one, so the next step compiles again; store it as an array, "
    "e.g. jnp.asarray(value, jnp.float32)"
)
_STATE_FIX = "Return the state with the shapes and dtypes it came in with"
_STATIC_FIX = (
    "A static field is compiled into the program: hold a value that changes during training in an array field"
)


class _Inputs(NamedTuple):
    """What a compile was for: the trees of the batch (one step's) and of the state, their leaves' types."""

    batch: tuple[Any, tuple[tuple[str, str], ...]]
    state: tuple[Any, tuple[tuple[str, str], ...]]
    static: dict[str, Any]


_WEAK = " (weak: a Python scalar)"


def _leaf_types(tree: Any, cut: int) -> tuple[Any, tuple[tuple[str, str], ...]]:
    # Each leaf's shape and dtype in words, without the `cut` leading axes its program does not see
    # (a Stacked group's, pmap's devices').
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    types = []
    for path, leaf in leaves:
        if isinstance(leaf, _ARRAY_LEAVES):
            aval = jax.typeof(leaf)
            described = f"{tuple(aval.shape)[cut:]} {aval.dtype}{_WEAK if aval.weak_type else ''}"
        else:  # what jax cannot trace: its type
            described = f"() {type(leaf).__name__}"
        types.append((jax.tree_util.keystr(path), described))
    return treedef, tuple(types)


def _static(state: Any) -> dict[str, Any]:
    # The values of a dataclass state's static fields: compiled into the program.
    if not dataclasses.is_dataclass(state) or isinstance(state, type):
        return {}
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state) if f.metadata.get("static")}


def _changes(first: _Inputs, now: _Inputs) -> tuple[str, str] | None:
    """What differs between two compiles' inputs, and the fixes; None when jax sees what ciclo does not."""
    changes: list[str] = []
    fixes: list[str] = []
    for name, (tree0, types0), (tree, types), fix in (
        ("batch", first.batch, now.batch, _BATCH_FIX),
        ("state", first.state, now.state, _STATE_FIX),
    ):
        if tree == tree0:
            for (path, leaf), (_, leaf0) in zip(types, types0, strict=True):
                if leaf != leaf0:
                    changes.append(f"inputs {name}{path} {leaf}, first compiled for {leaf0}")
                    fixes.append(_SCALAR_FIX if leaf0 == leaf + _WEAK else fix)  # only the weak type went
            continue
        moved = []
        if name == "state" and now.static.keys() == first.static.keys():
            moved = [key for key in now.static if now.static[key] != first.static[key]]
        changes += [
            f"static field state.{key} {short(now.static[key])}, first compiled for "
            f"{short(first.static[key])}"
            for key in moved
        ] or [f"the {name}'s structure {short(tree)}, first compiled for {short(tree0)}"]
        fixes.append(_STATIC_FIX if moved else fix)
    if not changes:
        return None  # a new group size of a Stacked batch, a sharding, or jax's cache evicting the program
    return "; ".join(changes), ". ".join(dict.fromkeys(fixes))


@final
class RecompileWatch(Callback):
    """Listens to the managed steps of a loop while it runs; see `watch_recompiles`."""

    hook: ClassVar[str | None] = "on_train_begin"
    _first: dict[tuple[ManagedStep[Any], Strategy], _Inputs]  # each step's first inputs, by strategy
    _warned: set[tuple[ManagedStep[Any], str]]  # the changes warned about

    def __init__(self, steps: Iterable[Any]) -> None:
        self._steps = [step for step in steps if isinstance(step, ManagedStep)]

    def on_start(self, loop_state: LoopState[Any], /) -> None:
        self._first, self._warned = {}, set()
        for step in self._steps:
            step.listen(functools.partial(self._heard, step))

    def on_end(self, loop_state: LoopState[Any], error: BaseException | None, /) -> None:
        for step in self._steps:
            step.listen(None)

    def _heard(
        self, step: ManagedStep[Any], strategy: Strategy, state: Any, batch: Any, cuts: tuple[int, int]
    ) -> None:
        # The first inputs heard (the loop's first step's) are those later compiles are compared with.
        inputs = _Inputs(_leaf_types(batch, cuts[0]), _leaf_types(state, cuts[1]), _static(state))
        first = self._first.setdefault((step, strategy), inputs)
        changed = None if first is inputs else _changes(first, inputs)
        if changed is None or (step, changed[0]) in self._warned:
            return
        change, fix = changed
        self._warned.add((step, change))
        warn(
            f"{step!r} compiled again (compile {step.compiles}) under {strategy!r}, for {change}. Each "
            f"new program takes a compile (seconds to minutes on an accelerator). {fix}.",
            RecompileWarning,
        )


def watch_recompiles(steps: Iterable[Any]) -> RecompileWatch:
    """Creates a callback that warns when one of the managed `steps` compiles again for other inputs.

    While the loop runs, each managed step among `steps` logs its count of compiles as
    `performance.compiles` at each step that compiled, and a compile for inputs unlike those of the
    loop's first step warns once per change with a `ciclo.types.RecompileWarning` that names what
    changed and the usual fix (docs/logging.md, "Recompiles"). `train_loop` adds one for its steps;
    other objects among `steps` are ignored.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> @managed.train_step
        ... def train_step(state, batch):
        ...     return ciclo.logs().add_loss("loss", jnp.mean((batch * state.params) ** 2))
        >>> state = managed.ManagedState.create(params=jnp.ones(2), tx=optax.sgd(0.1))
        >>> watch = ciclo.watch_recompiles([train_step])
        >>> tasks = {ciclo.every(1): [train_step]}
        >>> _, history, _ = ciclo.loop(state, [jnp.ones(2)] * 3, tasks, on_start=watch)
        >>> history.collect("steps", "compiles")
        ([0], [1])
    """
    return RecompileWatch(steps)
