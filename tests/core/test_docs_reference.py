"""The API reference (docs/hooks/reference.py) documents every public name of ciclo and of the adapters.

The pages are generated from each package's `__all__`, so a new name needs no
edit; these tests check that the generator misses none, that each name lands on
the page of the module that defines it, and that every page is in the site's nav.
tests/docs_site checks the built site itself.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest
from support.docs import DOCS, reference_hook
from support.optional import optional

import ciclo

reference = reference_hook()
ADAPTERS = [module for name in reference.ADAPTERS if (module := optional(name))]
PAGES = reference.pages()
DIRECTIVES = {path: re.findall(r"^::: (\S+)$", text, re.MULTILINE) for path, text in PAGES.items()}
DOCUMENTED = {name: path for path, names in DIRECTIVES.items() for name in names}
NAMES = {name.path: name for package in reference.PACKAGES for name in reference.public_names(package)}
TOPICS = [(topic.page, topic) for topic in reference.TOPICS] + [
    (reference.INDEX, reference.Topic("", "", "", ()))
]


@pytest.mark.parametrize("module", [ciclo, *ADAPTERS], ids=lambda module: module.__name__)
def test_every_public_name_has_a_reference_entry(module: ModuleType) -> None:
    missing = [
        name
        for name in module.__all__
        if name != "__version__" and f"{module.__name__}.{name}" not in DOCUMENTED
    ]
    assert missing == []


@pytest.mark.parametrize(
    "module", [ciclo.hooks, ciclo.managed, ciclo.metrics, ciclo.strategies, ciclo.types], ids=str
)
def test_a_public_submodule_s_names_are_documented_once(module: ModuleType) -> None:
    for name in module.__all__:
        value = getattr(module, name)
        documented_as = [path for path in DOCUMENTED if path.rsplit(".", 1)[1] == name]
        # A name re-exported by ciclo too (ciclo.metrics.Metric, ciclo.metrics.Metric) is documented once.
        assert len(documented_as) >= 1 or isinstance(value, type(None)), name
        assert f"{module.__name__}.{name}" in DOCUMENTED or getattr(ciclo, name, None) is value, name
        assert f"[`{module.__name__}.{name}`]" in PAGES["index.md"]  # and listed in the index table


def test_no_object_is_documented_twice() -> None:
    assert len(DOCUMENTED) == sum(len(names) for names in DIRECTIVES.values())
    assert "ciclo.managed.ModelState" not in DOCUMENTED  # it is ciclo.types.ModelState, on the states page


def test_names_land_on_the_page_of_their_module() -> None:
    assert DOCUMENTED["ciclo.every"] == "time.md"
    assert DOCUMENTED["ciclo.train_loop"] == "loops.md"
    assert DOCUMENTED["ciclo.on_train_step"] == "loops.md"
    assert DOCUMENTED["ciclo.hooks.on_predict_step"] == "loops.md"
    assert DOCUMENTED["ciclo.keras_bar"] == "callbacks.md"
    assert DOCUMENTED["ciclo.strategies.DataParallel"] == "strategies.md"
    assert DOCUMENTED["ciclo.prefetch_to_device"] == "data.md"
    assert DOCUMENTED["ciclo.managed.train_step"] == "managed.md"
    assert DOCUMENTED["ciclo_flax.create_flax_state"] == "adapters.md"
    assert DOCUMENTED["ciclo.loop"] == "loop.md"  # claimed by name: it is defined with the predefined loops


def test_each_page_opens_with_its_main_functions() -> None:
    loops = DIRECTIVES["loops.md"]
    assert loops[:3] == ["ciclo.train_loop", "ciclo.test_loop", "ciclo.predict_loop"]
    # ciclo.hooks' docstring opens its first name, the function collect (defined with the hook names);
    # the hook names are constants: they follow the functions and the classes.
    assert (
        loops.index("ciclo.hooks")
        < loops.index("ciclo.hooks.collect")
        < loops.index("ciclo.types.LoopSettings")
        < loops.index("ciclo.hooks.on_predict_step")
    )
    assert DIRECTIVES["loop.md"][0] == "ciclo.loop"
    assert DIRECTIVES["states.md"][0] == "ciclo.create_model_state"
    callbacks = DIRECTIVES["callbacks.md"]
    assert callbacks.index("ciclo.checkpoint") < callbacks.index("ciclo.types.Checkpoint")
    for topic in reference.TOPICS:  # after the main names: functions, classes, then constants
        names = [NAMES[path] for path in DIRECTIVES[topic.page] if path not in topic.first]
        kinds = [reference.kind_of(name.source, name.original) for name in names if not name.is_module]
        assert kinds == sorted(kinds), topic.page


def test_every_page_is_in_the_nav_and_every_nav_page_exists() -> None:
    config = (DOCS.parent / "mkdocs.yml").read_text(encoding="utf-8")
    nav = re.findall(r"^\s*- (?:[^:\n]+: )?(\S+\.md)$", config, re.MULTILINE)
    generated = {f"reference/{path}" for path in PAGES}
    written = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")}
    assert generated <= set(nav)
    assert set(nav) <= generated | written
    assert written - set(nav) == set(), "pages missing from mkdocs.yml's nav"


def test_the_reference_is_read_from_the_sources_without_importing() -> None:
    names = reference.public_names("ciclo")
    assert [name.path for name in names[:3]] == [f"ciclo.{name}" for name in ciclo.__all__[:3]]
    assert Path(reference.PACKAGES["ciclo"], "__init__.py").is_file()


def test_a_new_adapter_package_joins_the_reference_by_existing(tmp_path: Path) -> None:
    # Found as noxfile.py's adapter_packages finds it: a ciclo.frameworks entry point in its pyproject.toml.
    package = tmp_path / "packages/ciclo-foo"
    (package / "src/ciclo_foo").mkdir(parents=True)
    (package / "pyproject.toml").write_text(
        '[project]\nname = "ciclo-foo"\n[project.entry-points."ciclo.frameworks"]\n'
        'foo = "ciclo_foo._adapter:FooAdapter"\n',
        encoding="utf-8",
    )
    (tmp_path / "packages/ciclo-core").mkdir()
    (tmp_path / "packages/ciclo-core/pyproject.toml").write_text('[project]\nname = "ciclo-core"\n', "utf-8")
    found = reference.adapter_packages(tmp_path)
    assert [(p.distribution, p.modules, p.source) for p in found] == [
        ("ciclo-foo", ("ciclo_foo",), package / "src")
    ]
    assert {"ciclo_flax", "ciclo_haiku", "ciclo_equinox"} <= set(reference.ADAPTERS)


def test_mkdocstrings_reads_every_package_the_reference_documents() -> None:
    # mkdocs.yml's handler paths are static: the docs build refuses (on_config) when one is missing.
    config = (DOCS.parent / "mkdocs.yml").read_text(encoding="utf-8")
    (paths,) = re.findall(r"^\s*paths: \[(.*)\]$", config, re.MULTILINE)
    listed = [path.strip() for path in paths.split(",")]
    assert reference.missing_sources(listed) == [], "add them to mkdocs.yml's mkdocstrings python paths"
    assert reference.missing_sources(listed[:-1]) == [listed[-1]]
