"""The test matrix: `nox` runs the whole suite, `nox -s demo` trains the demo model.

Every session installs the packages non-editable into a fresh virtualenv, so the
tests run against what users install.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = [
    "lint",
    "typecheck",
    "tests",
    "multidevice",
    "faults",
    "conformance",
    "examples",
    "bench_smoke",
    "docs",
    "package",
]

PYPROJECT = nox.project.load_toml("pyproject.toml")
# The tests, docs and examples use tqdm bars and orbax checkpoints, both optional extras.
CORE = "./packages/ciclo-core[tqdm,checkpoint]"
ADAPTERS = ["./packages/ciclo-flax", "./packages/ciclo-haiku", "./packages/ciclo-equinox"]


@dataclasses.dataclass(frozen=True)
class Framework:
    """One `tests(...)` session: ciclo-core plus at most one adapter."""

    packages: list[str]  # installed besides core
    folders: list[str]  # test folders
    modules: list[str]  # import names whose doctests and coverage count
    extras: tuple[str, ...] = ()  # ciclo-core extras besides CORE's


FRAMEWORKS = {
    # History.plot's doctest and the docs' plotting block draw with matplotlib (the plot extra).
    "core": Framework([], ["tests/core", "tests/conformance"], ["ciclo"], extras=("plot",)),
    # clu's metrics need flax, so ciclo's clu support is tested with flax.
    "flax": Framework(
        ["./packages/ciclo-flax", "clu"], ["tests/adapters/flax", "tests/conformance"], ["ciclo_flax"]
    ),
    "haiku": Framework(
        ["./packages/ciclo-haiku"], ["tests/adapters/haiku", "tests/conformance"], ["ciclo_haiku"]
    ),
    "equinox": Framework(
        ["./packages/ciclo-equinox"], ["tests/adapters/equinox", "tests/conformance"], ["ciclo_equinox"]
    ),
    # The loggers' extras, tensorboard to read the event files back, clu for its metric writers.
    "loggers": Framework(
        ["tensorboard", "clu"],
        ["tests/loggers"],
        ["ciclo._src.callbacks._loggers"],
        extras=("tensorboard", "wandb", "mlflow", "plot"),
    ),
}

BENCH_CORE = CORE.replace("]", ",tensorboard]")  # the row with a TensorBoard logger
# The flax demo writes TensorBoard events and plots its history into --logdir.
DEMO_CORE = CORE.replace("]", ",tensorboard,plot]")

EXAMPLES = {
    "examples/flax/digits_cnn.py": 0.95,  # flax linen, the demo
    "examples/flax/digits_cnn_nnx.py": 0.95,
    "examples/haiku/digits_mlp.py": 0.95,
    "examples/equinox/digits_mlp.py": 0.95,
    "examples/jax/digits_mlp.py": 0.95,  # plain JAX through a ciclo.ModelAdapter
    "examples/keras/digits_mlp.py": 0.95,  # Keras 3 through stateless_call
}
"""One example per framework path, and the test accuracy under which it fails (exit status 1)."""

MULTIDEVICE_COUNT = 4


def _group(name: str) -> list[str]:
    return list(nox.project.dependency_groups(PYPROJECT, name))


def _coverage_source(session: nox.Session, module: str) -> str:
    """A package's name, or a subpackage's installed directory.

    Given a dotted name, coverage imports the parent packages (and so jax) when it
    starts, and jaxlib then aborts ("SetTimeZone() has already been called").
    """
    if "." not in module:
        return module
    code = f"import importlib.util as u; print(u.find_spec({module!r}).submodule_search_locations[0])"
    output = session.run("python", "-c", code, silent=True)
    return str(output).strip().splitlines()[-1]


@nox.session
@nox.parametrize("framework", list(FRAMEWORKS), ids=list(FRAMEWORKS))
def tests(session: nox.Session, framework: str) -> None:
    """Unit tests, doctests and coverage of ciclo-core plus one adapter, and the conformance suite."""
    spec = FRAMEWORKS[framework]
    core = CORE.replace("]", "".join(f",{extra}" for extra in spec.extras) + "]")
    session.install(core, *spec.packages, *_group("test"))
    session.run(
        "pytest",
        *spec.folders,
        "--doctest-modules",
        "--pyargs",
        *spec.modules,
        *(f"--cov={_coverage_source(session, module)}" for module in spec.modules),
        "--cov-report=term-missing:skip-covered",
        "--cov-fail-under=90",
        *session.posargs,
        env={"CICLO_TEST_FRAMEWORK": framework},
    )


@nox.session
def faults(session: nox.Session) -> None:
    """Kill and resume: real training scripts killed by SIGKILL and SIGTERM, 1 and 2 processes."""
    session.install(CORE, "./packages/ciclo-flax", *_group("test"))
    session.run("pytest", "tests/faults", *session.posargs)


@nox.session
def multidevice(session: nox.Session) -> None:
    """Strategy and managed-API tests on 4 CPU devices, and a 2-process `jax.distributed` run."""
    session.install(CORE, *_group("test"))
    session.run(
        "pytest",
        "tests/core/strategies",
        "tests/core/test_managed.py",
        "tests/core/test_fused.py",
        "tests/core/test_learning_rate.py",
        "tests/core/test_summary.py",
        "tests/multidevice",
        *session.posargs,
        env={"XLA_FLAGS": f"--xla_force_host_platform_device_count={MULTIDEVICE_COUNT}"},
    )


@nox.session
def conformance(session: nox.Session) -> None:
    """Every adapter at once on 4 CPU devices: the conformance suite and the Keras guide example."""
    session.install(CORE, *ADAPTERS, "keras>=3", *_group("test"))
    session.run(
        "pytest",
        "tests/conformance",
        "tests/docs_keras",
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
    """mypy --strict on ciclo-core and the adapters."""
    # matplotlib's Figure appears in History.plot's signature: the plot extra gives mypy its types.
    session.install("./packages/ciclo-core[tqdm,checkpoint,plot]", *ADAPTERS, *_group("typecheck"))
    session.run("mypy", "packages/ciclo-core/src/ciclo")
    for adapter in ADAPTERS:
        session.run("mypy", f"{adapter}/src")


@nox.session
def demo(session: nox.Session) -> None:
    """Trains a small CNN on scikit-learn's bundled digits with ciclo-flax and ciclo.train_loop."""
    session.install(DEMO_CORE, "./packages/ciclo-flax", *_group("demo"))
    session.run("python", "examples/flax/digits_cnn.py", *session.posargs)


@nox.session
def examples(session: nox.Session) -> None:
    """Runs every example script: each trains on scikit-learn's digits and fails under its accuracy floor."""
    session.install(DEMO_CORE, *ADAPTERS, "keras>=3", *_group("demo"))
    for example, floor in EXAMPLES.items():
        session.run("python", example, f"--min-accuracy={floor}", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """The loop-overhead benchmarks (benchmarks/README.md); pass options after `--`."""
    session.install(BENCH_CORE, "./packages/ciclo-flax", *_group("bench"))
    session.run("python", "benchmarks/bench.py", *session.posargs)


@nox.session
def bench_smoke(session: nox.Session) -> None:
    """The benchmarks with tiny step counts: they run and print their table (not a measurement)."""
    session.install(BENCH_CORE, "./packages/ciclo-flax", *_group("bench"))
    session.run("python", "benchmarks/bench.py", "--smoke", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """Builds the documentation site (mkdocs build --strict into site/) and checks its API reference."""
    session.install(CORE, *ADAPTERS, *_group("docs"))
    session.run("mkdocs", "build", "--strict", env={"NO_MKDOCS_2_WARNING": "1"})
    session.run("pytest", "tests/docs_site", *session.posargs)


@nox.session
def package(session: nox.Session) -> None:
    """Builds the four wheels and sdists, twine-checks them, and trains a step from the wheels in a new venv.

    The new venv gets ciclo-core's wheel alone first (`import ciclo` works, and
    checkpoints and `create_flax_state` name what to install), then the adapters'
    wheels: `ciclo.create_flax_state` trains a tiny linen model for one step.
    """
    session.install(*_group("package"))
    tmp = Path(session.create_tmp())
    dist = tmp / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    for package in ["./packages/ciclo-core", *ADAPTERS]:
        # Builds the sdist, then the wheel from the sdist: a file missing from the sdist fails here.
        session.run("python", "-m", "build", "--outdir", str(dist), package)
    built = sorted(dist.iterdir())
    session.run("twine", "check", "--strict", *map(str, built))
    wheels = {path.name.split("-")[0]: str(path) for path in built if path.suffix == ".whl"}
    venv = tmp / "fresh"
    session.run("python", "-m", "venv", "--clear", str(venv))
    python = str(venv / ("Scripts" if sys.platform == "win32" else "bin") / "python")
    check = str(Path("tests/package/check_install.py").resolve())
    session.run(python, "-m", "pip", "install", wheels["ciclo_core"], external=True)
    session.run(python, check, "core", external=True)
    adapters = [wheels["ciclo_flax"], wheels["ciclo_haiku"], wheels["ciclo_equinox"]]
    session.run(python, "-m", "pip", "install", *adapters, external=True)
    session.run(python, check, "flax", external=True)
