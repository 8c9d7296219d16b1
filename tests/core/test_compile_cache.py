"""Warm restarts: ciclo's persistent compilation cache, in fresh processes (docs/resume.md, "Warm restarts").

The suite sets JAX_COMPILATION_CACHE_DIR for every process (noxfile.py), which
ciclo leaves alone: each test starts its scripts without JAX's cache settings.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import processes, zygote

SCRIPT = """
import sys, jax, jax.numpy as jnp, ciclo
if sys.argv[3] != "-":  # the program configures the cache itself
    jax.config.update("jax_compilation_cache_dir", sys.argv[3])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
add = jax.jit(lambda state, batch: state + batch)
def step(state, batch):
    return add(state, batch)
state = jax.device_put(jnp.float32(0), jax.devices()[0])  # committed, as a restored state is
ciclo.loop(state, [jnp.float32(1)] * 8, {ciclo.every(1): step}, stop=int(sys.argv[2]), backup=sys.argv[1])
print(jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
"""


def run(
    tmp_path: Path, stop: int, *, configured: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """The script in a fresh process, training to `stop` with its backup in tmp_path/backup."""
    clean = {
        key: value
        for key, value in processes.clean_env(**env).items()
        if not key.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))
    }
    done = zygote.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "backup"), str(stop), str(configured or "-")],
        env=clean,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done


def entries(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith("-cache"))


def test_a_rerun_reads_its_programs_back_and_says_so(tmp_path):
    cache = tmp_path / "cache"
    cold = run(tmp_path, 2, CICLO_COMPILE_CACHE=str(cache))
    assert cold.stdout.split() == [str(cache), "0.0"]  # the threshold lowered: every program is cached
    assert any(name.startswith("jit__lambda-") for name in entries(cache))
    warm = run(tmp_path, 4, CICLO_COMPILE_CACHE=str(cache))  # resumes the finished run, trains on
    found = re.search(
        rf"ciclo: compiled (\d+) programs?, (\d+) from the cache in {re.escape(str(cache))}, "
        r"from the loop's start to step 3\n",
        warm.stderr,
    )
    assert found is not None, warm.stderr
    programs, hits = map(int, found.groups())
    assert 1 <= hits <= programs


@pytest.mark.parametrize("setting", ["off", "unset", "unwritable"])
def test_off_writes_nothing_and_the_default_is_the_user_cache_folder(tmp_path, setting):
    xdg, blocked = tmp_path / "xdg", tmp_path / "a-file"
    blocked.write_text("")
    env = {"XDG_CACHE_HOME": str(xdg)}
    if setting != "unset":
        env["CICLO_COMPILE_CACHE"] = "off" if setting == "off" else str(blocked / "cache")
    done = run(tmp_path, 2, **env)
    if setting == "unset":
        assert done.stdout.split()[0] == str(xdg / "ciclo" / "jax")
        assert entries(xdg / "ciclo" / "jax")
        return
    assert done.stdout.split() == ["None", "1.0"]  # JAX's own defaults, untouched
    assert not xdg.exists()
    if setting == "unwritable":  # the run goes on, compiling as without a cache
        assert f"could not create the compilation cache directory {blocked / 'cache'}" in done.stderr


def test_a_cache_the_program_configured_is_left_alone(tmp_path):
    mine = tmp_path / "mine"
    done = run(tmp_path, 2, configured=mine, CICLO_COMPILE_CACHE=str(tmp_path / "ciclo"))
    assert done.stdout.split() == [str(mine), "0.5"]
    assert not (tmp_path / "ciclo").exists()
