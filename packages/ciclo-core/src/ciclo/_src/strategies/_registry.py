"""Strategies by name: the built-in table and `register_strategy` / `get_strategy`."""

from __future__ import annotations

from collections.abc import Callable
from typing import overload

from ciclo._src.base.reprs import short
from ciclo._src.strategies._local import JIT, Eager
from ciclo._src.strategies._pmap import PMap
from ciclo._src.strategies._protocols import Strategy
from ciclo._src.strategies._sharding import FSDP, DataParallel, MeshParallel, _MeshStrategy

StrategyFactory = Callable[[], Strategy]

_strategies: dict[str, StrategyFactory] = {
    "eager": Eager,
    "jit": JIT,
    "jit_donate": lambda: JIT(donate=True),
    "data_parallel": DataParallel,
    "fsdp": FSDP,
    "mesh": MeshParallel,
    "pmap": PMap,
}
_METHODS = ("create", "place", "unplace", "lift_batch", "compile")


def processes_per_batch(strategy: Strategy) -> int:
    """How many processes' batches make one global batch under `strategy` (1 for one of your own)."""
    return strategy.processes_per_batch() if isinstance(strategy, (_MeshStrategy, PMap)) else 1


def strategy_names() -> list[str]:
    """The names `get_strategy` accepts, built-in and registered, sorted.

    Example:
        >>> import ciclo
        >>> names = {"eager", "jit", "jit_donate", "data_parallel", "fsdp", "pmap"}
        >>> names <= set(ciclo.strategies.strategy_names())
        True
    """
    return sorted(_strategies)


@overload
def register_strategy(name: str) -> Callable[[StrategyFactory], StrategyFactory]: ...


@overload
def register_strategy(name: str, factory: StrategyFactory) -> StrategyFactory: ...


def register_strategy(
    name: str, factory: StrategyFactory | None = None
) -> StrategyFactory | Callable[[StrategyFactory], StrategyFactory]:
    """Makes `get_strategy(name)` (and `strategy=name` everywhere) return `factory()`; a name is taken once.

    Use it as a function or as a class decorator; `-` and `_` are the same in names.

    Example:
        >>> import ciclo
        >>> from ciclo.strategies import DataParallel
        >>> factory = ciclo.strategies.register_strategy("dp_donate", lambda: DataParallel(donate=True))
        >>> ciclo.strategies.get_strategy("dp_donate")
        DataParallel(axis_name='data', donate=True)
    """
    key = canonical_name(name)

    def register(factory: StrategyFactory) -> StrategyFactory:
        if key in _strategies:
            raise ValueError(f"a strategy named {short(name)} is already registered")
        _strategies[key] = factory
        return factory

    return register if factory is None else register(factory)


def get_strategy(strategy: str | Strategy) -> Strategy:
    """The strategy with this name (see `strategy_names`); a strategy object is returned as is.

    Example:
        >>> import ciclo
        >>> ciclo.strategies.get_strategy("data-parallel") == ciclo.strategies.get_strategy("data_parallel")
        True
    """
    if not isinstance(strategy, str):
        if not isinstance(strategy, Strategy):
            missing = [name for name in _METHODS if not callable(getattr(strategy, name, None))]
            raise TypeError(
                f"{short(strategy)} is not a strategy: it has no {', '.join(missing)} "
                f"(see ciclo.strategies.Strategy: {', '.join(_METHODS)})"
            )
        return strategy
    key = canonical_name(strategy)
    factory = _strategies.get(key)
    if factory is None:
        raise ValueError(
            f"unknown strategy {short(strategy)}; known strategies: {', '.join(strategy_names())}"
        )
    return factory()


def canonical_name(name: str) -> str:
    """A strategy's name as the registry keys it: a `-` is read as `_`."""
    return name.replace("-", "_")
