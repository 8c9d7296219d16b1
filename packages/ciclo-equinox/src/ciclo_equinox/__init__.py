"""ciclo-equinox: Keras-like training states for equinox modules.

Example:
    >>> import ciclo, equinox as eqx, jax, jax.numpy as jnp, optax
    >>> state = ciclo.create_equinox_state(
    ...     eqx.nn.Linear(2, "scalar", key=jax.random.key(0)),
    ...     tx=optax.sgd(0.3),
    ...     losses={"mse": lambda preds, target: (preds - target) ** 2},
    ... )
    >>> batch = (jnp.array([[1.0, 0.0], [0.0, 1.0]]), jnp.array([2.0, -1.0]))
    >>> for _ in range(50):
    ...     logs, state = state.train_step(batch)
    >>> float(logs.losses.mse) < 1e-4
    True
"""

from importlib.metadata import version as _version

from ciclo_equinox._adapter import EquinoxAdapter as EquinoxAdapter
from ciclo_equinox._state import create_equinox_state as create_equinox_state

__version__ = _version("ciclo-equinox")

__all__ = ["EquinoxAdapter", "__version__", "create_equinox_state"]
