"""ciclo.summary's layout and ciclo.preflight on 4 devices: bytes per device fall as the state splits."""

from __future__ import annotations

import io

import jax
import numpy as np
import pytest
from support import summary, training

import ciclo

DEVICES = jax.device_count()


def _layout(state: ciclo.types.ModelState) -> dict[str, tuple[str, str, int]]:
    return summary.layout(ciclo.summary(state, file=io.StringIO()))


def test_summary_shows_each_parameters_spec_and_bytes_per_device() -> None:
    state = training.mlp_state("fsdp")
    text = ciclo.summary(state, file=io.StringIO())
    rows = summary.parse(text, per_device=True)
    layout = summary.layout(text)

    assert list(layout) == ["0/b", "0/w", "1/b", "1/w", "2/b", "2/w"]  # paths inside the params
    for path, leaf in jax.tree_util.tree_leaves_with_path(state.params):
        shape, spec, per_device = layout[jax.tree_util.keystr(path, simple=True, separator="/")]
        assert shape == str(leaf.shape)
        assert per_device == leaf.addressable_shards[0].data.nbytes
        assert spec == ("replicated" if leaf.sharding.is_fully_replicated else str(leaf.sharding.spec))
    assert layout["1/w"] == ("(64, 64)", "P('data', None)", 64 * 64 * 4 // DEVICES)

    def per_device(tree: object) -> int:
        return sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree.leaves(tree))

    assert rows["params"][2] == per_device(state.params) < rows["params"][1]  # type: ignore[operator]
    assert rows["optimizer state"][2] == per_device(state.opt_state)
    assert rows["total"][2] == per_device(state)
    # The one-device columns stay as they were.
    assert summary.parse(text) == summary.parse(ciclo.summary(state.with_strategy("jit"), file=io.StringIO()))
    assert "\n\n" not in ciclo.summary(state.with_strategy("jit"), file=io.StringIO())


def test_preflight_reports_bytes_that_fall_when_the_state_is_split_more() -> None:
    batch = training.batches(1)[0]
    replicated, split = training.mlp_state("data_parallel"), training.mlp_state("fsdp")

    # The params per device: fsdp's are at most a 1/n of data_parallel's, plus the leaves it keeps whole.
    whole = summary.parse(ciclo.summary(replicated, file=io.StringIO()), per_device=True)["params"][2]
    kept = sum(n for _, spec, n in _layout(split).values() if spec == "replicated")
    assert summary.parse(ciclo.summary(split, file=io.StringIO()), per_device=True)["params"][2] <= (
        whole // DEVICES + kept  # type: ignore[operator]
    )
    assert {spec for _, spec, _ in _layout(replicated).values()} == {"replicated"}

    # The step's arguments (state and batch) likewise, as XLA counts them.
    big, small = ciclo.preflight(replicated, batch), ciclo.preflight(split, batch)
    assert big.memory is not None and small.memory is not None
    state_kept = sum(
        leaf.addressable_shards[0].data.nbytes
        for leaf in jax.tree.leaves(split)
        if leaf.sharding.is_fully_replicated
    )
    batch_bytes = sum(np.asarray(leaf).nbytes for leaf in batch)
    assert small.memory["arguments"] <= big.memory["arguments"] // DEVICES + state_kept + batch_bytes
    assert small.total_bytes is not None and big.total_bytes is not None
    assert small.total_bytes < big.total_bytes
    assert big.largest[0] == ("params/1/w", "replicated", 64 * 64 * 4)
    assert small.largest[0] == ("params/1/w", "P('data', None)", 64 * 64 * 4 // DEVICES)
    assert small.flops is not None and big.flops is not None


def test_device_memory_between_the_two_estimates_stops_only_the_replicated_run() -> None:
    data = training.batches(3)
    replicated, split = training.mlp_state("data_parallel"), training.mlp_state("fsdp")
    small = ciclo.preflight(split, data[0]).total_bytes
    big = ciclo.preflight(replicated, data[0]).total_bytes
    assert small is not None and big is not None and small < big
    budget = (small + big) // 2

    ran: list[int] = []
    with pytest.raises(ValueError, match=f"more than device_memory={budget:,}: the run stops before step 0"):
        ciclo.train_loop(
            replicated, data, {ciclo.on_train_batch_begin: lambda: ran.append(1)}, device_memory=budget
        )
    assert ran == []
    state, history, _ = ciclo.train_loop(split, data, device_memory=budget)
    assert int(state.step) == 3 and len(history) == 3
