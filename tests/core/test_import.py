"""`import ciclo` runs no JAX computation: JAX can still be configured, and `jax.distributed` started.

Once the XLA backend has started, JAX's device count is fixed and
`jax.distributed.initialize` refuses to run, so a library that computes
anything at import breaks the usual order of a script (imports first). Each
test runs a fresh interpreter, without the session's `XLA_FLAGS`; the first also checks that
`import ciclo` imports no framework, orbax or tqdm (each an extra or an adapter's) and that
`ciclo.testing` imports no pytest: what a fresh import does, in one process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from support import processes

TIMEOUT = 120


def test_import_leaves_the_device_count_configurable_and_imports_no_extra() -> None:
    code = textwrap.dedent(
        """
        import sys

        import jax
        import ciclo

        extras = {"flax", "haiku", "equinox", "orbax", "tensorflow", "torch", "tqdm", "clu"}
        imported = sorted(m for m in sys.modules if m.split(".")[0] in extras)
        assert not imported, imported
        import ciclo.testing

        jax.config.update("jax_num_cpu_devices", 2)
        assert len(jax.devices()) == 2, jax.devices()
        # ciclo.testing.check_adapter needs no pytest (AdapterTests does, tests/core/test_testing.py).
        assert callable(ciclo.testing.check_adapter)
        assert "pytest" not in sys.modules
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=processes.clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stderr


def test_import_then_two_process_distributed_initialize(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import sys

        import jax
        import ciclo

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{sys.argv[1]}",
            num_processes=2,
            process_id=int(sys.argv[2]),
            initialization_timeout=60,
        )
        assert jax.process_count() == 2, jax.process_count()
        jax.distributed.shutdown()
        """
    )
    port = str(processes.free_port())
    commands = [[sys.executable, "-c", code, port, str(i)] for i in range(2)]
    codes, outputs = processes.run_together(
        commands, env=processes.clean_env(), logs=tmp_path, timeout=TIMEOUT, fresh=True
    )
    assert codes == [0, 0], "\n\n".join(outputs)
