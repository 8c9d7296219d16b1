"""The conformance kit for framework authors: check a `ciclo.types.ModelAdapter` against its contract.

`check_adapter` runs every clause and returns an `AdapterReport`; `AdapterTests` is the same as a
pytest class to subclass (`pip install "ciclo-core[testing]"`). See docs/adapter.md.

Example:
    >>> import ciclo.testing
    >>> ciclo.testing.CLAUSES[:3]
    ('protocol', 'init_kinds', 'deterministic_evaluation')
"""

import typing as _typing

from ciclo._src.testing.kit import CLAUSES as CLAUSES
from ciclo._src.testing.kit import AdapterReport as AdapterReport
from ciclo._src.testing.kit import check_adapter as check_adapter

if _typing.TYPE_CHECKING:
    from ciclo._src.testing.pytest_class import AdapterTests as AdapterTests

__all__ = ["AdapterReport", "AdapterTests", "CLAUSES", "check_adapter"]


def __getattr__(name: str) -> _typing.Any:
    # AdapterTests imports pytest, which check_adapter does not need: it loads on first use.
    if name == "AdapterTests":
        from ciclo._src.testing.pytest_class import AdapterTests

        return AdapterTests
    raise AttributeError(f"module 'ciclo.testing' has no attribute {name!r}")
