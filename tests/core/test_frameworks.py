"""Adapters resolve lazily by entry point; a missing one says what to install."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ciclo
from ciclo._src.base import frameworks


class FakeEntryPoint:
    def __init__(self, value: object) -> None:
        self.value = value

    def load(self) -> object:
        return self.value


@pytest.fixture
def no_adapters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frameworks, "framework_entry_points", dict)
    for name in frameworks.KNOWN_ADAPTERS:
        monkeypatch.delitem(vars(ciclo), name, raising=False)


@pytest.mark.parametrize(("name", "package"), sorted(frameworks.KNOWN_ADAPTERS.items()))
def test_a_missing_adapter_names_the_package_to_install(no_adapters: None, name: str, package: str) -> None:
    with pytest.raises(AttributeError, match=f"pip install {package}$"):
        getattr(ciclo, name)


def test_an_installed_adapter_resolves_once(monkeypatch: pytest.MonkeyPatch) -> None:
    def create_mylib_state() -> str:
        return "state"

    calls = []

    def entry_points() -> dict[str, FakeEntryPoint]:
        calls.append(1)
        return {"create_mylib_state": FakeEntryPoint(create_mylib_state)}

    monkeypatch.setattr(frameworks, "framework_entry_points", entry_points)
    monkeypatch.delitem(vars(ciclo), "create_mylib_state", raising=False)
    assert ciclo.create_mylib_state is create_mylib_state  # type: ignore[attr-defined]
    assert ciclo.create_mylib_state is create_mylib_state  # type: ignore[attr-defined]
    assert len(calls) == 1
    monkeypatch.delitem(vars(ciclo), "create_mylib_state")


def test_unknown_names_raise_the_usual_error(no_adapters: None) -> None:
    with pytest.raises(AttributeError, match="module 'ciclo' has no attribute 'nothing'"):
        ciclo.nothing  # type: ignore[attr-defined]  # noqa: B018
    assert not hasattr(ciclo, "__wrapped__")


def test_installed_entry_points_are_shipped_adapters_or_this_test_knows_them() -> None:
    # Each environment has core plus at most the adapters nox installed in it.
    assert set(frameworks.framework_entry_points()) <= set(frameworks.KNOWN_ADAPTERS)


def test_adapters_pin_the_core_of_their_own_version() -> None:
    # The packages release in lockstep: each adapter's version is the core's, and it pins that core.
    packages = Path(__file__).parents[2] / "packages"
    core = re.search(r'^version = "(.+)"$', (packages / "ciclo-core" / "pyproject.toml").read_text(), re.M)
    assert core is not None and core[1] == ciclo.__version__
    for name in frameworks.KNOWN_ADAPTERS.values():
        text = (packages / name / "pyproject.toml").read_text()
        assert f'version = "{core[1]}"' in text, name
        assert f'"ciclo-core=={core[1]}"' in text, name
        entry = next(key for key, value in frameworks.KNOWN_ADAPTERS.items() if value == name)
        assert f'{entry} = "{name.replace("-", "_")}:{entry}"' in text, name
