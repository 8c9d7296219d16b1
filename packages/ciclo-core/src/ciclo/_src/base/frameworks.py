"""Framework adapters, found by entry point (group `ciclo.frameworks`): loaded on first use."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from ciclo._src.base.reprs import short

KNOWN_ADAPTERS = {
    "create_flax_state": "ciclo-flax",
    "create_haiku_state": "ciclo-haiku",
    "create_equinox_state": "ciclo-equinox",
}


def framework_entry_points() -> dict[str, Any]:
    return {point.name: point for point in entry_points(group="ciclo.frameworks")}


def resolve(name: str) -> Any:
    """Loads the adapter function registered as `name`; an AttributeError (saying what to install) if none.

    Example:
        >>> resolve("create_nothing_state")
        Traceback (most recent call last):
        ...
        AttributeError: module 'ciclo' has no attribute 'create_nothing_state'
    """
    point = framework_entry_points().get(name)
    if point is not None:
        return point.load()
    package = KNOWN_ADAPTERS.get(name)
    if package is not None:
        raise AttributeError(
            f"ciclo.{name} is provided by the {package} package, which is not installed: "
            f"pip install {package}"
        )
    raise AttributeError(f"module 'ciclo' has no attribute {short(name)}")


def creator_name(adapter: object) -> str:
    """The `create_*_state` entry point of the adapter's package, else `"create_model_state"`.

    Example:
        >>> creator_name(object())
        'create_model_state'
    """
    package = type(adapter).__module__.partition(".")[0]
    for name, point in sorted(framework_entry_points().items()):
        if point.value.partition(":")[0].partition(".")[0] == package:
            return str(name)
    return "create_model_state"
