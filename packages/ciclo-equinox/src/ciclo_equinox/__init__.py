"""ciclo-equinox: Keras-like training states for equinox modules (see `create_equinox_state`)."""

from importlib.metadata import version as _version

from ciclo_equinox._adapter import EquinoxAdapter as EquinoxAdapter
from ciclo_equinox._state import create_equinox_state as create_equinox_state

__version__ = _version("ciclo-equinox")

__all__ = ["EquinoxAdapter", "__version__", "create_equinox_state"]
