"""The API reference pages, generated from the `__all__` of ciclo and of each adapter package.

An mkdocs hook (`hooks:` in mkdocs.yml): `on_files` adds the pages under
`reference/`, so a name added to an `__all__` is documented without editing a
page. Each name goes to the page of the private module that defines it (a
`from ciclo._src.base.schedules import every as every` line puts `every` on the
schedules page); a name from a module no topic claims is listed on the
reference's index page. The names are read from the sources with `ast`, so
generating the pages imports neither ciclo nor JAX.
"""

from __future__ import annotations

import ast
import dataclasses
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ENTRY_POINT_GROUP = "ciclo.frameworks"
"""The entry points that make a package under packages/ an adapter package (as noxfile.py finds them)."""


@dataclasses.dataclass(frozen=True)
class AdapterPackage:
    """A package under packages/ that declares a `ciclo.frameworks` entry point."""

    distribution: str  # "ciclo-flax"
    modules: tuple[str, ...]  # the top-level modules its entry points name: ("ciclo_flax",)
    source: Path  # the folder holding those modules: its src/, else the package's folder


def adapter_packages(root: Path = ROOT) -> list[AdapterPackage]:
    """Every adapter package under `root`/packages, found as noxfile.py's `adapter_packages` finds them.

    A new adapter package is in the reference (and in the matrix) by existing.
    """
    found = []
    for pyproject in sorted((root / "packages").glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        points = project.get("entry-points", {}).get(ENTRY_POINT_GROUP, {})
        if not points:
            continue  # ciclo-core, or a library that is not an adapter
        folder = pyproject.parent
        modules = tuple(sorted({value.split(":")[0].split(".")[0].strip() for value in points.values()}))
        source = folder / "src" if (folder / "src").is_dir() else folder
        found.append(AdapterPackage(project["name"], modules, source))
    return found


ADAPTER_PACKAGES = adapter_packages()
ADAPTERS = tuple(module for package in ADAPTER_PACKAGES for module in package.modules)
"""The adapter packages' modules: the `adapters.md` page documents their `__all__`."""
PACKAGES = {
    "ciclo": ROOT / "packages/ciclo-core/src/ciclo",
    **{module: package.source / module for package in ADAPTER_PACKAGES for module in package.modules},
}
SOURCES = [ROOT / "packages/ciclo-core/src", *(package.source for package in ADAPTER_PACKAGES)]
"""The folders mkdocstrings must read the packages from: the `paths` of its python handler in mkdocs.yml."""


@dataclasses.dataclass(frozen=True)
class Topic:
    """One reference page: the names whose defining module starts with one of `modules`."""

    page: str
    title: str
    intro: str
    modules: tuple[str, ...]
    names: tuple[str, ...] = ()  # paths claimed whatever module defines them: `ciclo.loop` on loop.md
    first: tuple[str, ...] = ()  # the page's main names, in this order, before all others


TOPICS = [
    Topic(
        "loop.md",
        "The loop",
        "`ciclo.loop`, its engine `ciclo.run_phases` and what callbacks see. "
        "Guide: [the loop language](../guide.md).",
        ("ciclo._src.engine.phases", "ciclo._src.engine.loop_state", "ciclo._src.logs.step_output"),
        names=("ciclo.loop",),
        first=("ciclo.loop",),
    ),
    Topic(
        "loops.md",
        "Predefined loops",
        "`train_loop`, `test_loop`, `predict_loop` and the hook vocabulary they run. "
        "Guide: [predefined loops](../loops.md).",
        ("ciclo._src.loops.predefined", "ciclo._src.loops.hooks", "ciclo.hooks"),
        first=("ciclo.train_loop", "ciclo.test_loop", "ciclo.predict_loop"),
    ),
    Topic(
        "time.md",
        "Time and schedules",
        "Counting steps, samples and seconds, and deciding when a callback runs.",
        ("ciclo._src.base.elapsed", "ciclo._src.base.schedules"),
    ),
    Topic(
        "logs.md", "Logs and history", "What steps log and what the loop keeps.", ("ciclo._src.logs.logs",)
    ),
    Topic(
        "callbacks.md",
        "Callbacks",
        "Progress bars, checkpoints, early stopping, inner loops, loggers.",
        ("ciclo._src.callbacks",),
    ),
    Topic(
        "fused.md",
        "Fused steps",
        "Several steps per dispatch. Guide: [fused steps](../guide.md#fused-steps).",
        ("ciclo._src.base.batches", "ciclo._src.data.fused"),
    ),
    Topic(
        "data.md",
        "Data",
        "Batches put on their devices ahead of the step. Guide: [data pipelines](../data.md).",
        ("ciclo._src.data.prefetch",),
    ),
    Topic(
        "states.md",
        "Model states and metrics",
        "Keras-like states for any model, and the metrics they accumulate. "
        "Guides: [frameworks](../frameworks/index.md), [metrics](../metrics.md).",
        (
            "ciclo._src.state.model_state",
            "ciclo._src.state.metrics",
            "ciclo._src.base.frameworks",
            "ciclo.metrics",
        ),
        first=("ciclo.create_model_state",),
    ),
    Topic(
        "managed.md",
        "The managed API",
        "Steps that only compute losses. Guide: [strategies](../strategies.md).",
        ("ciclo.managed", "ciclo._src.state.managed", "ciclo._src.base.roles"),
    ),
    Topic(
        "strategies.md",
        "Strategies",
        "Where states and batches live and how steps compile. Guide: [strategies](../strategies.md).",
        ("ciclo.strategies", "ciclo._src.strategies"),
    ),
    Topic(
        "types.md",
        "Protocols and types",
        "The small protocols the pieces meet through.",
        ("ciclo._src.base.types", "ciclo.types"),
    ),
    Topic(
        "testing.md",
        "Checking an adapter",
        "The conformance kit for framework authors. Guide: [writing an adapter](../adapter.md).",
        ("ciclo.testing", "ciclo._src.testing"),
    ),
    Topic(
        "adapters.md",
        "Framework adapters",
        f"The packages {', '.join(package.distribution for package in ADAPTER_PACKAGES)}. "
        "Guide: [frameworks](../frameworks/index.md).",
        ADAPTERS,
    ),
]
INDEX = "index.md"


@dataclasses.dataclass(frozen=True)
class Name:
    """A public name: `path` is how users reach it, `source` the module that defines it."""

    path: str
    source: str
    is_module: bool
    original: str  # the name in `source` (an import may rename it)

    @property
    def identity(self) -> tuple[str, str]:
        """The object this name reaches: its defining module and name, whichever path reaches it."""
        return (self.source, self.original) if not self.is_module else (self.source, "")


def _module_file(module: str) -> Path:
    package, *rest = module.split(".")
    base = PACKAGES[package].joinpath(*rest)
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def public_names(module: str) -> list[Name]:
    """The names of `module.__all__`, in `__all__`'s order, with where each is defined.

    The names of a public submodule listed in `__all__` (`ciclo.managed`) follow.
    """
    tree = ast.parse(_module_file(module).read_text(encoding="utf-8"))
    sources: dict[str, tuple[str, bool, str]] = {}
    exported: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                is_module = node.module.split(".")[0] in PACKAGES and _is_module(full)
                source = full if is_module else node.module
                sources[alias.asname or alias.name] = (source, is_module, alias.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id == "__all__":
                    exported = list(ast.literal_eval(node.value))  # type: ignore[arg-type]
                elif isinstance(target, ast.Name):
                    sources.setdefault(target.id, (module, False, target.id))
    names = [Name(f"{module}.{name}", *sources.get(name, (module, False, name))) for name in exported]
    # A submodule's names come after all of the module's own, so that a name both export
    # (`ciclo.strategies.get_strategy`, `ciclo.strategies.get_strategy`) is documented at the shorter path.
    return names + [inner for name in names if name.is_module for inner in public_names(name.source)]


def _is_module(module: str) -> bool:
    try:
        return _module_file(module).is_file()
    except KeyError:
        return False


def topic_of(name: Name) -> Topic | None:
    """The topic that claims `name`'s path, else whose modules claim its source (the longest prefix wins)."""
    for topic in TOPICS:
        if name.path in topic.names:
            return topic
    matches = [
        (len(prefix), topic)
        for topic in TOPICS
        for prefix in topic.modules
        if name.source == prefix or name.source.startswith(prefix + ".")
    ]
    return max(matches, key=lambda match: match[0])[1] if matches else None


FUNCTION, CLASS, OTHER = range(3)
"""The kinds of a page's names, in the order the page shows them: what users call first."""


def kind_of(module: str, original: str, depth: int = 0) -> int:
    """`FUNCTION`, `CLASS` or `OTHER`: how `module` defines `original` at its top level.

    A name `module` imports from another module of the packages is looked up there.
    """
    tree = ast.parse(_module_file(module).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == original:
            return FUNCTION
        if isinstance(node, ast.ClassDef) and node.name == original:
            return CLASS
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and depth < 5:
            for alias in node.names:
                if (alias.asname or alias.name) == original and _is_module(node.module):
                    return kind_of(node.module, alias.name, depth + 1)
    return OTHER


def ordered(topic: Topic, names: list[Name]) -> list[Name]:
    """A page's names: its `first` names, then functions, classes and the rest (constants, aliases).

    Within a kind, the names of `topic.modules`' first module come first, then
    in `__all__`'s order. A submodule's directive (its docstring) goes right
    before the first of its names on the page.
    """

    def module_rank(source: str) -> int:
        ranks = [
            i for i, prefix in enumerate(topic.modules) if source == prefix or source.startswith(prefix + ".")
        ]
        return min(ranks, default=len(topic.modules))

    keys: dict[str, tuple[int, ...]] = {}
    for index, name in enumerate(names):
        if not name.is_module:
            first = topic.first.index(name.path) if name.path in topic.first else len(topic.first)
            keys[name.path] = (first, kind_of(name.source, name.original), module_rank(name.source), index, 0)
    for name in names:
        if name.is_module:
            members = {inner.identity for inner in public_names(name.source)}
            keys[name.path] = (
                *min(
                    keys[other.path] for other in names if not other.is_module and other.identity in members
                )[:4],
                -1,
            )
    return sorted(names, key=lambda name: keys[name.path])


def _directive(name: Name) -> str:
    # A submodule gets its docstring only: its names follow, each under its own heading.
    options = "\n    options:\n      members: false" if name.is_module else ""
    return f"::: {name.path}{options}\n"


def pages(packages: tuple[str, ...] = tuple(PACKAGES)) -> dict[str, str]:
    """`{path under reference/: markdown}` for every public name of `packages`."""
    by_topic: dict[str, list[Name]] = {topic.page: [] for topic in TOPICS}
    unclaimed: list[Name] = []
    everything: list[tuple[Name, str]] = []  # (name, where its documentation is: page#anchor)
    documented: dict[tuple[str, str], str] = {}
    for package in packages:
        for name in public_names(package):
            if name.path.endswith(".__version__"):
                continue  # each package's version, read from its metadata: nothing to document
            if name.identity in documented:  # the same object under a second path: link to the first
                everything.append((name, documented[name.identity]))
                continue
            topic = topic_of(name)
            if topic is None:
                unclaimed.append(name)
            else:
                by_topic[topic.page].append(name)
            documented[name.identity] = f"{topic.page if topic else INDEX}#{name.path}"
            everything.append((name, documented[name.identity]))

    result = {}
    for topic in TOPICS:
        blocks = [f"# {topic.title}\n", f"{topic.intro}\n"]
        # Functions first (what users call: `ciclo.train_loop`), then the classes they return, then constants.
        blocks += [_directive(name) for name in ordered(topic, by_topic[topic.page])]
        result[topic.page] = "\n".join(blocks)

    rows = [f"| [`{name.path}`]({target}) | {target.split('.md')[0]} |" for name, target in everything]
    index = [
        "# API reference\n",
        "Every public name of `ciclo` and of the adapter packages, generated from their "
        "docstrings. The pages follow the modules that define the names; this table "
        "lists them all.\n",
        "| name | page |\n|---|---|\n" + "\n".join(rows) + "\n",
    ]
    if unclaimed:
        index.append("## Other names\n")
        index += [_directive(name) for name in unclaimed]
    result[INDEX] = "\n".join(index)
    return result


def on_files(files: Any, config: Any) -> Any:
    """The mkdocs hook: adds the generated pages to the site's files."""
    from mkdocs.structure.files import File

    for path, text in pages().items():
        files.append(File.generated(config, f"reference/{path}", content=text))
    return files


def missing_sources(paths: list[str], config_dir: Path = ROOT) -> list[str]:
    """The folders of `SOURCES` (relative to ROOT) not in mkdocstrings' `paths` (relative to `config_dir`)."""
    given = {(config_dir / path).resolve() for path in paths}
    return [source.relative_to(ROOT).as_posix() for source in SOURCES if source.resolve() not in given]


def on_config(config: Any) -> Any:
    """Refuses a build whose mkdocstrings handler cannot read every package the reference documents."""
    from mkdocs.exceptions import PluginError

    handler = config["plugins"]["mkdocstrings"].config.handlers.get("python", {})
    missing = missing_sources(list(handler.get("paths", [])), Path(config["config_file_path"]).parent)
    if missing:
        raise PluginError(
            f"the API reference documents the adapter packages found under packages/, but mkdocs.yml's "
            f"mkdocstrings python handler cannot read {missing}: add them to its paths "
            "(plugins > mkdocstrings > handlers > python > paths)"
        )
    return config
