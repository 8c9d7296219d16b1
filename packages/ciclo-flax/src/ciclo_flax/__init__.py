"""ciclo-flax: Keras-like training states for flax linen and nnx models (see `create_flax_state`)."""

import typing as _typing
from importlib import import_module as _import_module
from importlib.metadata import version as _version

from ciclo_flax._linen import LinenAdapter as LinenAdapter
from ciclo_flax._state import create_flax_state as create_flax_state

if _typing.TYPE_CHECKING:
    from ciclo_flax._nnx import NnxAdapter as NnxAdapter
    from ciclo_flax._nnx_training import NnxMetric as NnxMetric
    from ciclo_flax._nnx_training import to_nnx as to_nnx

__version__ = _version("ciclo-flax")

__all__ = ["LinenAdapter", "NnxAdapter", "NnxMetric", "__version__", "create_flax_state", "to_nnx"]

# Imported on first use: flax.nnx takes seconds to import (IPython, treescope), which a linen run skips.
_NNX = {"NnxAdapter": "_nnx", "NnxMetric": "_nnx_training", "to_nnx": "_nnx_training"}


def __getattr__(name: str) -> _typing.Any:
    if name in _NNX:
        return getattr(_import_module(f"ciclo_flax.{_NNX[name]}"), name)
    raise AttributeError(f"module 'ciclo_flax' has no attribute {name!r}")
