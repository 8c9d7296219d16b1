"""These tests need 4 CPU devices: `nox -s multidevice` sets them up."""

from __future__ import annotations

import jax

DEVICES = 4

if jax.device_count() != DEVICES:
    raise RuntimeError(
        f"tests/multidevice needs {DEVICES} devices, found {jax.device_count()}: run them with "
        f"XLA_FLAGS=--xla_force_host_platform_device_count={DEVICES} (nox -s multidevice does)"
    )
