"""Strategies by name: the table of built-ins, registration, and the errors."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import STRATEGIES

import ciclo
from ciclo._src.strategies import _registry
from ciclo.strategies import FSDP, JIT, DataParallel, DeviceReductions, Eager, PMap


def _methods(protocol: type) -> list[str]:
    return sorted(
        name for name in vars(protocol) if not name.startswith("_") and callable(vars(protocol)[name])
    )


STRATEGY_METHODS = _methods(ciclo.strategies.Strategy)
REDUCTION_METHODS = _methods(DeviceReductions)


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(_registry, "_strategies", dict(_registry._strategies))
    yield


def test_every_built_in_strategy_is_under_test(clean_registry: None) -> None:
    assert ciclo.strategies.strategy_names() == sorted(STRATEGIES)


def test_the_protocols_are_small() -> None:
    assert STRATEGY_METHODS == ["compile", "create", "lift_batch", "place", "unplace"]
    assert REDUCTION_METHODS == ["reduce_grads", "reduce_logs", "reduce_metric", "reduce_model_state"]


def test_built_ins_implement_the_protocol(strategy: str) -> None:
    instance = ciclo.strategies.get_strategy(strategy)
    assert isinstance(instance, ciclo.strategies.Strategy)
    for method in STRATEGY_METHODS:
        assert callable(getattr(instance, method)), method
    assert hash(instance) == hash(ciclo.strategies.get_strategy(strategy))
    # Only pmap runs one program per device and reduces inside the step.
    assert isinstance(instance, DeviceReductions) == isinstance(instance, PMap)
    if isinstance(instance, PMap):
        for method in REDUCTION_METHODS:
            assert callable(getattr(instance, method)), method


@pytest.mark.parametrize("instance", [Eager(), JIT(), DataParallel(), FSDP(), PMap()], ids=repr)
def test_built_in_classes_are_final_frozen_strategies(instance: ciclo.strategies.Strategy) -> None:
    assert isinstance(instance, ciclo.strategies.Strategy)
    with pytest.raises(AttributeError):
        instance.donate = True  # type: ignore[attr-defined]


def test_an_object_that_is_not_a_strategy_is_refused() -> None:
    class Old:
        def compile(self, step: object, *, donate: bool = False) -> object:
            return step

    with pytest.raises(TypeError, match="is not a strategy: it has no create, place, unplace, lift_batch"):
        ciclo.strategies.get_strategy(Old())  # type: ignore[arg-type]


def test_names_with_dashes_and_objects_resolve() -> None:
    assert ciclo.strategies.get_strategy("data-parallel") == DataParallel()
    assert ciclo.strategies.get_strategy("jit_donate") == JIT(donate=True)
    fsdp = FSDP(min_size=8)
    assert ciclo.strategies.get_strategy(fsdp) is fsdp


def test_unknown_names_list_the_known_ones(clean_registry: None) -> None:
    with pytest.raises(
        ValueError, match="unknown strategy 'tpu'; known strategies: data_parallel, eager, fsdp"
    ):
        ciclo.strategies.get_strategy("tpu")


def test_register_as_function_and_decorator(clean_registry: None) -> None:
    factory = ciclo.strategies.register_strategy("fsdp_small", lambda: FSDP(min_size=16))
    assert ciclo.strategies.get_strategy("fsdp-small") == FSDP(min_size=16) == factory()

    @ciclo.strategies.register_strategy("jit2")
    def make() -> ciclo.strategies.Strategy:
        return JIT(donate=True)

    assert ciclo.strategies.get_strategy("jit2") == JIT(donate=True)
    assert ciclo.strategies.strategy_names() == sorted([*STRATEGIES, "fsdp_small", "jit2"])


@pytest.mark.parametrize("name", ["jit", "data-parallel", "mine"])
def test_a_name_is_taken_once(clean_registry: None, name: str) -> None:
    ciclo.strategies.register_strategy("mine", Eager)
    with pytest.raises(ValueError, match="is already registered"):
        ciclo.strategies.register_strategy(name, Eager)
