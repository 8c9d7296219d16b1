"""ciclo-haiku: Keras-like training states for haiku functions.

Example:
    >>> import ciclo, haiku as hk, jax.numpy as jnp, optax
    >>> state = ciclo.create_haiku_state(
    ...     hk.transform(lambda x: hk.Linear(1)(x)),
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

from ciclo_haiku._adapter import HaikuAdapter as HaikuAdapter
from ciclo_haiku._state import create_haiku_state as create_haiku_state

__version__ = _version("ciclo-haiku")

__all__ = ["HaikuAdapter", "__version__", "create_haiku_state"]
