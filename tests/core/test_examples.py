"""Every example script is run by `nox -s examples` with an accuracy floor, and enforces the floor."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
SCRIPTS = sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "examples").rglob("*.py"))


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
