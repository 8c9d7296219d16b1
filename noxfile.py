"""The test matrix: `nox` runs the whole suite, `nox -s demo` trains the demo model.

Every session installs the packages non-editable into a fresh virtualenv, so the
tests run against what users install.
"""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["lint", "typecheck", "tests(core)", "multidevice"]

PYPROJECT = nox.project.load_toml("pyproject.toml")
CORE = "./packages/ciclo-core[tqdm]"

# framework -> (packages to install besides core, test folders). Adapters join as they land.
FRAMEWORKS: dict[str, tuple[list[str], list[str]]] = {
    "core": ([], ["tests/core"]),
}


MULTIDEVICE_COUNT = 4


def _group(name: str) -> list[str]:
    return list(nox.project.dependency_groups(PYPROJECT, name))


@nox.session
@nox.parametrize("framework", list(FRAMEWORKS), ids=list(FRAMEWORKS))
def tests(session: nox.Session, framework: str) -> None:
    """Unit tests, doctests and coverage of ciclo-core plus one adapter."""
    packages, folders = FRAMEWORKS[framework]
    session.install(CORE, *packages, *_group("test"))
    session.run(
        "pytest",
        *folders,
        "--doctest-modules",
        "--pyargs",
        "ciclo",
        "--cov=ciclo",
        "--cov-report=term-missing:skip-covered",
        "--cov-fail-under=90",
        *session.posargs,
        env={"CICLO_TEST_FRAMEWORK": framework},
    )


@nox.session
def multidevice(session: nox.Session) -> None:
    """Strategy and managed-API tests on 4 CPU devices, and a 2-process `jax.distributed` run."""
    session.install(CORE, *_group("test"))
    session.run(
        "pytest",
        "tests/core/strategies",
        "tests/core/test_managed.py",
        "tests/core/test_fused.py",
        "tests/multidevice",
        *session.posargs,
        env={"XLA_FLAGS": f"--xla_force_host_platform_device_count={MULTIDEVICE_COUNT}"},
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole repository."""
    session.install(*_group("lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on ciclo-core."""
    session.install(CORE, *_group("typecheck"))
    session.run("mypy", "packages/ciclo-core/src/ciclo")


@nox.session
def demo(session: nox.Session) -> None:
    """Trains a small MLP on scikit-learn's bundled digits with ciclo.train_loop."""
    session.install(CORE, *_group("demo"))
    session.run("python", "examples/jax/digits_mlp.py", *session.posargs)
