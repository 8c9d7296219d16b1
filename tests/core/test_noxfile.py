"""The noxfile's matrix: the adapters of packages/ join it by existing; README.md times each default session.

nox is not installed in the test environments: the noxfile is loaded with a
stand-in for it, which is enough to read the matrix it builds at import time.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from unittest import mock

import pytest

ROOT = Path(__file__).parents[2]


def load_noxfile(root: Path = ROOT) -> ModuleType:
    """`root`/noxfile.py as a module, imported with a stand-in `nox` and its environment changes undone."""
    spec = importlib.util.spec_from_file_location(f"noxfile_{abs(hash(root))}", root / "noxfile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with (
        mock.patch.dict(sys.modules, {"nox": mock.MagicMock(), spec.name: module}),
        mock.patch.dict(os.environ),
    ):
        spec.loader.exec_module(module)  # dataclasses look their module up in sys.modules
    return module


NOXFILE = load_noxfile()


def default_sessions() -> list[str]:
    """`nox.options.sessions`, with the parametrized `tests` as one name per framework."""
    return [
        name
        for session in NOXFILE.nox.options.sessions
        for name in ([f"tests({n})" for n in NOXFILE.FRAMEWORKS] if session == "tests" else [session])
    ]


def timed_sessions() -> list[str]:
    """The sessions of the table in README.md's Development section, in its order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Development", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, re.M)


def test_every_default_session_has_a_row_in_the_readme_timings() -> None:
    sessions, timed = default_sessions(), timed_sessions()
    assert "tests(core)" in sessions and "lint" in sessions
    # A new adapter package joins the matrix with no other edit: its session may wait for a timing row.
    adapters = {f"tests({adapter.name})" for adapter in NOXFILE.ADAPTER_PACKAGES}
    missing = [name for name in sessions if name not in timed and name not in adapters]
    assert not missing, f"README.md's Development table does not time {missing}: run nox and add them"
    assert set(timed) <= set(sessions), f"README.md times gone sessions: {set(timed) - set(sessions)}"
    assert "whole run" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_today_s_adapters_are_found_with_their_test_folders_and_extras() -> None:
    framework = NOXFILE.Framework
    assert list(NOXFILE.FRAMEWORKS) == ["core", "equinox", "flax", "haiku", "loggers"]
    assert NOXFILE.FRAMEWORKS["flax"] == framework(
        ["./packages/ciclo-flax", "clu"], ["tests/adapters/flax"], ["ciclo_flax"]
    )
    assert NOXFILE.FRAMEWORKS["haiku"] == framework(
        ["./packages/ciclo-haiku"], ["tests/adapters/haiku"], ["ciclo_haiku"]
    )
    assert NOXFILE.ADAPTERS == ["./packages/ciclo-equinox", "./packages/ciclo-flax", "./packages/ciclo-haiku"]
    assert NOXFILE.OWN == ["ciclo-core", "ciclo-equinox", "ciclo-flax", "ciclo-haiku", "ciclo-stax"]
    assert NOXFILE.TYPED["ciclo-equinox"] == "packages/ciclo-equinox/src"


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    """A copy of the repository's noxfile and packages' pyproject.toml files: the matrix's inputs."""
    shutil.copy(ROOT / "noxfile.py", tmp_path / "noxfile.py")
    for pyproject in ROOT.glob("packages/*/pyproject.toml"):
        folder = tmp_path / pyproject.relative_to(ROOT).parent
        folder.mkdir(parents=True)
        shutil.copy(pyproject, folder)
    for tests in ROOT.glob("tests/adapters/*/"):
        (tmp_path / tests.relative_to(ROOT)).mkdir(parents=True)
    return tmp_path


def _package(root: Path, folder: str, entry_points: str) -> None:
    (root / "packages" / folder / "src" / folder.replace("-", "_")).mkdir(parents=True)
    (root / "packages" / folder / "tests").mkdir()
    pyproject = f"""
        [project]
        name = "{folder}"
        version = "0.1.0"
        dependencies = ["ciclo-core"]
        {entry_points}
    """
    (root / "packages" / folder / "pyproject.toml").write_text(textwrap.dedent(pyproject), encoding="utf-8")


def test_a_new_adapter_package_joins_the_matrix_with_no_other_edit(layout: Path) -> None:
    before = load_noxfile(layout)
    assert "mylib" not in before.FRAMEWORKS
    _package(
        layout,
        "ciclo-mylib",
        '[project.entry-points."ciclo.frameworks"]\ncreate_mylib_state = "ciclo_mylib:create"',
    )
    # A library that is no adapter (no ciclo.frameworks entry point) stays out.
    _package(layout, "ciclo-utils", "")

    noxfile = load_noxfile(layout)

    assert noxfile.FRAMEWORKS["mylib"] == noxfile.Framework(
        ["./packages/ciclo-mylib"], ["packages/ciclo-mylib/tests"], ["ciclo_mylib"]
    )
    assert list(noxfile.FRAMEWORKS) == ["core", "equinox", "flax", "haiku", "mylib", "loggers"]
    assert noxfile.ADAPTERS == [
        *before.ADAPTERS,
        "./packages/ciclo-mylib",
    ]  # conformance, examples, docs, ...
    assert sorted(noxfile.OWN) == sorted([*before.OWN, "ciclo-mylib"])  # rebuilt at each run
    assert noxfile.TYPED["ciclo-mylib"] == "packages/ciclo-mylib/src"
    assert all("utils" not in name for name in [*noxfile.FRAMEWORKS, *noxfile.OWN, *noxfile.ADAPTERS])
