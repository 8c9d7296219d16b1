"""The managed API: steps that only compute losses; gradients, updates and strategy are ciclo's.

Example:
    >>> import ciclo, jax.numpy as jnp, optax
    >>> from ciclo import managed
    >>> state = managed.ManagedState.create(params=jnp.zeros(()), tx=optax.sgd(0.5), strategy="jit")
    >>> @managed.train_step
    ... def train_step(state, batch):
    ...     return ciclo.logs().add_loss("loss", (state.params - batch) ** 2), state
    >>> logs, state = train_step(state, jnp.array(1.0))
    >>> float(state.params)
    1.0
"""

from ciclo._src.base.roles import Role as Role
from ciclo._src.base.roles import field as field
from ciclo._src.base.roles import fields_with_role as fields_with_role
from ciclo._src.state.managed import AbstractManagedState as AbstractManagedState
from ciclo._src.state.managed import ManagedState as ManagedState
from ciclo._src.state.managed import ManagedStep as ManagedStep
from ciclo._src.state.managed import step as step
from ciclo._src.state.managed import train_step as train_step
from ciclo._src.state.model_state import BATCH_KEYS as BATCH_KEYS
from ciclo._src.state.model_state import NamedLosses as NamedLosses
from ciclo._src.state.model_state import split_batch as split_batch
from ciclo._src.state.training_options import TrainingOptions as TrainingOptions
from ciclo._src.state.training_options import TrainingOptionsKwargs as TrainingOptionsKwargs
from ciclo._src.state.training_options import accumulate as accumulate
from ciclo._src.state.training_options import ema as ema
from ciclo._src.state.training_options import keep_norms as keep_norms
from ciclo._src.state.training_options import loss_scaling as loss_scaling
from ciclo._src.state.training_options import skip_spikes as skip_spikes

__all__ = [
    "AbstractManagedState",
    "BATCH_KEYS",
    "ManagedState",
    "ManagedStep",
    "NamedLosses",
    "Role",
    "TrainingOptions",
    "TrainingOptionsKwargs",
    "accumulate",
    "ema",
    "field",
    "fields_with_role",
    "keep_norms",
    "loss_scaling",
    "skip_spikes",
    "split_batch",
    "step",
    "train_step",
]
