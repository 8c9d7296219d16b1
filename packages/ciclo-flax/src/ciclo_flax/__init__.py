"""ciclo-flax: Keras-like training states for flax linen and nnx models (see `create_flax_state`)."""

from importlib.metadata import version as _version

from ciclo_flax._linen import LinenAdapter as LinenAdapter
from ciclo_flax._nnx import NnxAdapter as NnxAdapter
from ciclo_flax._nnx_training import NnxMetric as NnxMetric
from ciclo_flax._nnx_training import to_nnx as to_nnx
from ciclo_flax._state import create_flax_state as create_flax_state

__version__ = _version("ciclo-flax")

__all__ = ["LinenAdapter", "NnxAdapter", "NnxMetric", "__version__", "create_flax_state", "to_nnx"]
