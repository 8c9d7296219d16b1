"""Strategies: where a managed step's state and batches live and how the step compiles (by name or object).

Example:
    >>> import ciclo
    >>> ciclo.strategies.FSDP(min_size=4096) == ciclo.strategies.get_strategy("fsdp")
    False
"""

from ciclo._src.strategies._local import JIT as JIT
from ciclo._src.strategies._local import Eager as Eager
from ciclo._src.strategies._pmap import PMap as PMap
from ciclo._src.strategies._protocols import DeviceReductions as DeviceReductions
from ciclo._src.strategies._protocols import Strategy as Strategy
from ciclo._src.strategies._registry import StrategyFactory as StrategyFactory
from ciclo._src.strategies._registry import get_strategy as get_strategy
from ciclo._src.strategies._registry import register_strategy as register_strategy
from ciclo._src.strategies._registry import strategy_names as strategy_names
from ciclo._src.strategies._sharding import FSDP as FSDP
from ciclo._src.strategies._sharding import DataParallel as DataParallel
from ciclo._src.strategies._sharding import MeshParallel as MeshParallel

__all__ = [
    "DataParallel",
    "DeviceReductions",
    "Eager",
    "FSDP",
    "JIT",
    "MeshParallel",
    "PMap",
    "Strategy",
    "StrategyFactory",
    "get_strategy",
    "register_strategy",
    "strategy_names",
]
