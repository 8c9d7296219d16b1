"""How evaluation loops reduce their steps' logs to one value per entry (issue 12, items 4 and 5).

Per-batch values (`metrics`, `losses`) take their mean weighted by each batch's
samples, running values (`stateful_metrics`, a `ciclo.types.ModelState`'s metrics)
their last value, and `aggregation=` names the rule of any entry.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo

# 20 samples: the first two batches of 8 have one mistake each, the short last batch of 4 has only
# mistakes. The right answer is 14 / 20 = 0.7; the mean over the batches of 8 is 7/12 and the last
# batch says 0.0, so a wrong reduction cannot pass.
TARGET = (np.arange(20) % 2).astype(np.float32)
GUESS = TARGET.copy()
GUESS[[0, 9, 16, 17, 18, 19]] = 1.0 - GUESS[[0, 9, 16, 17, 18, 19]]
ACCURACY = float(np.mean(GUESS == TARGET))
assert ACCURACY == pytest.approx(0.7)


def batches(size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(GUESS[i : i + size], TARGET[i : i + size]) for i in range(0, len(TARGET), size)]


@dataclasses.dataclass(frozen=True, eq=False)
class Guesses:
    """A ModelAdapter whose predictions are its inputs (its parameter has no effect)."""

    def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Any, Any]:
        return jnp.zeros(()), None

    def apply(self, params, model_state, inputs, *, key, training):
        return inputs + 0.0 * params, model_state


def accuracy(preds, target):
    return (preds == target).astype(jnp.float32)


def batch_accuracy(state, batch):
    """A per-batch value logged next to the state's running metric."""
    guess, target = batch
    return ciclo.logs().add_metric("batch_accuracy", float(np.mean(guess == target)))


def model_state(strategy: str = "jit") -> ciclo.types.ModelState:
    return ciclo.create_model_state(
        Guesses(),
        inputs=jnp.zeros(4),
        tx=optax.sgd(0.1),
        losses={"mse": lambda preds, target: (preds - target) ** 2},
        metrics={"accuracy": accuracy},
        strategy=strategy,
    )


def test_a_per_batch_value_next_to_a_running_metric(strategy: str) -> None:
    check_per_batch_next_to_running(strategy, 8)


@pytest.mark.parametrize("size", [4, 20])
def test_the_test_values_do_not_depend_on_the_batch_size(size: int) -> None:
    check_per_batch_next_to_running("jit", size)


def check_per_batch_next_to_running(strategy: str, size: int) -> None:
    # The issue: with the per-collection {"metrics": "last"}, batch_accuracy_test was the last
    # batch's (0.9322 where the mean over the batches was 0.8701).
    _, history, _ = ciclo.train_loop(
        model_state(strategy),
        batches(4),
        {ciclo.on_test_step: [batch_accuracy]},
        test_dataset=lambda: batches(size),
        epoch_duration=2,
        stop=2,
    )
    running, per_batch, mse = history.collect("accuracy_test", "batch_accuracy_test", "mse_test")
    # Both are the accuracy over the 20 samples, whatever the batch size; so is the loss's mean.
    assert running == pytest.approx([ACCURACY]) and per_batch == pytest.approx([ACCURACY])
    assert mse == pytest.approx([1.0 - ACCURACY])


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RunningState:
    """A hand-written running accuracy: no reset_step, no test_aggregation."""

    right: jax.Array = dataclasses.field(default_factory=lambda: jnp.zeros(()))
    seen: jax.Array = dataclasses.field(default_factory=lambda: jnp.zeros(()))


def running_step(collection: str):
    def step(state: RunningState, batch):
        guess, target = batch
        state = RunningState(
            state.right + np.float32(np.sum(guess == target)), state.seen + np.float32(len(target))
        )
        return ciclo.logs().add_entry(collection, "accuracy", state.right / state.seen), state

    return step


def evaluate(state, size: int, collection: str, **kwargs: Any):
    loop_fn = lambda state: ciclo.test_loop(  # noqa: E731
        state, batches(size), {ciclo.on_test_step: [running_step(collection), batch_accuracy]}
    )
    logs, _ = ciclo.inner_loop("test", loop_fn, **kwargs)(state)
    return logs


@pytest.mark.parametrize("size", [8, 4, 20])
def test_a_hand_written_running_metric_logged_as_stateful(size: int) -> None:
    # The issue: a running value averaged over the steps is silently wrong (0.9297 instead of
    # 0.935). Logged in `stateful_metrics`, it is known to be running and keeps its last value.
    logs = evaluate(RunningState(), size, "stateful_metrics")
    assert logs["stateful_metrics"]["accuracy_test"] == pytest.approx(ACCURACY)
    assert logs["metrics"]["batch_accuracy_test"] == pytest.approx(ACCURACY)


def test_a_hand_written_running_metric_named_in_the_aggregation() -> None:
    logs = evaluate(RunningState(), 8, "metrics", aggregation={"accuracy": "last"})
    assert logs["metrics"] == pytest.approx({"accuracy_test": ACCURACY, "batch_accuracy_test": ACCURACY})
    # In `metrics` and named nowhere, it is taken for a per-batch value: the batch-weighted mean.
    running = np.cumsum(GUESS == TARGET)[[7, 15, 19]] / np.array([8, 16, 20])
    unnamed = evaluate(RunningState(), 8, "metrics")
    assert unnamed["metrics"]["accuracy_test"] == pytest.approx(np.average(running, weights=[8, 8, 4]))


def test_rules_by_path_name_and_collection() -> None:
    def step(state, batch):
        value = float(batch.sum())
        return ciclo.logs().add_metrics(top1=value, top2=value).add_loss("top1", value), state

    data = [np.ones(2), np.full(2, 3.0), np.full(1, 9.0)]  # 2, 6 and 9 over 5 samples
    loop_fn = lambda state: ciclo.loop(state, data, {ciclo.every(1): [step]})  # noqa: E731

    def run(aggregation: Any) -> dict[str, Any]:
        logs, _ = ciclo.inner_loop(loop_fn, aggregation=aggregation)(None)
        return {f"{c}.{n}": v for c, entries in logs.items() for n, v in entries.items()}

    weighted = (2 * 2 + 6 * 2 + 9 * 1) / 5
    assert run(None) == pytest.approx(
        {"metrics.top1": weighted, "metrics.top2": weighted, "losses.top1": weighted}
    )
    assert run({"top1": "sum", "top2": "last"}) == {
        "metrics.top1": 17.0,
        "metrics.top2": 9.0,
        "losses.top1": 17.0,
    }
    # A full path wins over a name, a name over a collection.
    assert run({"metrics.top1": "max", "top1": "min", "metrics": "first"}) == {
        "metrics.top1": 9.0,
        "metrics.top2": 2.0,
        "losses.top1": 2.0,
    }
    with pytest.raises(ValueError, match=r"'top3', which is no entry.*'metrics.top1'"):
        run({"top3": "last"})


def test_model_state_declares_its_running_metrics() -> None:
    @jax.tree_util.register_dataclass
    @dataclasses.dataclass(frozen=True)
    class Counts:
        """A metric whose value is a dict of entries."""

        right: jax.Array = dataclasses.field(default_factory=lambda: jnp.zeros(()))
        seen: jax.Array = dataclasses.field(default_factory=lambda: jnp.zeros(()))

        def reset(self):
            return Counts()

        def update(self, preds, target, **_):
            right = jnp.sum(preds == target, dtype=jnp.float32)
            return Counts(self.right + right, self.seen + jnp.float32(target.shape[0]))

        def merge(self, other):
            return Counts(self.right + other.right, self.seen + other.seen)

        def reduce(self):
            return Counts(self.right.sum(0), self.seen.sum(0))

        def compute(self):
            return {"right": self.right, "rate": self.right / self.seen}

    state = dataclasses.replace(
        model_state(), metrics={"accuracy": ciclo.metrics.Mean(accuracy), "counts": Counts()}
    )
    _, history, _ = ciclo.train_loop(
        state, batches(4), test_dataset=lambda: batches(8), epoch_duration=1, stop=1
    )
    right, rate, running = history.collect("right_test", "rate_test", "accuracy_test")
    assert right == [14.0] and rate == pytest.approx([ACCURACY]) and running == pytest.approx([ACCURACY])
    # An explicit rule wins over the state's: the mean of the running values.
    _, history, _ = ciclo.train_loop(
        state,
        batches(4),
        test_dataset=lambda: batches(8),
        epoch_duration=1,
        stop=1,
        test_aggregation={"right": "mean"},
    )
    assert history.collect("right_test") == [pytest.approx((7 * 8 + 14 * 8 + 14 * 4) / 20)]


def test_test_aggregation_and_inner_loop_kwargs_aggregation_are_exclusive() -> None:
    with pytest.raises(TypeError, match="not both"):
        ciclo.train_loop(
            model_state(),
            batches(4),
            test_dataset=lambda: batches(8),
            epoch_duration=1,
            test_aggregation="last",
            inner_loop_kwargs={"aggregation": "mean"},
        )
