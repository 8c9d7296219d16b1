"""ciclo-flax: Keras-like training states for flax linen and nnx models.

Example:
    >>> import ciclo, flax.linen as nn, jax.numpy as jnp, optax
    >>> state = ciclo.create_flax_state(
    ...     nn.Dense(1),
    ...     inputs=jnp.ones((1, 2)),
    ...     tx=optax.sgd(0.3),
    ...     losses={"mse": lambda preds, target: (preds[:, 0] - target) ** 2},
    ... )
    >>> batch = (jnp.array([[1.0, 0.0], [0.0, 1.0]]), jnp.array([2.0, -1.0]))
    >>> for _ in range(50):
    ...     logs, state = state.train_step(batch)
    >>> float(logs.losses.mse) < 1e-4
    True
"""

from importlib.metadata import version as _version

from ciclo_flax._linen import LinenAdapter as LinenAdapter
from ciclo_flax._nnx import NnxAdapter as NnxAdapter
from ciclo_flax._state import create_flax_state as create_flax_state

__version__ = _version("ciclo-flax")

__all__ = ["LinenAdapter", "NnxAdapter", "__version__", "create_flax_state"]
