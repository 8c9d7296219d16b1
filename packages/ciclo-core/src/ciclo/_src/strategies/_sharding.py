"""`data_parallel` and `fsdp`: one program over a mesh of every device, partitioned by the compiler."""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar, cast, final

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from ciclo._src.base.batches import Stacked, is_stacked
from ciclo._src.logs.logs import Entries, Logs
from ciclo._src.strategies._in_flight import compile_bounded
from ciclo._src.strategies._placement import check_divisible, check_placeable, place, placed, unaliased
from ciclo._src.strategies._protocols import StepFn

T = TypeVar("T")


class _MeshStrategy(abc.ABC):
    """What `data_parallel` and `fsdp` share; they differ only in how the state is laid out."""

    axis_name: str
    donate: bool
    name: str

    @abc.abstractmethod
    def state_spec(self, shape: tuple[int, ...], /) -> PartitionSpec:
        """How a state leaf of this shape is laid out over the mesh's data axis."""

    @functools.cached_property
    def mesh(self) -> Mesh:
        return jax.make_mesh((jax.device_count(),), (self.axis_name,), axis_types=(AxisType.Auto,))

    @functools.cached_property
    def _multi_process(self) -> bool:
        # Read once: the steps' hot path asks for every batch and every step's logs.
        return jax.process_count() > 1

    @functools.cached_property
    def _replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    @functools.cached_property
    def _rows(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec(self.axis_name))

    def _state_sharding(self, shape: tuple[int, ...]) -> NamedSharding:
        return NamedSharding(self.mesh, self.state_spec(shape))

    def create(self, init: Callable[..., T], /, *args: Any) -> T:
        for arg in args:
            check_placeable(arg, "state", self.name)
        # The arguments are laid out by the state's rule, then `init` runs only inside `jax.jit`,
        # whose output shardings make every leaf of the state born in its final layout: under fsdp
        # no device ever holds a large parameter, or its optimizer state, whole.
        args = place(args, self._state_sharding)
        shapes = jax.eval_shape(init, *args)
        shardings = jax.tree.map(lambda leaf: self._state_sharding(leaf.shape), shapes)
        state = jax.jit(init, out_shardings=shardings)(*args)
        return unaliased(state) if self.donate else state

    def place(self, state: T, /) -> T:
        check_placeable(state, "state", self.name)
        # A buffer can be donated once: copy arrays the state holds twice before placing them.
        return place(unaliased(state) if self.donate else state, self._state_sharding)

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
            check_divisible(batch, jax.local_device_count(), self.name, axis)
            raise

    def _lift_local(self, leaf: Any, rows: NamedSharding, axis: int) -> jax.Array:
        if np.ndim(leaf) > axis:
            return jax.make_array_from_process_local_data(rows, leaf)
        return place(leaf, lambda shape: self._replicated)

    @functools.cached_property
    def _stacked_rows(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec(None, self.axis_name))

    def compile(self, step: StepFn, /, *, donate: bool = False) -> StepFn:
        def constrained(state: Any, batch: Any) -> tuple[Logs, Any]:
            logs, state = step(state, batch)
            shardings = jax.tree.map(lambda leaf: self._state_sharding(np.shape(leaf)), state)
            return logs, jax.lax.with_sharding_constraint(state, shardings)

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
                logs["outputs"], self.mesh, PartitionSpec(self.axis_name)
            )
        )
        return lowered


@final
@dataclasses.dataclass(frozen=True)
class DataParallel(_MeshStrategy):
    """Data parallelism with `jax.jit` and `NamedSharding`: batch sharded, state replicated.

    Example:
        >>> import ciclo, jax
        >>> strategy = ciclo.strategies.get_strategy("data_parallel")
        >>> strategy.mesh.shape == {"data": jax.device_count()}
        True
    """

    axis_name: str = "data"
    donate: bool = False
    name = "data_parallel"

    def state_spec(self, shape: tuple[int, ...], /) -> PartitionSpec:
        return PartitionSpec()


@final
@dataclasses.dataclass(frozen=True)
class FSDP(_MeshStrategy):
    """Fully sharded data parallelism: `data_parallel` that also shards the state.

    Each leaf with at least `min_size` elements is split along its largest dimension divisible by the
    device count; the others are replicated.

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

    def state_spec(self, shape: tuple[int, ...], /) -> PartitionSpec:
        divisible = [dim for dim, size in enumerate(shape) if size % self.mesh.size == 0]
        if math.prod(shape) < self.min_size or not divisible:
            return PartitionSpec()
        split = max(divisible, key=lambda dim: shape[dim])
        return PartitionSpec(*(self.axis_name if dim == split else None for dim in range(len(shape))))
