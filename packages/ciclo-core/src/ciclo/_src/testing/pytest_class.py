"""`AdapterTests`: the clauses of `check_adapter` as a pytest class, one test per clause."""

from __future__ import annotations

import abc
import inspect
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, cast

from ciclo._src.base.types import ModelAdapter
from ciclo._src.callbacks._loggers._base import import_extra
from ciclo._src.testing.kit import CLAUSES, Kit, KitOptions

pytest = import_extra("pytest", "testing", "ciclo.testing.AdapterTests")


class AdapterTests(abc.ABC):
    """Subclass it in an adapter's own test suite to get one test per clause of `check_adapter`.

    A subclass defines `make_adapter(self)` and `inputs`, and optionally the
    other options of `check_adapter` (class attributes or properties). A clause
    that does not apply is skipped with the reason; the states are built once
    per class. Needs pytest: `pip install "ciclo-core[testing]"`.

    Example:
        >>> import ciclo.testing, jax, jax.numpy as jnp
        >>> class Linear:
        ...     def init(self, key, inputs):
        ...         return {"w": jax.random.normal(key, (inputs.shape[-1], 3)) * 0.1}, None
        ...     def apply(self, params, model_state, inputs, *, key, training):
        ...         return inputs @ params["w"], model_state
        >>> class TestLinear(ciclo.testing.AdapterTests):
        ...     inputs = jnp.zeros((1, 4))
        ...     def make_adapter(self):
        ...         return Linear()
        >>> TestLinear().test_learns()
    """

    inputs: Any
    strategies: Sequence[str] = ("jit",)
    variables: tuple[Any, Any] | None = None
    uses_key: bool | None = None
    has_model_state: bool | None = None
    call_model: Callable[[Any, Any], Any] | None = None
    skip: Mapping[str, str] | None = None

    _kits: ClassVar[dict[type, Kit]] = {}

    @abc.abstractmethod
    def make_adapter(self) -> ModelAdapter:
        """The adapter under test: a subclass defines it."""

    def _check(self, clause: str) -> None:
        cls = type(self)
        if cls not in AdapterTests._kits:
            options = {name: getattr(self, name) for name in KitOptions.__optional_keys__}
            # A function set on the class (`call_model = lambda model, x: ...`) would be bound as a method.
            stored = inspect.getattr_static(self, "call_model")
            if isinstance(stored, types.FunctionType):
                options["call_model"] = stored
            AdapterTests._kits[cls] = Kit(
                self.make_adapter(), inputs=self.inputs, **cast(KitOptions, options)
            )
        why = AdapterTests._kits[cls].run(clause)
        if why is not None:
            pytest.skip(why)


def _clause_test(clause: str) -> Callable[[AdapterTests], None]:
    def test(self: AdapterTests) -> None:
        self._check(clause)

    test.__name__, test.__qualname__ = f"test_{clause}", f"AdapterTests.test_{clause}"
    return test


for _clause in CLAUSES:
    setattr(AdapterTests, f"test_{_clause}", _clause_test(_clause))
