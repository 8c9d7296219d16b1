"""The built site (`nox -s docs` builds it, then runs this) documents every public name.

mkdocstrings gives each documented object an anchor `id="<its path>"`; a name
reachable at two paths (`ciclo.metrics.Metric` is `ciclo.metrics.Metric`) has one, and
the reference's index links the other path to it. Set CICLO_SITE_DIR to check a
site built elsewhere.
"""

from __future__ import annotations

import html
import importlib
import os
import re
from pathlib import Path
from types import ModuleType

import pytest
from support.docs import reference_hook

import ciclo

SITE = Path(os.environ.get("CICLO_SITE_DIR", Path(__file__).parents[2] / "site"))
MODULES = [ciclo, ciclo.hooks, ciclo.managed, ciclo.metrics, ciclo.strategies, ciclo.types]
ADAPTERS = list(
    reference_hook().ADAPTERS
)  # every adapter package under packages/, as the reference finds them


@pytest.fixture(scope="module")
def anchors() -> set[str]:
    pages = sorted((SITE / "reference").rglob("*.html"))
    assert pages, f"no reference pages under {SITE}: build the site first (nox -s docs)"
    return {anchor for page in pages for anchor in re.findall(r'id="([^"]+)"', page.read_text("utf-8"))}


def _public(module: ModuleType) -> list[str]:
    return [name for name in module.__all__ if name != "__version__"]


@pytest.mark.parametrize("module", MODULES, ids=lambda module: module.__name__)
def test_every_name_has_an_anchor(anchors: set[str], module: ModuleType) -> None:
    missing = [
        name
        for name in _public(module)
        if f"{module.__name__}.{name}" not in anchors
        # documented at its shorter path
        and not (
            module is not ciclo and name in ciclo.__all__ and getattr(ciclo, name) is getattr(module, name)
        )
    ]
    assert missing == []


@pytest.mark.parametrize("name", ADAPTERS)
def test_every_adapter_name_has_an_anchor(anchors: set[str], name: str) -> None:
    module = importlib.import_module(name)  # nox -s docs installs every adapter
    assert [n for n in _public(module) if f"{name}.{n}" not in anchors] == []


def test_every_page_of_the_nav_was_built() -> None:
    for page in ("getting-started", "guide", "loops", "metrics", "strategies", "frameworks", "adapter"):
        assert (SITE / page / "index.html").is_file(), page
    # "Add your framework" includes examples/ciclo-stax's files (pymdownx.snippets).
    framework = (SITE / "frameworks/add_your_framework/index.html").read_text("utf-8")
    assert "StaxAdapter" in framework and "JAX_VERSIONS" in framework and "--8&lt;--" not in framework
    assert (SITE / "performance/index.html").read_text("utf-8").count("ratio to bare") >= 3


def test_signatures_are_formatted_over_several_lines() -> None:
    page = (SITE / "reference/loops/index.html").read_text("utf-8")
    start = page.index('id="ciclo.train_loop"')
    signature = re.search(r'class="doc-signature highlight"><pre>(.*?)</pre>', page[start:], re.DOTALL)
    assert signature is not None
    text = html.unescape(re.sub(r"<[^>]+>", "", signature[1]))
    assert text.startswith("train_loop(\n") and text.count("\n") > 10, text
    assert max(map(len, text.splitlines())) <= 88
