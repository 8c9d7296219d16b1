"""`pmap`: the seeds' data parallelism, one program per device with a replicated state."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast, final

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from ciclo._src.base.batches import PER_DEVICE_ROWS, is_stacked
from ciclo._src.base.roles import Role, fields_with_role
from ciclo._src.logs.logs import Entries, Logs, collapse_leading_axis
from ciclo._src.strategies._in_flight import compile_bounded
from ciclo._src.strategies._placement import check_divisible, check_placeable, gather, placed
from ciclo._src.strategies._protocols import StepFn

T = TypeVar("T")
M = TypeVar("M")


@final
@dataclasses.dataclass(frozen=True)
class PMap:
    """Data parallelism with `jax.pmap`, as in ciclo 0.1: a copy of the state per device (docs/strategies.md).

    The state gets a leading device axis; fields with the role `managed.Role.KEY` are split per device.
    Prefer `data_parallel`: `jax.pmap` is in maintenance mode since JAX 0.8.

    Example:
        >>> import ciclo, jax, jax.numpy as jnp
        >>> strategy = ciclo.strategies.get_strategy("pmap")
        >>> state = strategy.place({"w": jnp.zeros(3)})
        >>> state["w"].shape == (jax.local_device_count(), 3)
        True
    """

    axis_name: str = "device"
    donate: bool = False

    @functools.cached_property
    def _devices(self) -> NamedSharding:
        mesh = Mesh(np.array(jax.local_devices()), (self.axis_name,), axis_types=(AxisType.Auto,))
        devices = NamedSharding(mesh, PartitionSpec(self.axis_name))
        PER_DEVICE_ROWS.add(devices)  # a batch lifted ahead of the loop counts `devices * rows` samples
        return devices

    def processes_per_batch(self) -> int:
        """How many processes' batches make one global batch: every process feeds its own."""
        return jax.process_count()

    def create(self, init: Callable[..., T], /, *args: Any) -> T:
        return self.place(init(*args))

    def place(self, state: T, /) -> T:
        check_placeable(state, "state", "pmap")
        state = gather(state)
        devices = jax.local_device_count()
        replicated = jax.tree.map(lambda leaf: jnp.broadcast_to(leaf, (devices, *np.shape(leaf))), state)
        keys = fields_with_role(type(state), Role.KEY)
        if keys:
            split = {
                name: jax.tree.map(lambda key: jax.random.split(key, devices), getattr(state, name))
                for name in keys
            }
            replicated = dataclasses.replace(cast(Any, replicated), **split)
        return cast(T, jax.device_put(replicated, self._devices))

    def unplace(self, state: T, /) -> T:
        return cast(T, jax.tree.map(lambda leaf: leaf[0], state))

    def lift_batch(self, batch: T, /) -> T:
        if is_stacked(batch):
            raise ValueError(
                "strategy 'pmap' does not run fused steps (ciclo.stacked batches); use 'data_parallel', "
                "which gives the same results and fuses"
            )
        if placed(batch, lambda shape: self._devices):
            return batch  # split and placed ahead of the step (ciclo.prefetch_to_device)
        devices = jax.local_device_count()
        check_divisible(batch, devices, "pmap")
        # Each leaf's `(rows, ...)` becomes `(devices, rows / devices, ...)`; a scalar is repeated.
        split = jax.tree.map(
            lambda leaf: (
                np.reshape(leaf, (devices, np.shape(leaf)[0] // devices, *np.shape(leaf)[1:]))
                if np.ndim(leaf)
                else np.broadcast_to(leaf, (devices,))
            ),
            batch,
        )
        # Placed as `jax.pmap` lays out its inputs: the mapped step takes them without a copy.
        return cast(T, jax.device_put(split, self._devices))

    def compile(self, step: StepFn, /, *, donate: bool = False) -> StepFn:
        donate_argnums = (0,) if donate and self.donate else ()
        mapped = compile_bounded(
            functools.partial(jax.pmap, axis_name=self.axis_name, donate_argnums=donate_argnums),
            step,
            jax.local_devices(),
        )

        def run(state: Any, batch: Any) -> tuple[Logs, Any]:
            logs, state = mapped(state, batch)
            # Losses and metrics were averaged in the step: device 0 holds the common value.
            return collapse_leading_axis(logs, 0), state

        return run

    def reduce_grads(self, grads: T, /) -> T:
        return jax.lax.pmean(grads, self.axis_name)

    def reduce_model_state(self, model_state: T, /) -> T:
        # Only floating-point statistics are averaged: counters and rng keys stay per device.
        return jax.tree.map(self._mean, model_state)

    def reduce_logs(self, logs: Logs, /) -> Logs:
        reduced = Logs(logs)
        for collection, entries in logs.items():
            if collection != "outputs":
                reduced[collection] = Entries(jax.tree.map(self._mean, dict(entries)))
        return reduced

    def _mean(self, value: Any) -> jax.Array:
        value = jnp.asarray(value)  # a step may log a Python number
        if jnp.issubdtype(value.dtype, jnp.inexact):
            return jax.lax.pmean(value, self.axis_name)
        return value

    def reduce_metric(self, metric: M, /) -> M:
        gathered = jax.lax.all_gather(metric, self.axis_name)
        return gathered.reduce()
