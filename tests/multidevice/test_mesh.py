"""`MeshParallel`: meshes of any shape on the 4 CPU devices, partition rules, and their refusals.

The issue asks for meshes of 8 devices; this session has 4 (conftest.py), so the shapes are
`(4, 1, 1)`, `(2, 2, 1)`, `(1, 2, 2)`, `(1, 1, 4)` over `("data", "fsdp", "tensor")`.

Tolerance: a split matmul sums its partial products in another order than one device does, so each
step's float32 results differ in the last bits (about 1e-7 relative); 20 adam steps carry that on, so
the comparison with `jit` allows rtol 1e-5, atol 1e-6 (what the other strategy tests allow).
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P
from support import training
from support.meshes import laid_out, mesh, specs

import ciclo
from ciclo import managed
from ciclo.strategies import FSDP, DataParallel, MeshParallel

MESHES = [(4, 1, 1), (2, 2, 1), (1, 2, 2), (1, 1, 4)]

# training.init_mlp's layers: 8 -> 64 -> 64 -> 1; each bias follows its kernel's output dimension.
RULES = [
    (r"^0/w$", P(None, "tensor")),
    (r"^0/b$", P("tensor")),
    (r"^1/w$", P("fsdp", "tensor")),
    (r"^1/b$", P("tensor")),
    (r"^2/w$", P("tensor", None)),
]
EXPECTED = {"0/w": P(None, "tensor"), "0/b": P("tensor"), "1/w": P("fsdp", "tensor"), "1/b": P("tensor")}


def run(state: Any, steps: int = training.STEPS) -> tuple[list[float], Any]:
    losses = []
    for batch in training.batches(steps):
        logs, state = training.train_step(state, batch)
        losses.append(float(logs.losses.mse))
    return losses, state


@functools.cache
def reference() -> tuple[list[float], Any]:
    losses, state = run(training.managed_state("mlp", "jit"))
    return losses, jax.device_get(state.params)


@pytest.mark.parametrize("shape", MESHES, ids=str)
def test_a_mesh_trains_as_one_device_does_with_the_layout_its_rules_say(shape: tuple[int, int, int]) -> None:
    strategy = mesh(shape, rules=RULES)
    state = training.managed_state("mlp", strategy)
    expected = {**EXPECTED, "2/w": P("tensor", None), "2/b": P()}
    assert laid_out(state.params, strategy, expected)
    assert laid_out(state.opt_state[0].mu, strategy, expected)  # the optimizer state follows its parameter
    losses, state = run(state)
    assert laid_out(state.params, strategy, expected)
    np.testing.assert_allclose(losses, reference()[0], rtol=1e-5)
    training.assert_trees_close(jax.device_get(state.params), reference()[1])


def test_unnamed_leaves_follow_the_fallback_and_the_options_state_follows_its_parameter() -> None:
    strategy = mesh((1, 2, 2), rules=RULES[:2])
    state = managed.ManagedState.create(
        params=training.init_mlp(jax.random.key(0)), tx=optax.sgd(0.1), strategy=strategy, ema_decay=0.5
    )
    laid_out = specs(state.params)
    assert laid_out["1/w"] == P("fsdp", None)  # 64 x 64 >= min_size: split over "fsdp"
    assert laid_out["2/w"] == P()  # 64 elements: replicated
    assert specs(state.ema_params) == laid_out
    replicate = specs(training.managed_state("mlp", mesh((1, 2, 2), fallback="replicate")).params)
    assert set(replicate.values()) == {P()}


def test_parameters_that_are_one_array_are_followed_by_their_optimizer_state() -> None:
    strategy = MeshParallel(axes={"data": 2, "tensor": 2}, rules=[("^$", P(None, "tensor"))])
    state = managed.ManagedState.create(
        params=np.ones((8, 64), np.float32), tx=optax.adam(0.1), strategy=strategy
    )
    assert state.params.sharding.spec == state.opt_state[0].mu.sharding.spec == P(None, "tensor")
    assert state.opt_state[0].count.sharding.spec == P()


def test_data_parallel_and_fsdp_are_one_axis_meshes() -> None:
    state = training.managed_state("mlp", FSDP(axis_name="fsdp"))
    as_mesh = training.managed_state("mlp", MeshParallel(axes={"fsdp": -1}, batch_axes=("fsdp",)))
    assert specs(state.params) == specs(as_mesh.params) and P("fsdp", None) in specs(state.params).values()
    replicated = training.managed_state("mlp", MeshParallel(fallback="replicate"))
    assert specs(replicated.params) == specs(training.managed_state("mlp", "data_parallel").params)
    assert ciclo.strategies.get_strategy("mesh").mesh.shape == {"data": 4}
    assert isinstance(DataParallel(), type(DataParallel())) and FSDP().min_size == MeshParallel().min_size


def test_a_state_moves_between_meshes_and_back_to_one_device() -> None:
    state = training.managed_state("mlp", "eager")
    expected = jax.device_get(state.params)
    for strategy in [mesh((2, 2, 1), rules=RULES), mesh((1, 1, 4), rules=RULES), "fsdp", "eager"]:
        state = state.with_strategy(strategy)
    training.assert_trees_close(jax.device_get(state.params), expected, rtol=0, atol=0)


BAD: dict[str, tuple[dict[str, Any], str]] = {
    "a rule that matches nothing": (
        {"rules": [*RULES, (r"^dense_9/w$", P("fsdp"))]},
        r"rule '\^dense_9/w\$' matches no parameter .* Parameters: 0/b, 0/w",
    ),
    "a dimension that does not split": (
        {"rules": [(r"^2/w$", P(None, "tensor"))]},
        r"parameter 2/w \(64, 1\): dimension 1 \(1\) does not split over mesh axes \('tensor',\) "
        r"\(2 devices\)",
    ),
    "a replicated parameter over the limit": (
        {"fallback": "replicate", "replicated_limit": 4000},
        r"parameter 1/w \(64, 64\) \(16,384 bytes\) would be replicated .* replicated_limit=4,000",
    ),
    "a bias split another way than its kernel's output": (
        {"rules": [(r"^1/w$", P("tensor", "fsdp")), (r"^1/b$", P("tensor"))]},
        r"bias 1/b is split over \('tensor',\), but its kernel 1/w \(64, 64\) .* \('\^1/b\$', P\('fsdp'\)\)",
    ),
    "a spec of more dimensions than the parameter": (
        {"rules": [(r"^0/b$", P(None, "tensor"))]},
        r"parameter 0/b \(64,\) has 1 dimensions, but rule '\^0/b\$' lays out 2",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_rule_is_refused_when_the_state_is_created(case: str) -> None:
    options, message = BAD[case]
    with pytest.raises(ValueError, match=message) as caught:
        training.managed_state("mlp", mesh((1, 2, 2), **options))
    assert len(str(caught.value)) < 2000


def test_a_bad_mesh_or_rule_table_is_refused_when_it_is_made() -> None:
    with pytest.raises(ValueError, match="need 8 devices, but there are 4"):
        training.managed_state("mlp", mesh((2, 2, 2)))
    with pytest.raises(ValueError, match="need a multiple of 3 devices, but there are 4"):
        training.managed_state("mlp", mesh((3, -1, 1)))
    assert mesh((1, -1, 2)).mesh.shape == {"data": 1, "fsdp": 2, "tensor": 2}
    with pytest.raises(ValueError, match="names the mesh axis 'model', which the mesh has not"):
        MeshParallel(axes={"data": 4}, rules=[("w", P("model"))])
    with pytest.raises(ValueError, match="logical_rules give 'embed' 2 rules: keep one"):
        MeshParallel(logical_rules=[("embed", "data"), ("embed", None)])
    with pytest.raises(ValueError, match="fallback must be 'fsdp' or 'replicate'"):
        MeshParallel(fallback="shard")
    assert hash(mesh((1, 2, 2), rules=RULES, logical_rules={"mlp": ["fsdp", "tensor"]}))


def test_a_batch_splits_over_the_data_like_axes_only() -> None:
    strategy = mesh((1, 2, 2), rules=RULES)
    x, _ = strategy.lift_batch(training.batches(1)[0])
    assert x.sharding.spec == P(("data", "fsdp"))
    state = training.managed_state("mlp", strategy)
    with pytest.raises(ValueError, match=r"has 3 rows .* not a multiple of 2"):
        training.train_step(state, training.batches(1, batch=3)[0])


def test_a_backup_and_a_checkpoint_move_between_meshes_and_onto_one_device(tmp_path: Path) -> None:
    # Restores read into the target's own shardings (orbax restore args from the target's arrays).
    written = mesh((2, 2, 1), rules=RULES)
    state = training.mlp_state(written)
    for batch in training.batches(3):
        _, state = state.train_step(batch)
    saver = ciclo.checkpoint(tmp_path / "checkpoint")
    saver.save(3, state)
    saver.close()
    ciclo.train_loop(training.mlp_state(written), training.batches(6), stop=2, backup=tmp_path / "backup")
    for target in [mesh((1, 1, 4), rules=RULES), mesh((4, 1, 1)), "jit"]:
        restored = ciclo.restore_checkpoint(tmp_path / "checkpoint", training.mlp_state(target, key=1))
        wanted = training.mlp_state(target, key=1)
        for leaf, want, value in zip(
            jax.tree.leaves(restored), jax.tree.leaves(wanted), jax.tree.leaves(state), strict=True
        ):
            assert leaf.sharding == want.sharding
            np.testing.assert_array_equal(np.asarray(leaf), np.asarray(value))
        backup = tmp_path / f"backup_{target}"
        shutil.copytree(tmp_path / "backup", backup)
        resumed, _, _ = ciclo.train_loop(
            training.mlp_state(target), training.batches(6), stop=6, backup=backup
        )
        uninterrupted, _, _ = ciclo.train_loop(training.mlp_state(target), training.batches(6), stop=6)
        assert int(resumed.step) == 6
        training.assert_trees_close(jax.device_get(resumed.params), jax.device_get(uninterrupted.params))
