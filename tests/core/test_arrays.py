"""ciclo.batches: arrays in memory as batches, resumed by a backup mid-epoch bit for bit."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support.training import LinearClassifier

import ciclo

X = np.random.default_rng(0).normal(size=(10, 8)).astype(np.float32)
Y = np.arange(10, dtype=np.int32) % 3


def rows(data) -> list[list[int]]:
    return [batch[1].tolist() for batch in data]


def test_batches_cut_in_order_keep_the_remainder_and_the_structure() -> None:
    assert rows(ciclo.batches((X, Y), 4)) == [[0, 1, 2, 0], [1, 2, 0, 1], [2, 0]]
    assert rows(ciclo.batches((X, Y), 4, drop_remainder=True, epochs=2)) == [[0, 1, 2, 0], [1, 2, 0, 1]] * 2
    (batch,) = list(ciclo.batches({"x": X, "y": Y}, 10))
    assert set(batch) == {"x", "y"} and batch["x"].shape == (10, 8)


def test_shuffling_is_a_new_order_each_epoch_from_the_seed() -> None:
    data = ciclo.batches((X, np.arange(10)), 5, shuffle=True, epochs=2)
    first, second = [sorted(sum(rows([next(data), next(data)]), [])) for _ in range(2)]
    assert first == second == list(range(10))
    again = rows(ciclo.batches((X, np.arange(10)), 5, shuffle=True, epochs=2))
    assert again == rows(ciclo.batches((X, np.arange(10)), 5, shuffle=True, epochs=2))
    assert again[:2] != again[2:]
    assert again != rows(ciclo.batches((X, np.arange(10)), 5, shuffle=True, seed=1, epochs=2))


def test_set_state_goes_back_to_a_position() -> None:
    data = ciclo.batches((X, np.arange(10)), 3, shuffle=True, epochs=None)
    for _ in range(5):
        next(data)
    state, rest = data.get_state(), rows([next(data) for _ in range(4)])
    other = ciclo.batches((X, np.arange(10)), 3, shuffle=True, epochs=None)
    other.set_state(state)
    assert rows([next(other) for _ in range(4)]) == rest


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"arrays": (X, Y[:5])}, ValueError, r"first dimension counts the samples, the same in each"),
        ({"arrays": 3.0}, ValueError, r"first dimension counts the samples"),
        ({"batch_size": 0}, ValueError, r"batch_size must be an int >= 1"),
        ({"batch_size": 11, "drop_remainder": True}, ValueError, r"leaves no batch of the 10 samples"),
        ({"shuffle": "yes"}, TypeError, r"shuffle must be True or False"),
        ({"epochs": 0}, ValueError, r"epochs must be an int >= 1 or None"),
    ],
)
def test_bad_arguments_are_refused(kwargs, error, pattern) -> None:
    kwargs = {"arrays": (X, Y), "batch_size": 4, **kwargs}
    with pytest.raises(error, match=pattern):
        ciclo.batches(kwargs.pop("arrays"), kwargs.pop("batch_size"), **kwargs)


def state() -> ciclo.types.ModelState:
    return ciclo.create_model_state(
        LinearClassifier(),
        inputs=jnp.zeros((1, 8)),
        tx=optax.sgd(0.1),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
    )


def test_a_backup_resumes_mid_epoch_bit_for_bit(tmp_path) -> None:
    def run(stop, backup=None):
        data = ciclo.batches((X, Y), 3, shuffle=True, seed=7, drop_remainder=True, epochs=None)
        return ciclo.train_loop(state(), data, stop=stop, epoch_duration=data.steps_per_epoch, backup=backup)

    whole, history, _ = run(10)
    run(5, tmp_path)  # stops in the second epoch; the next run makes a fresh iterator, as a script does
    saved = "".join(path.read_text() for path in tmp_path.rglob("metadata"))
    assert '"iterator_state": {"epoch": 1, "batch": 2}' in saved  # set_state puts it back: nothing skipped
    resumed, resumed_history, elapsed = run(10, tmp_path)
    assert elapsed.steps == 10
    np.testing.assert_array_equal(resumed.params["w"], whole.params["w"])
    assert resumed_history.collect("loss") == history.collect("loss")


@pytest.mark.parametrize(
    "dataset",
    [
        (X, Y),
        [X[:4], Y[:4]],
        {"x": X, "y": Y},
    ],
    ids=["the (X, Y) pair", "one batch as a list", "a dict of arrays"],
)
@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_the_whole_arrays_as_the_dataset_are_refused_naming_batches(dataset, steps_per_execution) -> None:
    with pytest.raises(
        TypeError, match=r"one leading size .* Wrap the arrays as batches, e.g. ciclo.batches"
    ):
        ciclo.train_loop(state(), dataset, steps_per_execution=steps_per_execution)


@pytest.mark.parametrize(
    "dataset",
    [
        [X[:4]] * 3,  # batches of one array
        (X[:4], X[4:8]),
        [np.zeros((4, 5), np.int32), np.zeros((4, 7), np.int32)],  # sequences padded per batch
        [X[:4], Y[:3]],
    ],
)
def test_batches_of_one_array_are_not_taken_for_the_whole_arrays(dataset) -> None:
    _, _, elapsed = ciclo.loop(0, dataset, {ciclo.every(1): lambda state: state + 1})
    assert elapsed.steps == len(dataset)
