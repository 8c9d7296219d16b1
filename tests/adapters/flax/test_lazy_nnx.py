"""A linen training never imports flax.nnx, which takes seconds (IPython, treescope): a warm start's time.

Run in a fresh interpreter, whose modules are its own. An nnx model still works once nnx is imported.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from support import processes

SCRIPT = textwrap.dedent(
    """
    import sys

    import flax.linen as nn
    import jax.numpy as jnp
    import optax

    import ciclo
    import ciclo_flax

    losses = {"loss": lambda preds, target: optax.l2_loss(preds, target)}
    state = ciclo.create_flax_state(nn.Dense(2), inputs=jnp.ones((1, 3)), tx=optax.sgd(0.1), losses=losses)
    state, _, _ = ciclo.train_loop(state, [(jnp.ones((4, 3)), jnp.zeros((4, 2)))] * 2, stop=2)
    print("linen", "flax.nnx" in sys.modules, int(state.step))

    from flax import nnx

    state = ciclo.create_flax_state(nnx.Linear(3, 2, rngs=nnx.Rngs(0)), tx=optax.sgd(0.1))
    print("nnx", ciclo_flax.NnxAdapter.__name__, ciclo_flax.to_nnx.__name__, ciclo_flax.NnxMetric.__name__)
    """
)


def test_a_linen_training_imports_no_nnx() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=processes.clean_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["linen False 2", "nnx NnxAdapter to_nnx NnxMetric"], done.stdout
