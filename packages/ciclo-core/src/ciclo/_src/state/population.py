"""Many runs in one program: a population of one model's states, stacked on a leading member axis."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Self, final

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ciclo._src.base.reprs import path_name, short
from ciclo._src.logs.logs import History, Logs, LogsLike
from ciclo._src.logs.monitor import ModeLike, monitored_value, ranked_members, resolve_mode
from ciclo._src.state._pytree import Lazy, register_frozen
from ciclo._src.state.learning_rate import injected_learning_rates
from ciclo._src.state.managed import AbstractManagedState, ManagedStep
from ciclo._src.strategies._local import JIT, Eager

MEMBER: Final = "member"
"""The name of the population's leading axis: `batch_axis=` and the mesh axis members are sharded over."""

DATA: Final = "data"
"""The mesh axis each member's batch is split over, on the devices its members share."""


@final
class _Table(dict[str, tuple[Any, ...]]):
    """The members' hyperparameters: a dict that jax can keep in a treedef (hashable, compared by value)."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self.items()))


def _step(name: str, *, update: bool) -> ManagedStep[Any]:
    def body(population: Population, batch: Any) -> tuple[Logs, Population]:
        members = population.members
        member_step = getattr(type(members), name, None)
        if not isinstance(member_step, ManagedStep):
            raise TypeError(
                f"{type(members).__name__}.{name} is {short(member_step)}, not a managed step: a population "
                f"runs its members' `managed.train_step` / `managed.step` under jax.vmap; define {name} "
                "with one of them"
            )
        inner = member_step._body(members.strategy, members)
        per_member = population.batch_axis == MEMBER
        if population.mesh is not None:
            batch = jax.tree.map(functools.partial(_split, population.mesh, per_member), batch)
        logs, new = jax.vmap(inner, in_axes=(0, 0 if per_member else None))(members, batch)
        if update:
            new = jax.tree.map(lambda n, o: jnp.where(_lead(population.active, n), n, o), new, members)
        return logs, population.replace(members=new)

    body.__name__ = name
    return ManagedStep(body, "jit", update=False)


def _split(mesh: Mesh, per_member: bool, leaf: Any) -> Any:
    # Each batch is split over the devices its members share (data parallelism inside each member),
    # where its rows divide among them; the compiler adds the reductions over "data".
    rows = np.shape(leaf)[per_member : per_member + 1]
    if not rows or rows[0] % mesh.shape[DATA]:
        return leaf
    spec = PartitionSpec(*[MEMBER] * per_member, DATA)  # type: ignore[no-untyped-call]
    return jax.lax.with_sharding_constraint(leaf, NamedSharding(mesh, spec))  # type: ignore[no-untyped-call]


def _lead(active: jax.Array, leaf: jax.Array) -> jax.Array:
    return active.reshape(active.shape + (1,) * (jnp.ndim(leaf) - 1))


@jax.jit
@jax.vmap
def _reset(members: Any) -> Any:
    return members.reset_step()


@final
@register_frozen
@dataclasses.dataclass(frozen=True, kw_only=True)
class Population(Lazy):
    """Members of one model trained side by side: each array leaf has a leading member axis of `size`.

    Make one with `ciclo.population`; `train_loop` trains it as it trains one state (docs/populations.md).

    Attributes:
        members: the member states stacked: a state of the member's class whose leaves lead with `size`.
        active: which members train (a bool array `(size,)`); an inactive member's state stays as it is.
        hparams: each member's hyperparameters by name, `"seed"` first when seeds were given (static).
        batch_axis: None: every member sees the same batch; `"member"`: each batch leads with the member
            axis (static).
        mesh: on several devices, the `("member", "data")` mesh the members are placed on, else None
            (static).

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> class State(managed.ManagedState):
        ...     @managed.train_step
        ...     def train_step(self, x):
        ...         return ciclo.logs().add_loss("l2", jnp.sum((self.params - x) ** 2)), self
        >>> def make_state(seed, learning_rate):
        ...     tx = optax.inject_hyperparams(optax.sgd)(learning_rate=learning_rate)
        ...     return State.create(params=jnp.full(2, float(seed)), tx=tx)
        >>> pop = ciclo.population(make_state, seeds=[0, 1], hparams={"learning_rate": [0.1, 0.2]})
        >>> logs, pop = pop.train_step(jnp.ones(2))
        >>> pop.size, pop.hparams["learning_rate"], logs.losses.l2
        (4, (0.1, 0.2, 0.1, 0.2), Array([2., 2., 0., 0.], dtype=float32))
        >>> pop.member(1).params
        Array([0.4, 0.4], dtype=float32)
    """

    members: Any
    active: jax.Array
    hparams: Mapping[str, tuple[Any, ...]] = dataclasses.field(metadata={"static": True})
    batch_axis: str | None = dataclasses.field(default=None, metadata={"static": True})
    mesh: Mesh | None = dataclasses.field(default=None, metadata={"static": True})

    def __post_init__(self) -> None:
        # jax hashes a pytree's static parts: the table is kept as a hashable dict of tuples.
        table = _Table({name: tuple(values) for name, values in self.hparams.items()})
        object.__setattr__(self, "hparams", table)

    @property
    def size(self) -> int:
        """The number of members."""
        return int(self.active.shape[0])

    @property
    def strategy(self) -> Any:
        """The members' strategy (where `train_loop(prefetch=...)` places batches)."""
        return self.members.strategy

    def member(self, i: int) -> Any:
        """Member `i` as an ordinary one-model state, of the class `make_state` returned."""
        if not 0 <= i < self.size:
            raise IndexError(f"member {short(i)} is out of range: this population has {self.size} members")
        return self.members.strategy.place(jax.tree.map(lambda leaf: leaf[i], self.members))

    def best(
        self, logs: LogsLike | History, monitor: str = "loss", mode: ModeLike = "auto"
    ) -> tuple[int, Any]:
        """The member with the best value of `monitor`: `(index, member(index))`, an ordinary one-model state.

        Args:
            logs: a `History` (each entry's newest values, one per member: the `History` that
                `train_loop(population, ...)` returns), or logs to rank by.
            monitor: entry name or full path, e.g. `"accuracy_test"`, one value per member.
            mode: `"auto"` (from the name of `monitor`: an accuracy-like name is better higher),
                `"min"` or `"max"`. A NaN ranks last.

        Example:
            >>> import ciclo, jax.numpy as jnp, optax
            >>> def make_state(seed):
            ...     params = jnp.full(1, float(seed))
            ...     return ciclo.managed.ManagedState.create(params=params, tx=optax.sgd(0.1))
            >>> pop = ciclo.population(make_state, seeds=range(3))
            >>> logs = ciclo.logs().add_metric("accuracy", jnp.array([0.7, 0.9, 0.8]))
            >>> index, state = pop.best(logs, "accuracy")  # "auto": higher is better
            >>> index, state.params.tolist()
            (1, [1.0])
        """
        source = logs.latest() if isinstance(logs, History) else logs
        values = monitored_value(source, monitor, self.size, "population.best")
        index = ranked_members(values, resolve_mode(mode, monitor))[0]
        return index, self.member(index)

    def replace(self, **changes: Any) -> Self:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def reset_step(self) -> Self:
        """Every member's `reset_step()` (their metrics emptied); members without one as they are."""
        if getattr(type(self.members), "reset_step", None) is None:
            return self
        return self.replace(members=_reset(self.members))

    train_step = _step("train_step", update=True)
    test_step = _step("test_step", update=False)
    predict_step = _step("predict_step", update=False)


def population(
    make_state: Callable[..., Any],
    *,
    seeds: Sequence[int] | None = None,
    hparams: Mapping[str, Sequence[Any]] | None = None,
    batch_axis: str | None = None,
) -> Population:
    """Builds a population: one member per seed and hyperparameter set, trained as one vmapped step.

    Members are `make_state(seed=s, **h)` for each seed `s` (seed-major) and each set `h` of the
    `hparams` lists taken together (zipped, not crossed): `seeds=[0, 1]`, `hparams={"learning_rate":
    [0.1, 0.01]}` makes 4 members. Without `seeds`, `make_state` gets no `seed`. A hyperparameter whose
    values differ must reach the state as data: an optimizer's, through `optax.inject_hyperparams`. The
    members' static parts (optimizer, model, strategy) are the first member's. On several devices the
    members are sharded over the axis `"member"` of a `("member", "data")` mesh, as many device groups
    as divide their number, and each member's batch over `"data"` (4 members on 8 devices: one member
    per pair of devices, each device half of its batch). See docs/populations.md.

    Args:
        make_state: returns a managed state (`ciclo.create_*_state`, `ManagedState.create`).
        seeds: the seeds, passed as `seed=`.
        hparams: each hyperparameter's values, one list per name, all of one length.
        batch_axis: None: every member trains on the same batch; `"member"`: each batch leaf leads with
            the member axis, one slice per member.

    Raises:
        ValueError: members that differ in a leaf's path, shape or dtype, or a varying hyperparameter
            that is not an injected optimizer hyperparameter of each member: the first member and leaf named.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> def make_state(seed):
        ...     return managed.ManagedState.create(params=jnp.full(3, float(seed)), tx=optax.sgd(0.1))
        >>> pop = ciclo.population(make_state, seeds=range(4))
        >>> pop.members.params.shape, pop.hparams
        ((4, 3), {'seed': (0, 1, 2, 3)})
    """
    if batch_axis not in (None, MEMBER):
        raise ValueError(f"batch_axis must be None (a shared batch) or {MEMBER!r}, got {short(batch_axis)}")
    table = {name: tuple(values) for name, values in (hparams or {}).items()}
    if len({len(values) for values in table.values()}) > 1:
        lengths = ", ".join(f"{name}: {len(values)}" for name, values in table.items())
        raise ValueError(f"the hparams lists are zipped, so they need one length; got {lengths}")
    if seeds is None and not table:
        raise ValueError("population needs seeds=[...], hparams={name: [...]}, or both, to make its members")
    if seeds is not None and "seed" in table:
        raise ValueError("give the seeds once: as seeds=[...] or as hparams={'seed': [...]}, not both")
    sets = [dict(zip(table, values, strict=True)) for values in zip(*table.values(), strict=True)] or [{}]
    configs = [
        ({} if seed is None else {"seed": seed}) | values
        for seed, values in itertools.product([None] if seeds is None else list(seeds), sets)
    ]
    states = [make_state(**config) for config in configs]
    members = _stack(states)
    _check_hyperparameters(states, configs)
    columns = {name: tuple(config[name] for config in configs) for name in configs[0]}
    built = Population(
        members=members, active=jnp.ones(len(states), bool), hparams=columns, batch_axis=batch_axis
    )
    # On several devices each group of devices holds its share of the members and splits their batches.
    devices = jax.local_devices()
    if len(devices) == 1:
        return built
    mesh = Mesh(np.array(devices).reshape(math.gcd(len(states), len(devices)), -1), (MEMBER, DATA))
    spec = PartitionSpec(MEMBER)  # type: ignore[no-untyped-call]
    placed: Population = jax.device_put(built.replace(mesh=mesh), NamedSharding(mesh, spec))
    return placed


def _stack(states: list[Any]) -> Any:
    first = states[0]
    if not isinstance(first, AbstractManagedState):
        raise TypeError(f"make_state must return a managed state (ciclo.create_*_state), got {short(first)}")
    if not isinstance(first.strategy, (JIT, Eager)):
        raise ValueError(
            f"a population places its members itself (sharded over a mesh axis {MEMBER!r} on several "
            f"devices), so they are made for one device; member 0 has {short(first.strategy)}: create "
            "the members with strategy='jit' (the default)"
        )
    flat, treedef = jax.tree_util.tree_flatten_with_path(first)
    for index, state in enumerate(states[1:], 1):
        if type(state) is not type(first):
            raise ValueError(
                f"population member {index} is a {type(state).__name__}, member 0 a {type(first).__name__}: "
                "make_state must return one class of state"
            )
        other = jax.tree_util.tree_flatten_with_path(state)[0]
        for (path, leaf), (other_path, other_leaf) in itertools.zip_longest(
            flat, other, fillvalue=((), None)
        ):
            a, b = _described(path, leaf), _described(other_path, other_leaf)
            if a != b:
                raise ValueError(
                    f"population member {index} differs from member 0 at {b or a}: member 0 has "
                    f"{a or 'no such leaf'}, member {index} {b or 'no such leaf'}. Members are stacked "
                    "leaf by leaf, so a hyperparameter must not change a shape, a dtype or the state's "
                    "structure: sweep it in separate populations"
                )
    leaves = [jax.tree.leaves(state) for state in states]
    return jax.tree.unflatten(treedef, [jnp.stack(column) for column in zip(*leaves, strict=True)])


def _described(path: Any, leaf: Any) -> str:
    if leaf is None:
        return ""
    leaf = jnp.asarray(leaf)
    return f"{path_name(path)} {leaf.dtype}{list(leaf.shape)}"


def _check_hyperparameters(states: list[Any], configs: list[dict[str, Any]]) -> None:
    for name in configs[0]:
        values = [config[name] for config in configs]
        if name == "seed" or all(value == values[0] for value in values):
            continue
        for index, (state, value) in enumerate(zip(states, values, strict=True)):
            found = injected_learning_rates(state.opt_state, name)
            if not found or not all(_equal(held, value) for held in found):
                held = short([np.asarray(h).item() for h in found]) if found else "none"
                raise ValueError(
                    f"hyperparameter {name!r} varies across the population, but member {index}'s "
                    f"optimizer state holds {held} as an injected {name!r} for {short(value)}: the members "
                    "share member 0's optimizer and model, so a hyperparameter built into them as a Python "
                    f"constant would train every member with member 0's value. Pass {name} to "
                    f"optax.inject_hyperparams, e.g. tx=optax.inject_hyperparams(optax.adam)({name}={name})"
                )


def _equal(held: Any, value: Any) -> bool:
    try:
        return bool(np.asarray(held) == np.asarray(value, np.asarray(held).dtype))
    except (TypeError, ValueError):
        return False
