"""ciclo-flax: Keras-like training states for flax linen and nnx models (see `create_flax_state`)."""

from importlib.metadata import version as _version

from ciclo_flax._linen import LinenAdapter as LinenAdapter
from ciclo_flax._nnx import NnxAdapter as NnxAdapter
from ciclo_flax._state import create_flax_state as create_flax_state

__version__ = _version("ciclo-flax")

__all__ = ["LinenAdapter", "NnxAdapter", "__version__", "create_flax_state"]
