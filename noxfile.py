"""The test matrix: `nox` runs the whole suite, `nox -s demo` trains the demo model.

Every session installs the packages non-editable, so the tests run against what
users install. Environments are made with uv where it is installed (`pip install
"nox[uv]"`) and kept between runs: a second `nox` reuses them and reinstalls only
ciclo's own packages. JAX's persistent compilation cache (`.nox/jax-cache`) is
shared by every session and by the processes the tests start. Each test case runs
in one session: the conformance suite in `conformance`, the several-device cases
in `multidevice`, each package's own tests in its `tests(...)` session.

The adapters are found, not listed: each package under packages/ whose
pyproject.toml declares a `ciclo.frameworks` entry point gets a `tests(<name>)`
session (`adapter_packages`) and is installed wherever every adapter is.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent

nox.options.default_venv_backend = "uv|venv"
nox.options.error_on_missing_interpreters = True
# A second `nox` reuses the environments of the first: `nox --reuse-venv=no` makes them anew.
nox.options.reuse_venv = "yes"
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
"""The default sessions, in order; README.md's Development table times each (tests/core/test_noxfile.py)."""

# Bytecode is written as a module is first imported, for what the session imports: compiling every
# installed file at install (UV_COMPILE_BYTECODE) cost each session ~10 s of its 2 cores, most of it
# for modules no process of it imports (mypy and mkdocs read ciclo's dependencies, never import them).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# JAX's persistent compilation cache, for every session and every process the tests start: a
# program compiled once (by another test, session or process) is read back instead of compiled.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".nox" / "jax-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

PYPROJECT = nox.project.load_toml("pyproject.toml")
# The tests, docs and examples use tqdm bars, orbax checkpoints and jax.export files: optional extras.
CORE = "./packages/ciclo-core[tqdm,checkpoint,export]"
ENTRY_POINT_GROUP = "ciclo.frameworks"
"""The entry point group through which `ciclo.create_<name>_state` finds an adapter package."""


@dataclasses.dataclass(frozen=True)
class AdapterPackage:
    """A package under packages/ that declares a `ciclo.frameworks` entry point: an adapter."""

    name: str  # the framework: `ciclo-flax` is `flax`, tested by the session `tests(flax)`
    distribution: str  # its project name, `ciclo-flax`
    path: str  # what to install, `./packages/ciclo-flax`
    modules: list[str]  # the import names its entry points load, `ciclo_flax`
    folders: list[str]  # its tests: tests/adapters/<name> and the package's own tests/, where they exist
    typed: str  # what mypy checks of it
    test_requires: list[str]  # installed beside it in its `tests(...)` session: `[tool.ciclo] test-requires`


def adapter_packages(root: Path = ROOT) -> list[AdapterPackage]:
    """Every adapter under `root`/packages, by folder name: a new one joins the matrix by existing.

    Each is installed in the `conformance`, `examples`, `typecheck`, `docs` and
    `package` sessions and has a `tests(<name>)` session of its own.
    """
    found = []
    for pyproject in sorted((root / "packages").glob("*/pyproject.toml")):
        config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        project = config["project"]
        points = project.get("entry-points", {}).get(ENTRY_POINT_GROUP, {})
        if not points:
            continue  # ciclo-core, or a library that is not an adapter
        folder = pyproject.parent
        name = project["name"].removeprefix("ciclo-")
        tests = [f"tests/adapters/{name}", f"packages/{folder.name}/tests"]
        found.append(
            AdapterPackage(
                name=name,
                distribution=project["name"],
                path=f"./packages/{folder.name}",
                modules=sorted({value.split(":")[0].split(".")[0].strip() for value in points.values()}),
                folders=[path for path in tests if (root / path).is_dir()],
                typed=f"packages/{folder.name}/src"
                if (folder / "src").is_dir()
                else f"packages/{folder.name}",
                test_requires=list(config.get("tool", {}).get("ciclo", {}).get("test-requires", [])),
            )
        )
    return found


ADAPTER_PACKAGES = adapter_packages()
ADAPTERS = [adapter.path for adapter in ADAPTER_PACKAGES]
EXAMPLE_ADAPTER = "./examples/ciclo-stax"
"""An adapter package written as if outside this repository: `examples` runs its own tests (ciclo.testing)."""
OWN = ["ciclo-core", *(adapter.distribution for adapter in ADAPTER_PACKAGES), "ciclo-stax"]
"""The distributions built from this repository: reinstalled at each run of a reused environment."""

CPUS = max(1, min(4, os.cpu_count() or 1))
"""pytest-xdist workers for the sessions whose tests compute: one per CPU (at most 4)."""
WORKERS = CPUS + 1
"""Workers for tests(core) and faults, and the examples run side by side: one more than the CPUs, as
their own processes and waits leave a CPU idle part of the time (fresh runs on 2 CPUs, 2 -> 3 workers:
tests(core) 155 -> 141 s, faults 146 -> 125 s, examples 44 -> 39 s; the other sessions, whose tests
compute, each took 1-4 s longer)."""

DURATIONS = "--durations=10"
"""Every pytest run prints its ten slowest tests."""

LOADGROUP = ["--dist=loadgroup", "-p", "support.xdist_groups"]
"""pytest-xdist's `loadgroup`, with tests/support/xdist_groups.py, which keeps it working under pytest 9."""


@dataclasses.dataclass(frozen=True)
class Framework:
    """One `tests(...)` session: ciclo-core plus at most one adapter."""

    packages: list[str]  # installed besides core
    folders: list[str]  # test folders
    modules: list[str]  # import names whose doctests and coverage count
    extras: tuple[str, ...] = ()  # ciclo-core extras besides CORE's


FRAMEWORKS = {
    # History.plot's doctest and the docs' plotting block draw with matplotlib (the plot extra);
    # ciclo.optuna_trials' doctest, tests and docs section drive a real Optuna study.
    "core": Framework([], ["tests/core"], ["ciclo"], extras=("plot", "optuna")),
    # One session per adapter package, in the order of their folders.
    **{
        adapter.name: Framework([adapter.path, *adapter.test_requires], adapter.folders, adapter.modules)
        for adapter in ADAPTER_PACKAGES
    },
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
    "examples/jax/digits_mlp.py": 0.95,  # plain JAX through a ciclo.types.ModelAdapter
    "examples/keras/digits_mlp.py": 0.95,  # Keras 3 through stateless_call
    "examples/grain/digits_grain.py": 0.95,  # flax fed by a grain pipeline, prefetched
    "examples/tensor_parallel.py": 0.95,  # MeshParallel (2, 1, 4) on 8 CPU devices, checked against jit
    "examples/population_sweep.py": 0.9,  # 8 learning rates as one ciclo.population, the best member kept
}
"""One example per framework path, and the test accuracy under which it fails (exit status 1)."""
EXAMPLE_STEPS = 360
"""The steps each script trains in the examples session (8 epochs; 600 by default, the nnx one 450): the
test accuracy of each best checkpoint is 0.98 or more by then, its floor cleared by 0.03."""

MULTIDEVICE_COUNT = 4

TEST_XLA_FLAGS = " ".join(
    [
        "--xla_cpu_use_fusion_emitters=false",
        "--xla_backend_optimization_level=0",
        "--xla_cpu_parallel_codegen_split_count=1",
    ]
)
"""The XLA flags of every test process, in `XLA_FLAGS` and `TEST_XLA_FLAGS` (which the tests' own
subprocesses add to theirs): on the CPU, XLA's older fusion emitters, no LLVM optimisation and one
LLVM module per program compile small programs in about half the time (tests/core/test_docs_pages.py
on 2 workers, empty cache: 52 s with XLA's defaults, 31 s with the first two flags, 7-9% less CPU
again with the third), and most of the suite's time is compiling small programs. Results may differ
in the last bits from the default flags'; the tests compare runs made under the same flags. The
benchmarks (`bench`) and the demo run with XLA's defaults; `bench_smoke`, which measures nothing,
compiles with these."""

_flags_accepted: list[bool] = []


def _test_env(session: nox.Session, devices: int | None = None) -> dict[str, str]:
    """The environment of a session's tests: `TEST_XLA_FLAGS`, and `devices` CPU devices where given.

    XLA aborts a process on a flag it does not know: the flags are tried once, in a process of the
    session's environment, and left out (with a note) where that jaxlib refuses them.
    """
    if not _flags_accepted:
        probe = [str(Path(session.bin) / "python"), "-c", "import jax; jax.devices()"]
        tried = subprocess.run(probe, env={**os.environ, "XLA_FLAGS": TEST_XLA_FLAGS}, capture_output=True)
        _flags_accepted.append(tried.returncode == 0)
        if tried.returncode:
            session.log(f"this jaxlib refuses TEST_XLA_FLAGS ({TEST_XLA_FLAGS}): the tests run without them")
    flags = TEST_XLA_FLAGS if _flags_accepted[0] else ""
    count = f"--xla_force_host_platform_device_count={devices}" if devices else ""
    return {"TEST_XLA_FLAGS": flags, "XLA_FLAGS": " ".join(filter(None, [count, flags]))}


def _group(name: str) -> list[str]:
    return list(nox.project.dependency_groups(PYPROJECT, name))


def _install(session: nox.Session, *packages: str) -> None:
    """`session.install`, rebuilding this repository's packages in a reused environment.

    uv keeps a local package's built wheel while its pyproject.toml is unchanged, so
    a reused environment would otherwise keep testing the sources of its first run.
    """
    rebuild = [f"--reinstall-package={name}" for name in OWN] if session.venv_backend == "uv" else []
    session.install(*rebuild, *packages)


def _pytest(
    session: nox.Session, *args: str, workers: int | None = CPUS, env: dict[str, str] | None = None
) -> None:
    """pytest with the slowest tests shown, on `workers` pytest-xdist processes (None: in this one)."""
    parallel = [] if workers is None else ["-n", str(workers)]
    session.run("pytest", *parallel, DURATIONS, *args, *session.posargs, env=env or {})


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
    """Unit tests, doctests and coverage of ciclo-core, one adapter, or the loggers."""
    spec = FRAMEWORKS[framework]
    core = CORE.replace("]", "".join(f",{extra}" for extra in spec.extras) + "]")
    _install(session, core, *spec.packages, *_group("test"))
    _pytest(
        session,
        *spec.folders,
        "--doctest-modules",
        "--pyargs",
        *spec.modules,
        *(f"--cov={_coverage_source(session, module)}" for module in spec.modules),
        "--cov-report=term-missing:skip-covered",
        "--cov-fail-under=90",
        workers=WORKERS if framework == "core" else CPUS,  # core's tests start processes and wait
        env=_test_env(session),
    )


@nox.session
def faults(session: nox.Session) -> None:
    """Kill and resume: real training scripts killed by SIGKILL and SIGTERM, 1 and 2 processes.

    The container case starts its script as pid 1 of a pid namespace (`unshare`, as root); where that
    is not permitted, it is skipped and says why.
    """
    # The train_loop worker logs to TensorBoard (tensorboardX), CSV, W&B offline and MLflow; the
    # test reads each back with its own reader (tensorboard's for the event files).
    _install(
        session,
        CORE.replace("]", ",tensorboard,wandb,mlflow]"),
        "./packages/ciclo-flax",
        "tensorboard",
        *_group("test"),
    )
    # loadgroup: the 2-process fsdp tests share one worker, and so their reference and preempted runs.
    _pytest(session, "tests/faults", *LOADGROUP, workers=WORKERS, env=_test_env(session))


@nox.session
def multidevice(session: nox.Session) -> None:
    """What needs several devices: the sharded strategies' cases on 4 CPU devices, and 2-process runs.

    The strategy-parametrised tests of tests/core run here for `data_parallel`, `fsdp`
    and `pmap` only (`--sharded-only`): their single-device cases ran in `tests(core)`.
    """
    _install(session, CORE, *_group("test"))
    _pytest(
        session,
        "tests/core/strategies",
        "tests/core/test_managed.py",
        "tests/core/test_fused.py",
        "tests/core/test_learning_rate.py",
        "tests/core/test_summary.py",
        "tests/core/test_prefetch.py",
        "tests/multidevice",
        "--sharded-only",
        env=_test_env(session, MULTIDEVICE_COUNT),
    )


@nox.session
def conformance(session: nox.Session) -> None:
    """Every adapter at once on 4 CPU devices: the conformance suite and the Keras guide example."""
    _install(session, CORE, *ADAPTERS, "keras>=3", *_group("test"))
    # loadgroup: test_after_training's cases share one worker, and so one new process for every adapter.
    env = _test_env(session, MULTIDEVICE_COUNT)
    _pytest(session, "tests/conformance", "tests/docs_keras", *LOADGROUP, env=env)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and format --check over the repository; lint-imports: the import direction of ciclo._src."""
    _install(session, *_group("lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    # import-linter reads the source only: ciclo needs to be findable, not installed.
    session.run("lint-imports", env={"PYTHONPATH": "packages/ciclo-core/src"})


TYPED = {
    "ciclo-core": "packages/ciclo-core/src/ciclo",
    **{adapter.distribution: adapter.typed for adapter in ADAPTER_PACKAGES},
}
"""What mypy checks of each package."""


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on ciclo-core and the adapters (or on the packages named after `--`)."""
    unknown = sorted(set(session.posargs) - set(TYPED))
    if unknown:
        session.error(f"typecheck takes package names ({', '.join(TYPED)}), not {unknown}")
    # matplotlib's Figure appears in History.plot's signature: the plot extra gives mypy its types.
    _install(session, "./packages/ciclo-core[tqdm,checkpoint,plot]", *ADAPTERS, *_group("typecheck"))
    # One mypy for every package: ciclo-core, which each adapter imports, is analysed once.
    session.run("mypy", *(TYPED[package] for package in session.posargs or TYPED))


def _changed_packages() -> list[str]:
    """The packages with sources changed since the last commit (or not yet committed)."""
    listings = [["git", "diff", "--name-only", "HEAD"], ["git", "ls-files", "--others", "--exclude-standard"]]
    paths = [
        path
        for command in listings
        for path in subprocess.run(command, cwd=ROOT, capture_output=True, text=True).stdout.splitlines()
    ]
    return sorted(
        {path.split("/")[1] for path in paths if path.startswith("packages/") and path.count("/") > 1}
    )


@nox.session(reuse_venv=True)
def quick(session: nox.Session) -> None:
    """The developer's loop: lint, the tests of ciclo-core without coverage, then mypy on what changed.

    mypy runs in the `typecheck` session, queued after this one, on the packages
    whose sources changed since the last commit (ciclo-core when none did).
    """
    _install(
        session, "./packages/ciclo-core[tqdm,checkpoint,plot,export,optuna]", *_group("test"), *_group("lint")
    )
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    _pytest(session, "tests/core", "--doctest-modules", "--pyargs", "ciclo", env=_test_env(session))
    session.notify("typecheck", posargs=_changed_packages() or ["ciclo-core"])


@nox.session
def demo(session: nox.Session) -> None:
    """Trains a small CNN on scikit-learn's bundled digits with ciclo-flax and ciclo.train_loop."""
    _install(session, DEMO_CORE, "./packages/ciclo-flax", *_group("demo"))
    session.run("python", "examples/flax/digits_cnn.py", *session.posargs)


def _side_by_side(
    session: nox.Session,
    commands: dict[str, list[str]],
    workers: int,
    what: str,
    env: dict[str, str] | None = None,
) -> None:
    """Runs the `commands` (by name) `workers` at a time, with `env` added to the environment, shows
    each one's output when it ends, and fails the session naming those that failed."""
    path = os.pathsep.join([str(session.bin), os.environ.get("PATH", "")])
    env = {**os.environ, **(env or {}), "PATH": path}
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        done = dict(
            zip(
                commands,
                pool.map(
                    lambda command: subprocess.run(command, capture_output=True, text=True, env=env),
                    commands.values(),
                ),
                strict=True,
            )
        )
    for name, result in done.items():
        session.log(f"{name}: exit {result.returncode}\n{result.stdout}{result.stderr}")
    failed = [name for name, result in done.items() if result.returncode != 0]
    if failed:
        session.error(f"{what} failed: {', '.join(failed)}")


@nox.session
def examples(session: nox.Session) -> None:
    """Runs every example script: each trains on scikit-learn's digits and fails under its accuracy floor.

    Beside them, the example adapter package's own tests run, as its authors run
    them: the adapter kit `ciclo.testing` over `ciclo_stax.StaxAdapter`. `WORKERS`
    of these commands run at a time; each one's output is shown when it ends.
    """
    _install(
        session,
        DEMO_CORE.replace("]", ",testing]"),
        *ADAPTERS,
        f"{EXAMPLE_ADAPTER}[test]",
        "keras>=3",
        *_group("demo"),
    )
    python = str(Path(session.bin) / "python")
    commands = {
        script: [python, script, f"--steps={EXAMPLE_STEPS}", f"--min-accuracy={floor}", *session.posargs]
        for script, floor in EXAMPLES.items()
    }
    # Its pyproject.toml configures its tests, as in its own repository; doctests: the installed module's.
    commands[f"{EXAMPLE_ADAPTER} tests"] = [
        *(str(Path(session.bin) / "pytest"), DURATIONS, str(ROOT / EXAMPLE_ADAPTER / "tests")),
        *(f"--config-file={EXAMPLE_ADAPTER}/pyproject.toml", f"--rootdir={EXAMPLE_ADAPTER}"),
        *("--doctest-modules", "--pyargs", "ciclo_stax", *session.posargs),
    ]
    _side_by_side(session, commands, WORKERS, "examples", env=_test_env(session))


@nox.session
def bench(session: nox.Session) -> None:
    """The loop-overhead benchmarks (benchmarks/README.md), on one CPU; pass options after `--`."""
    _install(session, BENCH_CORE, "./packages/ciclo-flax", *_group("bench"))
    session.run("python", "benchmarks/bench.py", "--pin-core", *session.posargs)


@nox.session
def bench_smoke(session: nox.Session) -> None:
    """The benchmarks with tiny step counts: they run and print their table (not a measurement).

    Its processes compile with `TEST_XLA_FLAGS`, as the tests' do (21 -> 13 s on 2 CPUs): the rows
    it prints are not XLA's defaults' figures, which `bench` measures.
    """
    _install(session, BENCH_CORE, "./packages/ciclo-flax", *_group("bench"))
    session.run("python", "benchmarks/bench.py", "--smoke", *session.posargs, env=_test_env(session))


@nox.session
def docs(session: nox.Session) -> None:
    """Builds the documentation site (mkdocs build --strict into site/) and checks its API reference."""
    _install(session, CORE, *ADAPTERS, *_group("docs"))
    session.run("mkdocs", "build", "--strict", env={"NO_MKDOCS_2_WARNING": "1"})
    _pytest(session, "tests/docs_site", workers=None)


@nox.session
def package(session: nox.Session) -> None:
    """Builds the wheels and sdists of ciclo-core and the adapters, twine-checks them, trains a step.

    The new venv gets ciclo-core's wheel alone first (`import ciclo` works, and
    checkpoints and `create_flax_state` name what to install), then the adapters'
    wheels: `ciclo.create_flax_state` trains a tiny linen model for one step.
    """
    _install(session, *_group("package"))
    tmp = Path(session.create_tmp())
    dist = tmp / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    # Builds the sdist, then the wheel from the sdist: a file missing from the sdist fails here. uv
    # makes the isolated build environments (build[uv]); the users' install below is pip's. The
    # builds, which mostly wait on their environments, run side by side.
    python = str(Path(session.bin) / "python")
    builds = {
        f"build {package}": [python, "-m", "build", "--installer=uv", "--outdir", str(dist), package]
        for package in ["./packages/ciclo-core", *ADAPTERS]
    }
    _side_by_side(session, builds, len(builds), "builds")
    built = sorted(dist.iterdir())
    session.run("twine", "check", "--strict", *map(str, built))
    wheels = {path.name.split("-")[0]: str(path) for path in built if path.suffix == ".whl"}
    venv = tmp / "fresh"
    # A plain venv with pip in it, made by uv (`python -m venv` spent 5 s of the session in ensurepip).
    session.run("uv", "venv", "--quiet", "--seed", "--clear", "--python", python, str(venv))
    python = str(venv / ("Scripts" if sys.platform == "win32" else "bin") / "python")
    check = str(Path("tests/package/check_install.py").resolve())
    # --no-compile: the two checks write the bytecode of what they import (pip would compile every file).
    session.run(python, "-m", "pip", "install", "--no-compile", wheels["ciclo_core"], external=True)
    session.run(python, check, "core", external=True)
    adapters = [wheels[adapter.distribution.replace("-", "_")] for adapter in ADAPTER_PACKAGES]
    session.run(python, "-m", "pip", "install", "--no-compile", *adapters, external=True)
    session.run(python, check, "flax", external=True)
