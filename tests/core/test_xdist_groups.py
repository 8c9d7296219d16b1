"""`--dist loadgroup` with tests/support/xdist_groups.py sends the tests of one `xdist_group` to one worker.

nox runs `faults` and `conformance` so (`noxfile.LOADGROUP`): their grouped tests share session- and
module-scoped fixtures that start processes and train models, built once only on one worker.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from support import processes

GROUPED = textwrap.dedent(
    """
    import os
    import pytest

    @pytest.mark.xdist_group("shared")
    @pytest.mark.parametrize("case", range(6))
    def test_grouped(case):
        with open("workers.txt", "a") as file:
            file.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

    @pytest.mark.parametrize("case", range(6))
    def test_free(case):
        pass
    """
)


def test_the_tests_of_one_group_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED, encoding="utf-8")
    command = [sys.executable, "-m", "pytest", "-n", "2", "--dist=loadgroup", "-p", "support.xdist_groups"]
    done = subprocess.run(
        [*command, "-q", "-p", "no:cacheprovider", "test_grouped.py"],
        cwd=tmp_path,
        env=processes.clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    workers = (tmp_path / "workers.txt").read_text(encoding="utf-8").split()
    assert len(workers) == 6 and len(set(workers)) == 1, workers
