"""The pages a newcomer reads first say what to install, and read as they are outside the built site."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
EXTRAS = sorted(
    tomllib.loads((ROOT / "packages/ciclo-core/pyproject.toml").read_text("utf-8"))["project"][
        "optional-dependencies"
    ]
)
STAX = ROOT / "docs/frameworks/add_your_framework.md"


@pytest.mark.parametrize("page", ["index.md", "getting-started.md"])
def test_the_first_pages_name_every_extra_and_what_the_examples_need(page: str) -> None:
    text = (ROOT / "docs" / page).read_text("utf-8")
    assert [extra for extra in EXTRAS if f"[{extra}]" not in text] == []
    assert "scikit-learn" in text


def test_the_index_says_what_each_extra_brings() -> None:
    rows = dict(re.findall(r"^\| `\[(\w+)\]` \| (.+?) \|", (ROOT / "docs/index.md").read_text("utf-8"), re.M))
    assert sorted(rows) == EXTRAS


def test_add_your_framework_reads_without_the_site_build() -> None:
    # GitHub and a checkout show a snippet include as its raw line: the files are quoted in full instead,
    # and each quoted file is the example's, as it is.
    text = STAX.read_text("utf-8")
    assert "--8<--" not in text
    quoted = re.findall(r'^```\{\.\w+ title="(ciclo-stax/[^"]+)"\}\n(.*?)^```$', text, re.M | re.S)
    assert {name for name, _ in quoted} == {
        "ciclo-stax/pyproject.toml",
        "ciclo-stax/src/ciclo_stax/__init__.py",
        "ciclo-stax/tests/test_adapter.py",
        "ciclo-stax/noxfile.py",
    }
    for name, code in quoted:
        assert code == (ROOT / "examples" / name).read_text("utf-8"), f"{name} differs from examples/{name}"
    # The example is linked where it is in this repository, not at an address upstream lacks.
    links = re.findall(r"\]\(([^)]*ciclo-stax[^)]*)\)", text)
    assert links and all(link.startswith("../../examples/ciclo-stax") for link in links)
    assert all((STAX.parent / link).resolve().is_dir() for link in links)
