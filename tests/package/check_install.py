"""Run by `nox -s package` with the interpreter of a fresh venv holding only the built wheels.

`python check_install.py core`: ciclo-core alone (no extras): `import ciclo`
works, imports no framework, and checkpoints say which extra to install.
`python check_install.py flax`: with the adapter wheels: `ciclo.create_flax_state`
(found by entry point) trains a tiny linen model for one step.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import tempfile
from pathlib import Path


def check_core() -> None:
    import ciclo

    assert ciclo.__version__ == importlib.metadata.version("ciclo-core")
    assert "site-packages" in Path(ciclo.__file__).parts, ciclo.__file__  # the wheel, not the sources
    loaded = sorted({name.split(".")[0] for name in sys.modules} & {"flax", "haiku", "equinox", "orbax"})
    assert not loaded, loaded
    assert importlib.util.find_spec("orbax") is None, "orbax is installed without the checkpoint extra"
    try:
        ciclo.checkpoint(tempfile.mkdtemp())
    except ImportError as error:
        assert 'pip install "ciclo-core[checkpoint]"' in str(error), error
    else:
        raise AssertionError("ciclo.checkpoint worked without orbax")
    try:
        ciclo.create_flax_state  # noqa: B018
    except AttributeError as error:
        assert "pip install ciclo-flax" in str(error), error
    else:
        raise AssertionError("ciclo.create_flax_state resolved without ciclo-flax")
    print(f"ciclo-core {ciclo.__version__}: imports, and names the extras it lacks")


def check_flax() -> None:
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    import ciclo

    for distribution in ("ciclo-core", "ciclo-flax", "ciclo-haiku", "ciclo-equinox"):
        assert importlib.metadata.version(distribution) == ciclo.__version__, distribution
        names = {file.name for file in importlib.metadata.files(distribution) or []}
        assert {"py.typed", "LICENSE"} <= names, (distribution, sorted(names))
    state = ciclo.create_flax_state(
        nn.Dense(2),
        inputs=jnp.zeros((1, 3)),
        tx=optax.sgd(0.1),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        strategy="jit",
    )
    params = state.params
    logs, state = state.train_step((jnp.ones((4, 3)), jnp.array([0, 1, 0, 1])))
    loss = float(logs.losses.loss)
    assert loss > 0, loss
    pairs = zip(jax.tree.leaves(params), jax.tree.leaves(state.params), strict=True)
    assert not all(jnp.array_equal(a, b) for a, b in pairs), "the step left the params as they were"
    print(f"ciclo-flax {importlib.metadata.version('ciclo-flax')}: one train_step, loss {loss:.4f}")


if __name__ == "__main__":
    {"core": check_core, "flax": check_flax}[sys.argv[1]]()
