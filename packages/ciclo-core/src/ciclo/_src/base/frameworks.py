"""Framework adapters are found by entry point: `ciclo.create_flax_state` and friends load on first use.

An adapter package declares its `create_*_state` function in the entry point
group `ciclo.frameworks` (`create_flax_state = "ciclo_flax:create_flax_state"`).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from ciclo._src.base.reprs import short

KNOWN_ADAPTERS = {
    "create_flax_state": "ciclo-flax",
    "create_haiku_state": "ciclo-haiku",
    "create_equinox_state": "ciclo-equinox",
}
"""The adapters ciclo ships, by the name they take on `ciclo`, with their distribution."""


def framework_entry_points() -> dict[str, Any]:
    """The installed adapters: `{name: entry point}`, e.g. `{"create_flax_state": ...}`."""
    return {point.name: point for point in entry_points(group="ciclo.frameworks")}


def resolve(name: str) -> Any:
    """Loads the adapter function registered as `name`.

    Raises:
        AttributeError: when nothing is registered as `name`; for one of the
            adapters ciclo ships, the message says which package to install.

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
    """The `create_*_state` a state with this model adapter is made with: its package's entry point.

    An adapter of a package that declares a `ciclo.frameworks` entry point
    (`ciclo_flax`'s adapters: `"create_flax_state"`); `"create_model_state"`
    for any other.

    Example:
        >>> creator_name(object())
        'create_model_state'
    """
    package = type(adapter).__module__.partition(".")[0]
    for name, point in sorted(framework_entry_points().items()):
        if point.value.partition(":")[0].partition(".")[0] == package:
            return str(name)
    return "create_model_state"
