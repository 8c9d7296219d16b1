"""The default `nox` run is timed in README.md: each default session has a row in its table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _assigned(tree: ast.Module, name: str) -> ast.expr:
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(target, ast.Name) and target.id == name for target in targets):
            assert node.value is not None
            return node.value
        if any(isinstance(target, ast.Attribute) and ast.unparse(target) == name for target in targets):
            assert node.value is not None
            return node.value
    raise AssertionError(f"noxfile.py assigns no {name}")


def default_sessions() -> list[str]:
    """`nox.options.sessions`, with the parametrized `tests` as one name per framework."""
    tree = ast.parse((ROOT / "noxfile.py").read_text(encoding="utf-8"))
    sessions = ast.literal_eval(_assigned(tree, "nox.options.sessions"))
    frameworks = _assigned(tree, "FRAMEWORKS")
    assert isinstance(frameworks, ast.Dict)
    names = [ast.literal_eval(key) for key in frameworks.keys if key is not None]
    return [
        name
        for session in sessions
        for name in ([f"tests({n})" for n in names] if session == "tests" else [session])
    ]


def timed_sessions() -> list[str]:
    """The sessions of the table in README.md's Development section, in its order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Development", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, re.M)


def test_every_default_session_has_a_row_in_the_readme_timings() -> None:
    sessions, timed = default_sessions(), timed_sessions()
    assert "tests(core)" in sessions and "lint" in sessions
    missing = [name for name in sessions if name not in timed]
    assert not missing, f"README.md's Development table does not time {missing}: run nox and add them"
    assert "whole run" in (ROOT / "README.md").read_text(encoding="utf-8")
