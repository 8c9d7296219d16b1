"""ciclo-haiku: Keras-like training states for haiku functions (see `create_haiku_state`)."""

from importlib.metadata import version as _version

from ciclo_haiku._adapter import HaikuAdapter as HaikuAdapter
from ciclo_haiku._state import create_haiku_state as create_haiku_state

__version__ = _version("ciclo-haiku")

__all__ = ["HaikuAdapter", "__version__", "create_haiku_state"]
