"""`MeshParallel` under every adapter on 4 CPU devices, the same losses and params as `jit`.

flax's logical names (linen, nnx), regex rules over haiku's and equinox's paths; the tolerance is
tests/multidevice/test_mesh.py's.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P
from support import training
from support.meshes import laid_out, mesh

import ciclo

flax = pytest.importorskip("flax")
haiku = pytest.importorskip("haiku")
eqx = pytest.importorskip("equinox")
LOGICAL = {"embed": "fsdp", "mlp": "tensor"}
INPUTS = jnp.zeros((1, training.FEATURES))


def linen_model() -> Any:
    import flax.linen as nn

    part = nn.with_logical_partitioning

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            x = nn.Dense(
                16,
                kernel_init=part(nn.initializers.lecun_normal(), ("embed", "mlp")),
                bias_init=part(nn.initializers.zeros, ("mlp",)),
            )(x)
            return nn.Dense(1, kernel_init=part(nn.initializers.lecun_normal(), ("mlp", None)))(jnp.tanh(x))

    return MLP()


def nnx_model() -> Any:
    from flax import nnx

    def part(init: Any, names: tuple[str | None, ...]) -> Any:
        return nnx.with_partitioning(init, names, eager_sharding=False)

    class MLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            normal, zeros = nnx.initializers.lecun_normal(), nnx.initializers.zeros_init()
            self.l1 = nnx.Linear(
                8, 16, kernel_init=part(normal, ("embed", "mlp")), bias_init=part(zeros, ("mlp",)), rngs=rngs
            )
            self.l2 = nnx.Linear(16, 1, kernel_init=part(normal, ("mlp", None)), rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.l2(jnp.tanh(self.l1(x)))

    return MLP(nnx.Rngs(0))


def haiku_model() -> Any:
    return haiku.transform(lambda x: haiku.nets.MLP([16, 1], activation=jnp.tanh)(x))


def equinox_model() -> Any:
    return eqx.nn.MLP(8, 1, 16, 1, activation=jnp.tanh, key=jax.random.key(0))


ADAPTERS: dict[str, tuple[Any, dict[str, Any], dict[str, P]]] = {
    "linen": (
        lambda strategy: ciclo.create_flax_state(linen_model(), inputs=INPUTS, strategy=strategy, **SETTINGS),
        {"logical_rules": LOGICAL},
        {"Dense_0/kernel/value": P("fsdp", "tensor"), "Dense_0/bias/value": P("tensor")},
    ),
    "nnx": (
        lambda strategy: ciclo.create_flax_state(nnx_model(), strategy=strategy, **SETTINGS),
        {"logical_rules": LOGICAL},
        {"l1/kernel/value": P("fsdp", "tensor"), "l1/bias/value": P("tensor")},
    ),
    "haiku": (
        lambda strategy: ciclo.create_haiku_state(
            haiku_model(), inputs=INPUTS, strategy=strategy, **SETTINGS
        ),
        {"rules": [(r"linear_0/w$", P("fsdp", "tensor")), (r"linear_0/b$", P("tensor"))]},
        {"mlp/~/linear_0/w": P("fsdp", "tensor"), "mlp/~/linear_0/b": P("tensor")},
    ),
    "equinox": (
        lambda strategy: ciclo.create_equinox_state(equinox_model(), strategy=strategy, **SETTINGS),
        {"rules": [(r"layers/0/weight$", P("tensor", "fsdp")), (r"layers/0/bias$", P("tensor"))]},
        {"layers/0/weight": P("tensor", "fsdp"), "layers/0/bias": P("tensor")},
    ),
}
SETTINGS: dict[str, Any] = {
    "tx": optax.adam(1e-2),
    "losses": {"mse": lambda preds, target: (preds - target) ** 2},
}


@pytest.mark.parametrize("framework", ADAPTERS)
def test_every_adapter_trains_under_its_rules_as_on_one_device(framework: str) -> None:
    create, options, expected = ADAPTERS[framework]
    results = []
    for strategy in ["jit", mesh((1, 2, 2), **options)]:
        state = create(strategy)
        for batch in training.batches(10):
            logs, state = state.train_step(batch)
        results.append((float(logs.losses.mse), jax.device_get(state.params)))
    assert laid_out(state.params, state.strategy, expected)
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-5)
    training.assert_trees_close(results[1][1], results[0][1])


def test_a_logical_name_without_a_rule_or_a_rule_without_a_name_is_refused() -> None:
    create = ADAPTERS["linen"][0]
    with pytest.raises(ValueError, match="logical axis name 'mlp', which logical_rules do not map"):
        create(mesh((1, 2, 2), logical_rules={"embed": "fsdp"}))
    with pytest.raises(ValueError, match="logical rule 'heads' matches no parameter's logical axis names"):
        create(mesh((1, 2, 2), logical_rules={**LOGICAL, "heads": "tensor"}))
