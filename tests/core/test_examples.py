"""Every example script is run by `nox -s examples` with an accuracy floor, and enforces the floor."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGES = sorted(path.parent for path in (ROOT / "examples").glob("*/pyproject.toml"))
"""Example packages (examples/ciclo-stax, an adapter): tested by their own tests, not run as scripts."""
SCRIPTS = sorted(
    path.relative_to(ROOT).as_posix()
    for path in (ROOT / "examples").rglob("*.py")
    if not any(path.is_relative_to(package) for package in PACKAGES)
)


def _examples_of_the_noxfile() -> dict[str, float]:
    tree = ast.parse((ROOT / "noxfile.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EXAMPLES" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("noxfile.py has no EXAMPLES")


def test_the_examples_session_runs_every_script_with_a_floor() -> None:
    examples = _examples_of_the_noxfile()
    assert sorted(examples) == SCRIPTS
    assert all(0.5 < floor < 1 for floor in examples.values())


def test_every_script_takes_a_floor_and_shows_the_trained_model() -> None:
    for script in SCRIPTS:
        text = (ROOT / script).read_text(encoding="utf-8")
        assert '"--min-accuracy"' in text and "SystemExit" in text, script
        assert "ciclo.checkpoint(" in text and "best.model" in text, script


def test_the_examples_session_runs_the_example_adapter_package_s_tests() -> None:
    (package,) = PACKAGES
    noxfile = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    assert f'EXAMPLE_ADAPTER = "./{package.relative_to(ROOT).as_posix()}"' in noxfile
    assert (package / "tests").is_dir() and (package / "noxfile.py").is_file()
