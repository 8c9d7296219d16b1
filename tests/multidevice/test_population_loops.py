"""A population on 4 devices: members stopped, pruned and checkpointed keep their sharding; no recompile."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import ciclo
from ciclo import managed

FEATURES = 3


class Regression(managed.ManagedState):
    @managed.train_step
    def train_step(self, batch: Any) -> Any:
        x, y = batch
        return ciclo.logs().add_loss("mse", jnp.mean((x @ self.params["w"] - y) ** 2)), self


def make_state(learning_rate: float) -> Regression:
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=learning_rate)
    return Regression.create(params={"w": jax.random.normal(jax.random.key(0), (FEATURES,))}, tx=tx)


def test_stopped_and_pruned_members_keep_the_member_sharding_and_one_compile(tmp_path: Any) -> None:
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(16, 4, FEATURES)).astype(np.float32)
    data = [(x, x @ np.arange(1, FEATURES + 1, dtype=np.float32)) for x in xs]
    pop = ciclo.population(make_state, hparams={"learning_rate": [0.0, 0.003, 0.03, 0.3]})
    sharding = pop.active.sharding
    assert dict(pop.mesh.shape) == {"member": 4, "data": 1}
    stopper = ciclo.early_stopping("mse", patience=1)
    pruner = ciclo.prune(every=2, keep=0.5, monitor="mse")
    ckpt = ciclo.checkpoint(tmp_path, keep=None, monitor="mse", async_save=False)
    compiles = ciclo.types.Population.train_step.compiles
    with warnings.catch_warnings():
        warnings.simplefilter("error", ciclo.types.RecompileWarning)
        pop, _, elapsed = ciclo.train_loop(
            pop, data, {ciclo.on_epoch_end: [stopper, pruner]}, callbacks=[ckpt], epoch_duration=2, stop=16
        )
    ckpt.close()
    assert elapsed.steps == 16 and not np.asarray(pop.active).all() and pruner.pruned
    assert pop.active.sharding == sharding
    assert ciclo.types.Population.train_step.compiles - compiles <= 1  # once for this population's shapes
    restored = ciclo.restore_checkpoint(tmp_path, make_state(0.1), member=3)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(pop.member(3)), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
