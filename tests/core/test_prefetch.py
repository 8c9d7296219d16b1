"""ciclo.prefetch_to_device and train_loop(prefetch=): batches placed ahead, the data position kept exact."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from support import training
from support.optional import optional

import ciclo
from ciclo._src.resume.backup import iterator_state

grain = optional("grain")  # installs on Python >= 3.11 only
needs_grain = pytest.mark.skipif(grain is None, reason="grain installs on Python >= 3.11 only")


class Counted:
    """An iterator over `batches` that counts the batches read from it."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches
        self.read = 0

    def __iter__(self) -> Counted:
        return self

    def __next__(self) -> Any:
        if self.read == len(self.batches):
            raise StopIteration
        self.read += 1
        return self.batches[self.read - 1]


def grain_batches(seed: int = 0) -> Any:
    """A grain pipeline over `training.batches`' rows: shuffled each epoch, endless, in batches of 8."""
    assert grain is not None
    x, y = (np.concatenate(column) for column in zip(*training.batches(6), strict=True))
    rows = grain.MapDataset.source([(x[i], y[i]) for i in range(len(x))])
    # Read in this thread: grain's default 16 reading threads would cost more than the test.
    options = grain.ReadOptions(num_threads=0)
    return iter(rows.shuffle(seed=seed).repeat().batch(training.BATCH).to_iter_dataset(options))


def params_of(state: Any) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(state.with_strategy("eager").params)]


def assert_bitwise_equal(actual: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_array_equal(a, e)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_it_reads_at_most_size_batches_ahead_of_the_one_taken(size: int) -> None:
    source = Counted([np.full(2, i, np.float32) for i in range(6)])
    prefetched = ciclo.prefetch_to_device(source, size)
    assert source.read == 0  # nothing is read before the loop asks
    taken = []
    for batch in prefetched:
        taken.append(int(batch[0]))
        assert source.read == min(len(taken) + size, 6)
    assert taken == list(range(6))


@pytest.mark.parametrize("size", [0, -1, True, 1.5, "2", None])
def test_a_size_that_is_not_a_positive_int_is_refused(size: Any) -> None:
    with pytest.raises(
        ValueError, match=r"prefetch size must be an int >= 1 \(the batches read ahead\), got"
    ):
        ciclo.prefetch_to_device([np.ones(2)], size)


def test_train_loop_refuses_a_bad_prefetch_before_the_first_step() -> None:
    steps = []

    def train_step(state: Any, batch: Any) -> Any:
        steps.append(batch)
        return state

    with pytest.raises(ValueError, match=r"prefetch size must be an int >= 1 .*got -1"):
        ciclo.train_loop(0, [np.ones(2)], {ciclo.on_train_step: [train_step]}, prefetch=-1)
    with pytest.raises(ValueError, match="unknown strategy 'nope'"):
        ciclo.prefetch_to_device([np.ones(2)], strategy="nope")
    assert steps == []


@pytest.mark.parametrize("prefetch", [0, None, 2])
def test_train_loop_prefetches_only_when_asked(prefetch: int | None) -> None:
    seen = []

    def train_step(state: Any, batch: Any) -> Any:
        seen.append(type(batch))
        return state + 1

    state, _, _ = ciclo.train_loop(
        0, [np.ones(2)] * 3, {ciclo.on_train_step: [train_step]}, prefetch=prefetch
    )
    # A state without a strategy: the batches go to the default device.
    assert state == 3 and [issubclass(kind, jax.Array) for kind in seen] == [bool(prefetch)] * 3


def failing_at(index: int) -> Any:
    for i in range(index):
        yield np.full(2, i, np.float32)
    raise OSError(f"cannot read shard {index}")


def test_a_dataset_error_read_ahead_is_raised_at_the_step_of_the_batch_that_failed() -> None:
    steps = []

    def train_step(state: Any, batch: Any) -> Any:
        steps.append(int(batch[0]))
        return state + 1

    with pytest.raises(OSError, match="cannot read shard 5") as info:
        ciclo.train_loop(0, failing_at(5), {ciclo.on_train_step: [train_step]}, prefetch=3)
    assert steps == [0, 1, 2, 3, 4]  # the batches before it trained, as without prefetch
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "the batch of step 5 (5 steps ran before it" in notes or not hasattr(info.value, "add_note")


@pytest.mark.parametrize(
    ("strategy", "leaf", "path", "kind"),
    [
        (None, "abc", r"\['name'\]", "str"),
        (None, np.array(["a", "b"]), r"\['name'\]", "ndarray of dtype <U1"),
        ("data_parallel", "abc", r"\['name'\]", "str"),
    ],
)
def test_a_batch_leaf_that_cannot_be_placed_is_named_with_its_path_and_type(
    strategy: str | None, leaf: Any, path: str, kind: str
) -> None:
    batches = [{"x": np.ones((2, 3), np.float32), "name": leaf}]
    prefetched = ciclo.prefetch_to_device(batches, 2, strategy)
    with pytest.raises(TypeError, match=rf"batch 0 .*leaf {path}.* is a {kind}.*not a number or.*array"):
        next(prefetched)


def test_train_loop_names_the_unplaceable_leaf_and_the_step_of_its_batch() -> None:
    steps = []
    batches = [{"x": np.ones(2, np.float32), "name": np.zeros(1)}] * 3 + [{"x": np.ones(2), "name": "abc"}]

    def train_step(state: Any, batch: Any) -> Any:
        steps.append(1)
        return state + 1

    with pytest.raises(TypeError, match=r"batch 3 .*leaf \['name'\] is a str \('abc'\)") as info:
        ciclo.train_loop(0, batches, {ciclo.on_train_step: [train_step]}, prefetch=2)
    assert len(steps) == 3
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "the batch of step 3" in notes or not hasattr(info.value, "add_note")


def test_batches_are_placed_for_the_strategy_and_the_managed_step_copies_nothing(strategy: str) -> None:
    data = training.batches(2)
    if strategy != "eager":
        training.train_step(training.managed_state("linear", strategy), data[0])  # compiles unguarded
    state = training.managed_state("linear", strategy)
    for batch in ciclo.prefetch_to_device(data, size=2, strategy=state.strategy):
        x = batch[0]
        if strategy in ("data_parallel", "fsdp", "mesh"):
            assert x.sharding == NamedSharding(state.strategy.mesh, PartitionSpec("data"))
        elif strategy == "pmap":
            assert x.shape[0] == len(x.devices()) == jax.local_device_count()
        else:
            assert isinstance(x, jax.Array) and x.devices() == {jax.devices()[0]}
        # Where the step runs: the managed step's own lift finds the batch in place.
        assert state.strategy.lift_batch(batch)[0] is x
        # Nothing moves at the step, but where the step itself moves Python numbers to the device:
        # eager runs op by op, pmap indexes its logs' device axis.
        guard = "allow" if strategy in ("eager", "pmap") else "disallow"
        with jax.transfer_guard(guard):
            _, state = training.train_step(state, batch)
    reference = training.managed_state("linear", strategy)
    for batch in data:
        _, reference = training.train_step(reference, batch)
    assert_bitwise_equal(params_of(state), params_of(reference))


def test_the_guard_above_catches_a_batch_copied_at_the_step() -> None:
    state = training.managed_state("linear", "jit")
    batch = training.batches(1)[0]
    training.train_step(state, batch)
    with jax.transfer_guard("disallow"), pytest.raises(Exception, match="Disallowed host-to-device transfer"):
        training.train_step(state, batch)


@pytest.mark.parametrize("strategy", ["jit", "data_parallel"])
def test_stacked_groups_are_placed_whole_and_train_as_without_prefetch(strategy: str) -> None:
    groups = list(ciclo.prefetch_to_device(ciclo.stacked(training.batches(4), 2), strategy=strategy))
    assert [(group.steps, group.samples) for group in groups] == [(2, 16), (2, 16)]
    assert all(isinstance(leaf, jax.Array) for group in groups for leaf in jax.tree.leaves(group))

    def train(prefetch: int | None) -> list[np.ndarray]:
        state = training.managed_state("linear", strategy)
        state, _, _ = ciclo.train_loop(
            state,
            training.batches(6),
            {ciclo.on_train_step: [training.train_step]},
            steps_per_execution=2,
            prefetch=prefetch,
        )
        return params_of(state)

    assert_bitwise_equal(train(2), train(None))


def test_without_get_state_it_has_no_state_and_a_backup_counts_the_batches(tmp_path: Any) -> None:
    prefetched = ciclo.prefetch_to_device(iter(training.batches(2)))
    assert not hasattr(prefetched, "get_state") and not hasattr(prefetched, "set_state")
    assert iterator_state(prefetched) is None

    def run(stop: int) -> Any:
        state, history, _ = ciclo.train_loop(
            training.managed_state("linear", "jit"),
            training.batches(10),
            {ciclo.on_train_step: [training.train_step]},
            stop=stop,
            prefetch=2,
            backup=tmp_path,
        )
        return state, history

    run(4)  # ends with two batches read ahead, never trained on
    resumed, history = run(8)
    reference, expected = run_uninterrupted(training.batches(10), 8)
    assert_bitwise_equal(params_of(resumed), params_of(reference))
    assert history.collect("losses.mse") == expected.collect("losses.mse")


def run_uninterrupted(dataset: Any, stop: int) -> Any:
    state, history, _ = ciclo.train_loop(
        training.managed_state("linear", "jit"),
        dataset,
        {ciclo.on_train_step: [training.train_step]},
        stop=stop,
    )
    return state, history


@needs_grain
def test_get_state_is_the_position_of_the_last_batch_taken() -> None:
    source = grain_batches()
    start = source.get_state()
    prefetched = ciclo.prefetch_to_device(source, size=3)
    assert prefetched.get_state() == start
    taken = [next(prefetched) for _ in range(2)]
    after_two = grain_batches()
    for _ in range(2):
        next(after_two)
    assert source.get_state() != after_two.get_state()  # the source is 3 batches further
    assert prefetched.get_state() == after_two.get_state()

    # A new run set to that state goes on with the third batch.
    resumed = ciclo.prefetch_to_device(grain_batches(), size=3)
    resumed.set_state(prefetched.get_state())
    third = next(resumed)
    np.testing.assert_array_equal(third[0], next(after_two)[0])
    assert not np.array_equal(third[0], taken[1][0])

    # close() moves the source back to the batch after the last one taken.
    prefetched.close()
    np.testing.assert_array_equal(next(source)[0], third[0])


class Crash(Exception):
    pass


def crash_at(step: int) -> Any:
    def callback(elapsed: ciclo.types.Elapsed) -> None:
        if elapsed.steps == step:
            raise Crash(f"crashed at step {step}")

    return callback


@needs_grain
def test_a_train_loop_resumed_from_a_backup_ends_bitwise_as_one_never_stopped(tmp_path: Any) -> None:
    def run(source: Any, *callbacks: Any) -> Any:
        state, history, _ = ciclo.train_loop(
            training.managed_state("linear", "jit"),
            source,
            {ciclo.on_train_step: [training.train_step, *callbacks]},
            stop=8,
            prefetch=2,
            backup=ciclo.backup(tmp_path, every=3),
        )
        return state, history

    with pytest.raises(Crash):  # the last backup, at step 6, was taken with two batches read ahead
        run(grain_batches(), crash_at(7))
    source = grain_batches()
    resumed, history = run(source)
    reference, expected = run_uninterrupted(grain_batches(), 8)
    assert_bitwise_equal(params_of(resumed), params_of(reference))
    assert history.collect("steps", "losses.mse") == expected.collect("steps", "losses.mse")
    # The loop returned the source at its position: the batch after the 8th.
    after = grain_batches()
    for _ in range(8):
        next(after)
    assert source.get_state() == after.get_state()
