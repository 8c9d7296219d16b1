"""The rooms of `ciclo._src` and their import direction (ARCHITECTURE.md)."""

from __future__ import annotations

import ast
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import grimp
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SRC = ROOT / "packages" / "ciclo-core" / "src" / "ciclo" / "_src"


def _layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (contract,) = config["tool"]["importlinter"]["contracts"]
    assert contract["type"] == "layers" and contract["containers"] == ["ciclo._src"]
    return list(contract["layers"])


def test_every_module_lives_in_a_room():
    flat = sorted(path.name for path in SRC.glob("*.py") if path.name != "__init__.py")
    assert flat == []
    rooms = sorted(path.name for path in SRC.iterdir() if (path / "__init__.py").is_file())
    assert rooms == sorted(_layers())


@pytest.mark.parametrize("room", _layers())
def test_each_room_says_what_it_may_import(room):
    doc = ast.get_docstring(ast.parse((SRC / room / "__init__.py").read_text(encoding="utf-8")))
    assert doc, f"{room}/__init__.py has no docstring"
    (line,) = [line for line in doc.splitlines() if line.startswith("May import:")]
    below = _layers()[_layers().index(room) + 1 :]
    said = line.removeprefix("May import:").strip().rstrip(".")
    if said == "every other room":
        assert below == _layers()[1:]
    elif said.startswith("nothing"):
        assert below == []
    else:
        assert [name.strip() for name in said.split(",")] == below


def test_the_import_direction_holds():
    """import-linter's layers contract in pyproject.toml: a room imports only the rooms below it."""
    executable = shutil.which("lint-imports", path=str(pathlib.Path(sys.executable).parent))
    assert executable, "import-linter is in the test dependency group"
    result = subprocess.run([executable], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def test_no_module_imports_itself_through_others():
    """No import cycle, lazy and TYPE_CHECKING imports included (grimp, import-linter's graph)."""
    graph = grimp.build_graph("ciclo")
    cycles = sorted(
        (importer, imported)
        for importer in graph.modules
        for imported in graph.find_modules_directly_imported_by(importer)
        if graph.find_shortest_chain(importer=imported, imported=importer) is not None
    )
    assert cycles == []


def loop_state_privates_outside_engine(packages: pathlib.Path) -> list[str]:
    """`loop_state._x` read or written outside `engine/`: the engine's slots are its own."""
    pattern = re.compile(r"loop_state\._[a-z]")
    return [
        f"{path.relative_to(packages)}:{number}: {line.strip()}"
        for path in sorted(packages.rglob("*.py"))
        if "engine" not in path.relative_to(packages).parts
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]


def test_no_underscore_slot_of_a_loop_state_is_used_outside_the_engine(tmp_path):
    assert loop_state_privates_outside_engine(ROOT / "packages") == []
    # It can fail: a callback reading the engine's clock is found.
    (tmp_path / "callbacks").mkdir()
    (tmp_path / "callbacks" / "peek.py").write_text("steps = loop_state._clock.steps\n")
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "own.py").write_text("loop_state._clock = None\n")
    assert loop_state_privates_outside_engine(tmp_path) == [
        "callbacks/peek.py:1: steps = loop_state._clock.steps"
    ]
