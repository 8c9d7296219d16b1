"""`data_parallel` and `fsdp`: one program over a mesh of every device, partitioned by the compiler."""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast, final

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from ciclo._src.base.batches import Stacked, is_stacked
from ciclo._src.base.checks import check_int
from ciclo._src.base.reprs import short
from ciclo._src.logs.logs import Entries, Logs
from ciclo._src.strategies._in_flight import compile_bounded
from ciclo._src.strategies._layout import check_rules, layout
from ciclo._src.strategies._placement import (
    check_divisible,
    check_placeable,
    place,
    place_as,
    placed,
    unaliased,
)
from ciclo._src.strategies._protocols import StepFn

T = TypeVar("T")


class _MeshStrategy(abc.ABC):
    """What `data_parallel`, `fsdp` and `mesh` share: one layout machinery, set by each one's fields.

    A state leaf's layout is, in order: the first regex rule that finds its parameter's path, its flax
    logical axis names through `logical_rules`, else the fallback (`state_spec`). Optimizer-state leaves
    that mirror a parameter (same path ending, same shape) follow it.
    """

    donate: bool
    name: str
    min_size: int = 0
    rules: Any = ()
    logical_rules: Any = ()
    replicated_limit: int | None = None

    @abc.abstractmethod
    def _axes(self) -> tuple[dict[str, int], tuple[str, ...], str | None]:
        """The mesh's axes and sizes (-1: the rest), the axes batches split over, the fallback's axis."""

    @functools.cached_property
    def mesh(self) -> Mesh:
        shape = self._axes()[0]
        count, rest = jax.device_count(), [name for name, size in shape.items() if size == -1]
        known = math.prod(size for size in shape.values() if size != -1)
        if rest and count % known == 0:
            shape[rest[0]] = count // known
        if math.prod(shape.values()) != count:
            raise ValueError(
                f"strategy {short(self.name)}: mesh axes {short(self._axes()[0])} need "
                f"{'a multiple of ' if rest else ''}{known} devices, but there are {count}; make the sizes "
                f"multiply to {count} (one may be -1: the rest)"
            )
        return jax.make_mesh(tuple(shape.values()), tuple(shape), axis_types=(AxisType.Auto,) * len(shape))

    def state_spec(self, shape: tuple[int, ...], /) -> PartitionSpec:
        """The fallback layout of a leaf of this shape (for leaves no rule names).

        Split along its largest dimension divisible by the split axis's size when it has at least
        `min_size` elements, else replicated.
        """
        axis = self._axes()[2]
        if axis is None or axis not in self.mesh.shape:
            return PartitionSpec()
        divisible = [dim for dim, size in enumerate(shape) if size % self.mesh.shape[axis] == 0]
        if math.prod(shape) < self.min_size or not divisible:
            return PartitionSpec()
        split = max(divisible, key=lambda dim: shape[dim])
        return PartitionSpec(*(axis if dim == split else None for dim in range(len(shape))))

    def state_shardings(self, state: Any, /) -> Any:
        """The `NamedSharding` of every leaf of `state` (arrays or `jax.ShapeDtypeStruct`s), checked."""
        return layout(
            state, self.mesh, self.rules, self.logical_rules, self.state_spec, self.replicated_limit
        )

    @functools.cached_property
    def _multi_process(self) -> bool:
        # Read once: the steps' hot path asks for every batch and every step's logs.
        return jax.process_count() > 1

    def processes_per_batch(self) -> int:
        """How many processes' batches make one global batch: those holding its distinct row blocks."""
        if not self._multi_process:
            return 1
        blocks = math.prod(self.mesh.shape[axis] for axis in self._axes()[1] if axis in self.mesh.shape)
        indices = self._rows.addressable_devices_indices_map((blocks,)).values()
        return blocks // len({index[0].start for index in indices if index})

    @functools.cached_property
    def _replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    @functools.cached_property
    def _rows_spec(self) -> Any:
        axes = tuple(axis for axis in self._axes()[1] if axis in self.mesh.shape)
        return axes[0] if len(axes) == 1 else (axes or None)

    @functools.cached_property
    def _rows(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec(self._rows_spec))

    def _fallback(self, shape: tuple[int, ...]) -> NamedSharding:
        return NamedSharding(self.mesh, self.state_spec(shape))

    def create(self, init: Callable[..., T], /, *args: Any) -> T:
        for arg in args:
            check_placeable(arg, "state", self.name)
        # The arguments are laid out by the fallback, then `init` runs only inside `jax.jit`, whose
        # output shardings make every leaf of the state born in its final layout: no device ever holds
        # a large parameter, or its optimizer state, whole.
        args = place(args, self._fallback)
        shardings = self.state_shardings(jax.eval_shape(init, *args))
        state = jax.jit(init, out_shardings=shardings)(*args)
        return unaliased(state) if self.donate else state

    def place(self, state: T, /) -> T:
        check_placeable(state, "state", self.name)
        # A buffer can be donated once: copy arrays the state holds twice before placing them.
        return place_as(unaliased(state) if self.donate else state, self.state_shardings(state))

    def unplace(self, state: T, /) -> T:
        return state

    def lift_batch(self, batch: T, /) -> T:
        if is_stacked(batch):
            # Fused steps: the leading axis counts steps; rows are the second axis.
            group = cast(Stacked[Any], batch)
            lifted = self._lift(group.batches, self._stacked_rows, 1)
            return cast(T, Stacked(lifted, steps=group.steps, samples=group.samples))
        return self._lift(batch, self._rows, 0)

    def _lift(self, batch: T, rows: NamedSharding, axis: int) -> T:
        if placed(batch, lambda shape: rows if len(shape) > axis else self._replicated):
            return batch  # lifted ahead of the step (ciclo.prefetch_to_device)
        try:
            if not self._multi_process:
                try:
                    # One call for the whole tree: the common case of array leaves only.
                    return jax.device_put(batch, rows)
                except ValueError:
                    return place(batch, lambda shape: rows if len(shape) > axis else self._replicated)
            return jax.tree.map(lambda leaf: self._lift_local(leaf, rows, axis), batch)
        except ValueError:
            axes = tuple(a for a in self._axes()[1] if a in self.mesh.shape)
            split = math.prod(self.mesh.shape[a] for a in axes)
            named = axes if split != jax.device_count() else ()  # else: every device of this process
            check_divisible(batch, max(1, split // jax.process_count()), self.name, axis, named)
            raise

    def _lift_local(self, leaf: Any, rows: NamedSharding, axis: int) -> jax.Array:
        if np.ndim(leaf) > axis:
            return jax.make_array_from_process_local_data(rows, leaf)
        return place(leaf, lambda shape: self._replicated)

    @functools.cached_property
    def _stacked_rows(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec(None, self._rows_spec))

    def compile(self, step: StepFn, /, *, donate: bool = False) -> StepFn:
        def constrained(state: Any, batch: Any) -> tuple[Logs, Any]:
            logs, state = step(state, batch)
            return logs, jax.lax.with_sharding_constraint(state, self.state_shardings(state))

        donate_argnums = (0,) if donate and self.donate else ()
        compiled = compile_bounded(
            functools.partial(jax.jit, donate_argnums=donate_argnums),
            constrained,
            list(self.mesh.devices.flat),
        )
        if not self._multi_process:
            return compiled

        def run(state: Any, batch: Any) -> tuple[Logs, Any]:
            logs, state = compiled(state, batch)
            return self._local_logs(logs), state

        return run

    def _local_logs(self, logs: Logs) -> Logs:
        if "outputs" not in logs:
            return logs
        # Each process gets the rows of the outputs that belong to the batch it fed.
        lowered = Logs(logs)
        lowered["outputs"] = Entries(
            multihost_utils.global_array_to_host_local_array(
                logs["outputs"], self.mesh, PartitionSpec(self._rows_spec)
            )
        )
        return lowered


@final
@dataclasses.dataclass(frozen=True)
class DataParallel(_MeshStrategy):
    """Data parallelism with `jax.jit` and `NamedSharding`: batch sharded, state replicated.

    `MeshParallel(axes={axis_name: -1}, fallback="replicate")`, under its own name.

    Example:
        >>> import ciclo, jax
        >>> strategy = ciclo.strategies.get_strategy("data_parallel")
        >>> strategy.mesh.shape == {"data": jax.device_count()}
        True
    """

    axis_name: str = "data"
    donate: bool = False
    name = "data_parallel"

    def _axes(self) -> tuple[dict[str, int], tuple[str, ...], None]:
        return {self.axis_name: -1}, (self.axis_name,), None


@final
@dataclasses.dataclass(frozen=True)
class FSDP(_MeshStrategy):
    """Fully sharded data parallelism: `data_parallel` that also shards the state.

    Each leaf with at least `min_size` elements is split along its largest dimension divisible by the
    device count; the others are replicated: the fallback of a one-axis `MeshParallel`.

    Example:
        >>> import ciclo, jax
        >>> from jax.sharding import PartitionSpec
        >>> strategy = ciclo.strategies.get_strategy("fsdp")
        >>> n = jax.device_count()
        >>> strategy.state_spec((3, 512 * n)), strategy.state_spec((10,))
        (P(None, 'data'), P())
    """

    axis_name: str = "data"
    min_size: int = 1024
    donate: bool = False
    name = "fsdp"

    def _axes(self) -> tuple[dict[str, int], tuple[str, ...], str]:
        return {self.axis_name: -1}, (self.axis_name,), self.axis_name


@final
@dataclasses.dataclass(frozen=True)
class MeshParallel(_MeshStrategy):
    """A mesh of any shape: batches split over its data-like axes, the state laid out by rules (`"mesh"`).

    See docs/strategies.md, "Meshes". Every rule is checked when a state is created or placed, before
    step 0. `DataParallel` and `FSDP` are this machinery on a one-axis mesh.

    Args:
        axes: mesh axis sizes by name, e.g. `{"data": 2, "fsdp": 2, "tensor": 2}`; one may be -1 (the
            rest of the devices). Default: every device on `"data"`.
        rules: `(regex, PartitionSpec)` pairs over each parameter's `"/"`-joined path
            (`re.search`; the first rule that finds the path wins).
        logical_rules: flax logical axis name -> mesh axis (a name, a tuple of names, or None), as a
            dict or pairs; read from `nn.with_logical_partitioning` / nnx `sharding=` by ciclo-flax.
        fallback: `"fsdp"` (a leaf of `min_size` elements or more split over the `"fsdp"` axis along
            its largest divisible dimension) or `"replicate"`, for leaves no rule names.
        min_size: see `fallback`.
        batch_axes: the axes a batch's rows are split over (those the mesh has).
        replicated_limit: refuse a parameter of more bytes than this that ends up replicated.
        donate: let training steps reuse the state's buffers.

    Example:
        >>> import ciclo, jax
        >>> from jax.sharding import PartitionSpec as P
        >>> rules = [("kernel", P(None, "tensor"))]
        >>> mesh = ciclo.strategies.MeshParallel(axes={"data": -1, "tensor": 1}, rules=rules)
        >>> mesh.mesh.shape == {"data": jax.device_count(), "tensor": 1}
        True
    """

    axes: Any = None
    rules: Any = ()
    logical_rules: Any = ()
    fallback: str = "fsdp"
    min_size: int = 1024
    batch_axes: tuple[str, ...] = ("data", "fsdp")
    replicated_limit: int | None = None
    donate: bool = False
    name = "mesh"

    def __post_init__(self) -> None:
        axes = {"data": -1} if self.axes is None else dict(self.axes)
        for axis, size in axes.items():
            check_int(size, f"mesh axis {short(axis)}", -1)
        if list(axes.values()).count(-1) > 1 or 0 in axes.values():
            raise ValueError(
                f"mesh axes {short(axes)}: each size is positive, and at most one is -1 (the rest)"
            )
        rules = tuple((str(pattern), PartitionSpec(*spec)) for pattern, spec in self.rules)
        pairs = self.logical_rules.items() if isinstance(self.logical_rules, Mapping) else self.logical_rules
        logical = tuple((str(name), a if a is None or isinstance(a, str) else tuple(a)) for name, a in pairs)
        check_rules(rules, logical, tuple(axes), self.fallback)
        set_ = functools.partial(object.__setattr__, self)
        set_("axes", tuple(axes.items()))
        set_("rules", rules)
        set_("logical_rules", logical)
        set_("batch_axes", tuple(self.batch_axes))

    def _axes(self) -> tuple[dict[str, int], tuple[str, ...], str | None]:
        return dict(self.axes), self.batch_axes, "fsdp" if self.fallback == "fsdp" else None
