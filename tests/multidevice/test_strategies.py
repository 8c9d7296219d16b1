"""What only shows with several devices: layouts, per-device keys, batches that do not split."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.experimental import io_callback
from support import training

import ciclo
from ciclo import managed
from ciclo._src.strategies import _local, _pmap
from ciclo._src.strategies._in_flight import MAX_STEPS_IN_FLIGHT


def _specs(tree: Any) -> list[str]:
    return [str(leaf.sharding.spec) for leaf in jax.tree.leaves(tree)]


def test_data_parallel_replicates_the_state_and_shards_batches() -> None:
    state = training.managed_state("mlp", "data_parallel")
    assert set(_specs(state)) == {"P()"}
    assert all(leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(state))
    batch = state.strategy.lift_batch(training.batches(1)[0])
    assert _specs(batch) == ["P('data',)"] * 2
    _, state = training.train_step(state, training.batches(1)[0])
    assert set(_specs(state)) == {"P()"}


def test_prefetched_batches_are_sharded_over_the_mesh_and_the_step_copies_them_no_more() -> None:
    data = training.batches(3)
    reference = training.managed_state("mlp", "data_parallel")
    for batch in data:
        _, reference = training.train_step(reference, batch)  # compiles, then trains on host batches
    state = training.managed_state("mlp", "data_parallel")
    groups = ciclo.prefetch_to_device(ciclo.stacked(data, 3), strategy=state.strategy)
    assert _specs(next(groups).batches) == ["P(None, 'data')"] * 2  # a fused group: rows on axis 1
    for batch in ciclo.prefetch_to_device(data, size=2, strategy=state.strategy):
        assert _specs(batch) == ["P('data',)"] * 2
        assert [shard.data.shape for shard in batch[0].addressable_shards] == [(2, training.FEATURES)] * 4
        with jax.transfer_guard("disallow"):  # no copy at the step: its batch is where it runs
            _, state = training.train_step(state, batch)
    for actual, expected in zip(
        jax.tree.leaves(state.params), jax.tree.leaves(reference.params), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(actual), np.asarray(expected))


def test_fsdp_shards_large_parameters_and_their_optimizer_state() -> None:
    state = training.managed_state("mlp", "fsdp")
    for tree in (state, *training.train_step(state, training.batches(1)[0])[1:]):
        assert tree.params[1]["w"].sharding.spec[0] == "data"
        mu = tree.opt_state[0].mu[1]["w"]
        assert mu.sharding.spec == tree.params[1]["w"].sharding.spec
        assert tree.params[1]["b"].sharding.is_fully_replicated
        shard = tree.params[1]["w"].addressable_shards[0].data
        assert shard.shape == (16, 64)


def test_fsdp_splits_the_largest_divisible_dimension() -> None:
    fsdp = ciclo.strategies.FSDP(min_size=8)
    assert fsdp.state_spec((6, 8)) == jax.sharding.PartitionSpec(None, "data")
    assert fsdp.state_spec((12, 8)) == jax.sharding.PartitionSpec("data", None)
    assert fsdp.state_spec((3, 5)) == jax.sharding.PartitionSpec()
    assert fsdp.state_spec((2,)) == jax.sharding.PartitionSpec()


def test_pmap_gives_each_device_its_own_key_and_a_copy_of_the_rest() -> None:
    class State(managed.ManagedState):
        key: jax.Array = managed.field(role=managed.Role.KEY)
        named_key: jax.Array  # no role: a name is not a role, so it is copied like any leaf

    state = State.create(
        params=jnp.ones(3),
        tx=optax.sgd(0.1),
        key=jax.random.key(0),
        named_key=jax.random.key(0),
        strategy="pmap",
    )
    assert state.params.shape == (4, 3) and state.key.shape == (4,)
    keys = jax.random.key_data(state.key)
    assert len({tuple(np.asarray(k)) for k in keys}) == 4
    assert len({tuple(np.asarray(k)) for k in jax.random.key_data(state.named_key)}) == 1
    host = state.with_strategy("eager")
    assert host.params.shape == (3,) and host.key.shape == ()


@pytest.mark.parametrize("strategy", ["data_parallel", "fsdp", "pmap"])
def test_a_batch_that_does_not_split_says_how_to_fix_it(strategy: str) -> None:
    state = training.managed_state("linear", strategy)
    x, y = training.batches(1, batch=6)[0]
    with pytest.raises(ValueError, match=r"batch leaf \[0\] has 6 rows .* multiple of 4"):
        training.train_step(state, (x, y))


def test_with_strategy_moves_between_every_layout() -> None:
    state = training.managed_state("mlp", "eager")
    expected = state.params
    for name in ["pmap", "fsdp", "data_parallel", "jit", "pmap", "eager"]:
        state = state.with_strategy(name)
    training.assert_trees_close(state.params, expected, rtol=0, atol=0)
    assert {leaf.sharding.device_set.pop() for leaf in jax.tree.leaves(state.params)} == {jax.devices()[0]}


@dataclasses.dataclass(frozen=True, eq=False)
class Wide:
    """A model adapter with a 64 x 1024 weight, that records whether `init` only saw tracers."""

    seen: list[bool] = dataclasses.field(default_factory=list)

    def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Any, Any]:
        w = jax.random.normal(key, (inputs.shape[-1], 1024))
        # Outside the jit these would be concrete arrays: the whole weight on one device.
        self.seen.append(all(isinstance(x, jax.core.Tracer) for x in (key, inputs, w)))
        return {"w": w, "b": jnp.zeros(4)}, None

    def apply(self, params, model_state, inputs, *, key, training):
        return inputs @ params["w"], model_state


def test_fsdp_creates_the_state_sharded_without_one_device_holding_it() -> None:
    adapter = Wide()
    state = ciclo.create_model_state(
        adapter, inputs=jnp.ones((1, 64)), tx=optax.adam(1e-3), losses=lambda preds: preds, strategy="fsdp"
    )
    assert adapter.seen and all(adapter.seen), adapter.seen
    adam = state.opt_state[0]
    for leaf in (state.params["w"], adam.mu["w"], adam.nu["w"]):
        assert leaf.shape == (64, 1024) and leaf.sharding.spec == jax.sharding.PartitionSpec(None, "data")
        shards = leaf.addressable_shards
        assert len({shard.device for shard in shards}) == 4
        assert all(shard.data.shape == (64, 256) for shard in shards)
    assert state.params["b"].sharding.is_fully_replicated  # 4 elements: replicated


def test_managed_state_create_builds_the_optimizer_state_sharded() -> None:
    state = managed.ManagedState.create(
        params={"w": jnp.ones((64, 1024))}, tx=optax.adam(1e-3), strategy="fsdp"
    )
    mu = state.opt_state[0].mu["w"]
    assert {shard.data.shape for shard in mu.addressable_shards} == {(64, 256)}


def test_mesh_strategies_reshard_device_to_device(monkeypatch: pytest.MonkeyPatch) -> None:
    state = training.managed_state("mlp", "data_parallel")
    expected = jax.device_get((state.params, state.opt_state))

    def refuse(tree: Any) -> Any:
        raise AssertionError("the state was gathered onto one device")

    # Moving between mesh strategies never brings the state whole to one device.
    monkeypatch.setattr(_local, "gather", refuse)
    monkeypatch.setattr(_pmap, "gather", refuse)
    fsdp = state.with_strategy("fsdp")
    assert fsdp.params[1]["w"].sharding.spec == jax.sharding.PartitionSpec("data", None)
    assert {shard.data.shape for shard in fsdp.opt_state[0].mu[1]["w"].addressable_shards} == {(16, 64)}
    back = fsdp.with_strategy("data_parallel")
    assert all(leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(back))
    training.assert_trees_close((back.params, back.opt_state), expected, rtol=0, atol=0)
    training.assert_trees_close((fsdp.params, fsdp.opt_state), expected, rtol=0, atol=0)
    monkeypatch.undo()

    _, trained = training.train_step(fsdp, training.batches(1)[0])  # and it still trains
    assert int(trained.with_strategy("eager").step) == 1


def _over_devices(strategy: Any, value: jax.Array) -> jax.Array:
    """`value`'s mean over every device's rows: an all-reduce, the collective XLA:CPU deadlocked on."""
    value = value.mean()
    return jax.lax.pmean(value, strategy.axis_name) if isinstance(strategy, _pmap.PMap) else value


def _record_step(strategy: Any, seen: set[int]) -> Any:
    def record(index: np.ndarray) -> np.ndarray:
        seen.add(int(index))
        return np.zeros((), np.float32)

    def step(state: jax.Array, batch: jax.Array) -> tuple[ciclo.types.Logs, jax.Array]:
        work = jnp.tanh(jnp.outer(batch, batch).astype(jnp.float32) @ jnp.ones((batch.shape[0], 64)))
        done = io_callback(record, jax.ShapeDtypeStruct((), jnp.float32), batch[0])
        return ciclo.types.Logs(), state + work.sum() + _over_devices(strategy, batch) + done

    return step


@pytest.mark.parametrize("name", ["data_parallel", "fsdp", "pmap"])
def test_a_step_returns_once_the_step_max_in_flight_calls_back_has_run(name: str) -> None:
    strategy = ciclo.strategies.get_strategy(name)
    seen: set[int] = set()
    step = strategy.compile(_record_step(strategy, seen))
    state = strategy.place(jnp.zeros((), jnp.float32))
    for index in range(MAX_STEPS_IN_FLIGHT + 3):
        batch = strategy.lift_batch(np.full((jax.device_count(),), index, np.int32))
        _, state = step(state, batch)
        # The token of step `index - MAX_STEPS_IN_FLIGHT` was waited for: that step ran whole.
        assert set(range(index - MAX_STEPS_IN_FLIGHT + 1)) <= seen


@pytest.mark.parametrize("name", ["data_parallel", "pmap"])
def test_hundreds_of_steps_dispatched_without_a_wait_do_not_deadlock_xla_cpu(name: str) -> None:
    # Unbounded, XLA:CPU aborted the process ("Termination timeout for `all reduce`") once about
    # 32 of these were queued on the 4 devices.
    strategy = ciclo.strategies.get_strategy(name)
    step = strategy.compile(
        lambda state, batch: (ciclo.types.Logs(), state * 0.5 + _over_devices(strategy, batch))
    )
    state = strategy.place(jnp.zeros((), jnp.float32))
    batch = strategy.lift_batch(np.ones((jax.device_count(),), np.float32))
    for _ in range(300):
        _, state = step(state, batch)
    assert np.allclose(np.asarray(state), 2.0)


@pytest.mark.parametrize(
    "strategy",
    [ciclo.strategies.DataParallel(donate=True), ciclo.strategies.FSDP(donate=True), _pmap.PMap(donate=True)],
    ids=lambda strategy: type(strategy).__name__,
)
def test_restore_best_weights_returns_live_weights_under_a_donating_mesh(strategy: Any) -> None:
    init, apply = training.MODELS["linear"]
    state = managed.ManagedState.create(
        params=init(jax.random.key(0)), tx=training.optimizer(), apply_fn=apply, strategy=strategy
    )
    state, expected = training.best_weights_run(state)
    training.assert_trees_close(state.with_strategy("eager").params, expected)


def test_flops_count_the_whole_model_under_every_mesh_strategy() -> None:
    batch = training.batches(1)[0]
    counts = {}
    for name in ("jit", "data_parallel", "fsdp", "pmap"):
        state = training.managed_state("mlp", name)
        _, state = training.train_step(state, batch)
        counts[name] = ciclo.step_flops(training.train_step, state, batch)
    # Counted before the program is split over the devices: one device's share would be a quarter.
    assert counts["jit"] and counts["jit"] > 0
    assert counts["data_parallel"] == counts["fsdp"] == counts["jit"]
    assert counts["pmap"] is None  # one program per device: not analysed


def test_mfu_divides_by_the_peak_of_every_device_of_the_state() -> None:
    state = training.managed_state("mlp", "data_parallel")
    meter = ciclo.throughput(window=2, peak_flops=1e9)
    _, history, _ = ciclo.train_loop(
        state, training.batches(5), {ciclo.on_train_step: [training.train_step]}, callbacks=[meter]
    )
    per_second, mfu = history.collect("flops_per_second", "mfu")
    assert mfu and mfu == [value / (1e9 * 4) for value in per_second]


@pytest.mark.parametrize("strategy", ["data_parallel", "fsdp", "pmap"])
def test_recompiles_are_compared_as_the_devices_see_the_inputs(strategy: str) -> None:
    import warnings

    def run(sizes: list[int]) -> list[str]:
        state = training.managed_state("mlp", strategy)
        data = [batch for size in sizes for batch in training.batches(1, batch=size)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ciclo.train_loop(state, data, {ciclo.on_train_step: [training.train_step]})
        return [str(w.message) for w in caught if w.category is ciclo.types.RecompileWarning]

    # The first step of a later loop runs the program compiled before: compared as the program sees
    # its inputs (under pmap, one device's rows), it is no change.
    run([8, 8])
    assert run([8, 8]) == []
    (warned,) = run([8, 4])
    rows = (2, 1) if strategy == "pmap" else (8, 4)  # pmap names one device's rows
    assert f"({rows[1]}, 8) float32, first compiled for ({rows[0]}, 8) float32" in warned


@pytest.mark.parametrize("name", ["data_parallel", "pmap"])
@pytest.mark.parametrize("prefetch", [False, True], ids=["host", "prefetched"])
def test_a_loop_counts_the_rows_it_trains_on_wherever_the_batches_are(name: str, prefetch: bool) -> None:
    # `pmap` lifts `(8, ...)` to `(4, 2, ...)`: its leading dimension counts devices, not rows.
    state = training.managed_state("mlp", name)
    data: Any = training.batches(3, batch=8)
    if prefetch:
        data = ciclo.prefetch_to_device(data, strategy=state.strategy)
    _, _, elapsed = ciclo.loop(state, data, {ciclo.every(1): training.train_step})
    assert (elapsed.steps, elapsed.samples) == (3, 24)
