"""Device memory: each device's bytes in use and peak, as its backend's `memory_stats()` reports them."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, final, runtime_checkable

import jax

from ciclo._src.base.checks import check_int
from ciclo._src.base.reprs import short
from ciclo._src.base.types import CallbackOutput, S
from ciclo._src.engine.callback import Callback
from ciclo._src.engine.loop_state import LoopState
from ciclo._src.logs.logs import Logs, LogsLike
from ciclo._src.logs.step_output import NO_LOGS

_log = logging.getLogger("ciclo")

COLLECTION = "device_stats"
STATS = ("bytes_in_use", "peak_bytes_in_use")
"""The keys of `memory_stats()` that are logged, each as the entry `device<id>/<key>`."""


@runtime_checkable
class Device(Protocol):
    """What `ciclo.device_stats` reads of a device: a `jax.Device` has it (so can a stand-in)."""

    @property
    def id(self) -> int: ...

    @property
    def platform(self) -> str: ...

    def memory_stats(self) -> Mapping[str, Any] | None: ...


@final
class DeviceStats(Callback):
    """Logs each device's memory in use and its peak; see `ciclo.device_stats`."""

    hook: ClassVar[str | None] = "on_train_step"

    def __init__(self, devices: Sequence[Device] | None = None) -> None:
        if devices is not None:
            if not isinstance(devices, (list, tuple)):
                raise TypeError(
                    f"devices must be a list of jax devices (jax.local_devices()), got {short(devices)}"
                )
            if not devices:
                raise ValueError("devices must hold at least one device, got an empty list")
            for device in devices:
                if not isinstance(device, Device):
                    raise TypeError(f"devices must be jax devices (jax.local_devices()), got {short(device)}")
                check_int(device.id, f"{short(device)}: a device's id")
            ids = [device.id for device in devices]
            if len(set(ids)) < len(ids):
                raise ValueError(
                    f"devices must be distinct: their entries are named by id, and the ids are {ids}"
                )
        self._devices = None if devices is None else tuple(devices)
        # (device, ((memory_stats key, entry name), ...)) of each device that reported at the first read.
        self._named: tuple[tuple[Device, tuple[tuple[str, str], ...]], ...] | None = None

    @property
    def devices(self) -> tuple[Device, ...]:
        """The devices read: those given, or `jax.local_devices()`."""
        # Asked at the first read, not when the callback is made: `jax.distributed` may not be started yet.
        return tuple(jax.local_devices()) if self._devices is None else self._devices

    def __call__(self) -> Logs:
        """Reads the stats now (in a loop of your own, hand them to `logger.write(step, stats())`)."""
        return Logs(self._read())

    def __loop_callback__(self, loop_state: LoopState[S]) -> CallbackOutput[S]:
        return self._read(), loop_state.state

    def _read(self) -> LogsLike:
        if self._named is None:
            read = self._first_read()
        else:
            read = [(names, device.memory_stats()) for device, names in self._named]
        entries = {
            name: int(stats[key])
            for names, stats in read
            if stats is not None
            for key, name in names
            if key in stats
        }
        return {COLLECTION: entries} if entries else NO_LOGS

    def _first_read(self) -> list[tuple[tuple[tuple[str, str], ...], Mapping[str, Any] | None]]:
        """`(names, stats)` of the devices that report stats, which are named; warns of the others."""
        named = []
        read: list[tuple[tuple[tuple[str, str], ...], Mapping[str, Any] | None]] = []
        silent: list[tuple[Device, str]] = []
        for device in self.devices:
            # A backend without the counters raises XlaRuntimeError (status UNIMPLEMENTED), a RuntimeError.
            try:
                stats = device.memory_stats()
            except RuntimeError as error:
                silent.append((device, f"memory_stats() raised {type(error).__name__}: {short(str(error))}"))
                continue
            if stats is None or not any(key in stats for key in STATS):
                has = f"has neither {' nor '.join(STATS)}" if stats is not None else "returned None"
                silent.append((device, f"memory_stats() {has}"))
                continue
            names = tuple((key, f"device{device.id}/{key}") for key in STATS)
            named.append((device, names))
            read.append((names, stats))
        self._named = tuple(named)
        if silent:
            platforms = sorted({device.platform for device, _ in silent})
            _log.warning(
                "device_stats: the %s backend reports no memory stats (%s), so there is nothing to log "
                "for %s",
                " and ".join(platforms),
                silent[0][1],
                short([f"device{device.id}" for device, _ in silent]),
            )
        return read

    def __repr__(self) -> str:
        if self._devices is None:
            return "ciclo.device_stats()"
        return f"ciclo.device_stats(devices={short(list(self._devices))})"


def device_stats(devices: Sequence[Device] | None = None) -> DeviceStats:
    """Creates a callback that logs each device's memory in use and its peak, where the backend has them.

    Each call reads every device's `memory_stats()` on the host and logs, in
    the `device_stats` collection (which loggers write and progress bars do
    not show), `device<id>/bytes_in_use` and `device<id>/peak_bytes_in_use`.
    The CPU backend reports none: it logs nothing, and warns once. Called with
    no argument it returns the logs. See docs/logging.md, "Device memory".

    Args:
        devices: the devices to read, by default `jax.local_devices()` (asked
            at the first call); any object with an `id`, a `platform` and a
            `memory_stats()` method will do.

    Example:
        >>> import ciclo
        >>> class Gpu:  # a stand-in for a jax.Device whose backend reports memory stats
        ...     id, platform = 3, "gpu"
        ...     def memory_stats(self):
        ...         return {"bytes_in_use": 1024, "peak_bytes_in_use": 4096, "bytes_limit": 8192}
        >>> stats = ciclo.device_stats(devices=[Gpu()])
        >>> stats()
        {'device_stats': {'device3/bytes_in_use': 1024, 'device3/peak_bytes_in_use': 4096}}
    """
    return DeviceStats(devices)
