"""Fresh Python processes for the tests: a free port on 127.0.0.1, and workers run together."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from support import zygote

TESTS = Path(__file__).parents[1]

HEARTBEAT = 10
"""`jax.distributed.initialize(heartbeat_timeout_seconds=)` of the fault tests' 2-process runs: a process
that lost its peer is ended within it (JAX's default, 100 s, would make each such test wait that long)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a `jax.distributed` coordinator)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def device_flags(devices: int) -> str:
    """`XLA_FLAGS` for a process of `devices` CPU devices, and the session's `TEST_XLA_FLAGS` (noxfile)."""
    return f"--xla_force_host_platform_device_count={devices} {os.environ.get('TEST_XLA_FLAGS', '')}".strip()


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without JAX's device settings, with `tests/` on `PYTHONPATH`.

    Without `XLA_FLAGS` or `JAX_NUM_CPU_DEVICES` a fresh interpreter sees JAX's
    default number of CPU devices, whatever the session running the tests set; it
    keeps the session's `TEST_XLA_FLAGS` (noxfile.py), which set no devices.
    """
    env = {key: value for key, value in os.environ.items() if key not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    if os.environ.get("TEST_XLA_FLAGS"):
        env["XLA_FLAGS"] = os.environ["TEST_XLA_FLAGS"]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    env.update(extra)
    return env


def run_together(
    commands: Sequence[Sequence[str]],
    *,
    env: Mapping[str, str],
    logs: Path,
    timeout: float,
    fresh: bool = False,
) -> tuple[list[int], list[str]]:
    """Starts every command at once and waits for all: `(exit codes, outputs)`.

    A script of this Python is forked from the test process's zygote (`support.zygote`), unless
    `fresh`. Each command's stdout and stderr go to `logs/process_<i>.log`. When one is
    still running after `timeout` seconds (waiting for a peer that failed, say),
    all are killed and an `AssertionError` shows what each printed.
    """
    files = [open(logs / f"process_{i}.log", "w+") for i in range(len(commands))]  # noqa: SIM115
    procs = [
        zygote.popen(command, env=env, stdout=file, stderr=subprocess.STDOUT, fresh=fresh)
        for command, file in zip(commands, files, strict=True)
    ]
    codes: list[int] | None = None
    try:
        codes = [proc.wait(timeout=timeout) for proc in procs]
    except subprocess.TimeoutExpired:
        pass
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    outputs = []
    for file in files:
        file.seek(0)
        outputs.append(file.read())
        file.close()
    if codes is None:
        raise AssertionError(f"a process ran past {timeout} s and was killed:\n\n" + "\n\n".join(outputs))
    return codes, outputs
