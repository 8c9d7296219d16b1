"""What the four distributions declare: every import a dependency, optional ones behind extras.

These read the packages' sources and pyproject.toml files from the repository,
so they check what would be built, whichever packages this environment has.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Mapping
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from support import processes
from support.readme import run_readme

import ciclo
from ciclo._src.resume import orbax_io

PACKAGES = Path(__file__).parents[2] / "packages"
DISTRIBUTIONS = ["ciclo-core", "ciclo-flax", "ciclo-haiku", "ciclo-equinox"]

# Import names whose distribution has another name, for when the distribution is not installed here
# (`importlib.metadata.packages_distributions()` answers for the installed ones).
DISTRIBUTION_OF = {
    "absl": "absl-py",
    "ciclo": "ciclo-core",
    "ciclo_equinox": "ciclo-equinox",
    "ciclo_flax": "ciclo-flax",
    "ciclo_haiku": "ciclo-haiku",
    "etils": "etils",
    "haiku": "dm-haiku",
    "orbax": "orbax-checkpoint",
    "sklearn": "scikit-learn",
    "tensorboardX": "tensorboardx",
    "yaml": "pyyaml",
}


def pyproject(distribution: str) -> dict:
    with open(PACKAGES / distribution / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["project"]


def names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(text).name) for text in requirements}


def import_name(distribution: str) -> str:
    return "ciclo" if distribution == "ciclo-core" else distribution.replace("-", "_")


@functools.cache
def _installed_distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distributions_of(module: str) -> set[str]:
    installed = _installed_distributions().get(module, [])
    known = [DISTRIBUTION_OF[module]] if module in DISTRIBUTION_OF else []
    return {canonicalize_name(name) for name in [*installed, *known, module]}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Imports(ast.NodeVisitor):
    """The top-level module of each absolute import, as `eager` (runs on import) or `lazy`.

    Imports inside functions and under `if TYPE_CHECKING:` are lazy, and so are
    `importlib.import_module("name")` calls with a literal name.
    """

    def __init__(self) -> None:
        self.eager: set[str] = set()
        self.lazy: set[str] = set()
        self._depth = 0

    def _add(self, module: str) -> None:
        (self.lazy if self._depth else self.eager).add(module.split(".")[0])

    def _nested(self, node: ast.AST) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _nested

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self._depth += 1
        for child in node.body:
            self.visit(child)
        self._depth -= 1
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self._add(node.module)

    def visit_Call(self, node: ast.Call) -> None:
        function = node.func
        called = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
        if (
            called == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            self.lazy.add(node.args[0].value.split(".")[0])
        self.generic_visit(node)


def scan(source: str) -> tuple[set[str], set[str]]:
    """`(eager, lazy)` third-party top-level modules imported by `source` (lazy excludes eager ones)."""
    visitor = _Imports()
    visitor.visit(ast.parse(source))
    eager = {m for m in visitor.eager if m not in sys.stdlib_module_names and m != "__future__"}
    lazy = {m for m in visitor.lazy if m not in sys.stdlib_module_names} - eager
    return eager, lazy


def test_scan_tells_eager_from_lazy_imports() -> None:
    source = textwrap.dedent(
        """
        from __future__ import annotations
        import importlib, json
        import jax.numpy as jnp
        from typing import TYPE_CHECKING
        from . import sibling
        if TYPE_CHECKING:
            import flax.linen
        else:
            import numpy
        try:
            import yaml
        except ImportError:
            yaml = None

        def f():
            from orbax import checkpoint
            return importlib.import_module("tqdm.auto")

        class C:
            def m(self):
                import jax
        """
    )
    assert scan(source) == ({"jax", "numpy", "yaml"}, {"flax", "orbax", "tqdm"})


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_every_import_is_declared(distribution: str) -> None:
    """Modules imported when the package is imported are dependencies; lazy ones may be extras."""
    project = pyproject(distribution)
    required = names(project.get("dependencies", []))
    optional = set().union(*map(names, project.get("optional-dependencies", {}).values()))
    own = import_name(distribution)
    undeclared = []
    sources = sorted((PACKAGES / distribution / "src").rglob("*.py"))
    assert sources
    for path in sources:
        eager, lazy = scan(path.read_text(encoding="utf-8"))
        for module, allowed, where in [
            *((m, required, "dependencies") for m in eager),
            *((m, required | optional, "dependencies or an extra") for m in lazy),
        ]:
            if module != own and not distributions_of(module) & allowed:
                undeclared.append(f"{path.name} imports {module!r}, which is not in {where}")
    assert not undeclared, "\n".join(undeclared)


def test_orbax_is_an_extra_of_the_core() -> None:
    project = pyproject("ciclo-core")
    assert "orbax-checkpoint" not in names(project["dependencies"])
    assert {"orbax-checkpoint", "absl-py", "etils"} <= names(project["optional-dependencies"]["checkpoint"])


@pytest.fixture
def without_orbax(monkeypatch: pytest.MonkeyPatch) -> None:
    """Imports of orbax, etils and absl fail, as where the `checkpoint` extra is not installed."""
    real_import = builtins.__import__

    def guarded(name: str, *args: object, **kwargs: object) -> object:
        if name.split(".")[0] in ("orbax", "etils", "absl"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", guarded)


EXTRA_HINT = re.escape('pip install "ciclo-core[checkpoint]"')


@pytest.mark.usefixtures("without_orbax")
def test_checkpoints_without_the_extra_say_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(ImportError, match=EXTRA_HINT) as error:
        ciclo.checkpoint(tmp_path / "run")
    assert isinstance(error.value.__cause__, ModuleNotFoundError)
    with pytest.raises(ImportError, match=EXTRA_HINT):
        ciclo.restore_checkpoint(tmp_path, {"w": 0})
    with pytest.raises(ImportError, match=EXTRA_HINT):
        orbax_io.orbax()
    assert not (tmp_path / "run").exists()


def _import_ciclo_with(path: Path) -> subprocess.CompletedProcess[str]:
    """`import ciclo` in a fresh interpreter with `path` on `sys.path`; warnings are errors."""
    env = processes.clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(path), env["PYTHONPATH"]])
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", "import ciclo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _fake_distribution(root: Path, name: str, version: str, files: list[str]) -> None:
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{file},,\n" for file in files))


def test_old_ciclo_distribution_is_reported_at_import(tmp_path: Path) -> None:
    _fake_distribution(
        tmp_path, "ciclo", "0.1.9", ["ciclo/__init__.py", "ciclo/api.py", "ciclo-0.1.9.dist-info/RECORD"]
    )
    result = _import_ciclo_with(tmp_path)
    assert result.returncode != 0
    assert "UserWarning: the distribution `ciclo` 0.1.9 (ciclo 0.1) is installed" in result.stderr
    assert "pip uninstall ciclo\n" in result.stderr
    assert "pip install --force-reinstall --no-deps ciclo-core" in result.stderr


def test_no_warning_without_the_old_distribution(tmp_path: Path) -> None:
    # A distribution named `ciclo` that ships no `ciclo` package does not conflict.
    _fake_distribution(tmp_path, "ciclo", "1.0.0", ["ciclo-1.0.0.dist-info/RECORD"])
    result = _import_ciclo_with(tmp_path)
    assert result.returncode == 0, result.stderr


RELATIVE_LINK = re.compile(r"\]\((?!https?://|#)([^)]*)\)|(?:href|src)=\"(?!https?://|#)([^\"]*)\"")


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_readme_has_no_relative_links(distribution: str) -> None:
    # The README is the package index's page for the distribution, where relative links lead nowhere.
    assert pyproject(distribution)["readme"] == "README.md"
    readme = (PACKAGES / distribution / "README.md").read_text(encoding="utf-8")
    links = [markdown or html for markdown, html in RELATIVE_LINK.findall(readme)]
    assert not links, f"relative links in {distribution}'s README: {links}"


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_project_urls_are_absolute(distribution: str) -> None:
    urls = pyproject(distribution).get("urls", {})
    assert urls, f"{distribution} sets no [project.urls]"
    assert all(url.startswith("https://") for url in urls.values()), urls


def test_core_readme_runs() -> None:
    namespace = run_readme("ciclo-core")
    assert int(namespace["elapsed"].steps) == 30
