"""ciclo.lr_find: the learning-rate range test on a copy of the state, and its suggestion."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support import training

import ciclo
from ciclo import managed
from ciclo._src.state.learning_rate import with_learning_rate


def separable_batch(rows: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Two classes, ±1, on either side of a plane: one full batch, so that the loss curve is smooth."""
    x = np.random.default_rng(0).normal(size=(rows, training.FEATURES)).astype(np.float32)
    return x, np.sign(x[:, :1] + x[:, 1:2]).astype(np.float32)


def injected(rate: float = 0.1) -> optax.GradientTransformation:
    return optax.inject_hyperparams(optax.sgd)(learning_rate=rate)


def mlp_state(
    tx: optax.GradientTransformation, strategy: str = "jit", **options: Any
) -> managed.ManagedState:
    init, apply = training.MODELS["mlp"]
    return managed.ManagedState.create(
        params=init(jax.random.key(0)), tx=tx, apply_fn=apply, strategy=strategy, **options
    )


def linear_state(
    tx: optax.GradientTransformation, strategy: str = "jit", **options: Any
) -> managed.ManagedState:
    return managed.ManagedState.create(
        params=training.init_linear(jax.random.key(0)),
        tx=tx,
        apply_fn=training.apply_linear,
        strategy=strategy,
        **options,
    )


def loss_after(state: managed.ManagedState, rate: float, batch: Any, steps: int = 100) -> float:
    state = state.replace(opt_state=with_learning_rate(state.opt_state, rate))
    for _ in range(steps):
        _, state = training.train_step(state, batch)
    return float(training.mse(training.apply_mlp, state.params, batch))


def test_the_suggested_rate_trains_better_than_the_smallest() -> None:
    batch = separable_batch()
    state = mlp_state(injected())

    result = ciclo.lr_find(state, [batch], min_lr=1e-4, max_lr=10.0, train_step=training.train_step)

    assert result.suggestion is not None
    assert 1e-4 < result.suggestion < 10.0
    start = float(training.mse(training.apply_mlp, state.params, batch))
    at_suggestion, at_min = loss_after(state, result.suggestion, batch), loss_after(state, 1e-4, batch)
    assert at_suggestion < at_min < start
    assert at_suggestion < 0.5 * start
    # The points recorded: growing rates, one loss each, smoothed from the first loss on.
    assert np.all(np.diff(result.rates) > 0) and result.rates[0] == pytest.approx(1e-4)
    assert len(result.losses) == len(result.smoothed) == len(result.rates)
    assert result.smoothed[0] == pytest.approx(result.losses[0])


def test_the_state_passed_in_is_unchanged_bit_for_bit(strategy: str) -> None:
    # jit_donate (and a donating mesh strategy) would consume the state's buffers without a copy.
    state = linear_state(injected(), strategy, ema_decay=0.5)
    before = [np.array(leaf) for leaf in jax.tree.leaves(state)]

    result = ciclo.lr_find(state, training.batches(3), steps=5, train_step=training.train_step)

    assert len(result.rates) == 5
    after = jax.tree.leaves(state)
    assert len(after) == len(before)
    for old, new in zip(before, after, strict=True):
        assert np.array_equal(old, np.asarray(new))


def test_the_rate_is_an_input_of_the_step_compiled_once() -> None:
    traces = []

    @managed.train_step
    def counted(state: managed.ManagedState, batch: Any) -> ciclo.types.Logs:
        traces.append(1)
        return ciclo.logs().add_loss("mse", training.mse(training.apply_linear, state.params, batch))

    result = ciclo.lr_find(linear_state(injected()), training.batches(3), steps=6, train_step=counted)

    assert len(result.rates) == 6
    assert len(traces) == 1


def test_a_diverging_loss_stops_the_sweep_early() -> None:
    result = ciclo.lr_find(
        linear_state(injected()),
        training.batches(4),
        min_lr=1e-3,
        max_lr=1e6,
        steps=60,
        train_step=training.train_step,
    )

    assert result.diverged
    assert 2 <= len(result.rates) < 60
    assert result.rates[-1] < 1e6
    last = result.losses[-1]
    assert not np.isfinite(last) or result.smoothed[-1] > 4 * result.smoothed.min()


def test_accumulate_steps_runs_one_optimizer_step_per_rate() -> None:
    taken = []

    def counting(batches: list[Any]) -> Iterator[Any]:
        for batch in batches:
            taken.append(1)
            yield batch

    state = linear_state(injected(), accumulate_steps=2)
    result = ciclo.lr_find(state, counting(training.batches(8)), steps=3, train_step=training.train_step)

    assert len(result.rates) == 3 and len(taken) == 6
    assert not result.diverged


def test_a_list_is_cycled_and_an_iterator_that_ends_ends_the_sweep() -> None:
    state = linear_state(injected())
    assert len(ciclo.lr_find(state, training.batches(2), steps=5, train_step=training.train_step).rates) == 5

    result = ciclo.lr_find(state, iter(training.batches(3)), steps=5, train_step=training.train_step)
    assert len(result.rates) == 3 and not result.diverged

    with pytest.raises(ValueError, match="gave no batch"):
        ciclo.lr_find(state, [], steps=5, train_step=training.train_step)


def test_the_state_train_step_method_is_the_default() -> None:
    state = ciclo.create_model_state(
        training.LinearClassifier(),
        inputs=jnp.zeros((1, training.FEATURES)),
        tx=injected(),
        losses=optax.softmax_cross_entropy_with_integer_labels,
    )
    result = ciclo.lr_find(state, training.class_batches(3), steps=4)
    assert len(result.rates) == 4


def test_an_optimizer_without_an_injected_rate_is_refused_with_the_fix() -> None:
    with pytest.raises(
        ValueError, match=r"no learning_rate hyperparameter.*optax\.inject_hyperparams\(optax\.adam\)"
    ):
        ciclo.lr_find(linear_state(optax.sgd(0.1)), training.batches(2), train_step=training.train_step)
    with pytest.raises(ValueError, match="injects 2"):
        ciclo.lr_find(
            linear_state(optax.chain(injected(), injected())),
            training.batches(2),
            train_step=training.train_step,
        )


def test_an_injected_schedule_is_refused() -> None:
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=optax.linear_schedule(0.1, 0.01, 10))
    with pytest.raises(ValueError, match="is a schedule"):
        ciclo.lr_find(linear_state(tx), training.batches(2), train_step=training.train_step)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"min_lr": 1.0, "max_lr": 1.0}, r"min_lr \(1.0\) must be below max_lr \(1.0\)"),
        ({"min_lr": 2.0, "max_lr": 1.0}, "must be below max_lr"),
        ({"min_lr": 0.0}, "min_lr must be a positive finite number, got 0.0"),
        ({"max_lr": float("inf")}, "max_lr must be a positive finite number"),
        ({"steps": 1}, r"steps must be an int >= 2 \(the rates tried\), got 1"),
        ({"steps": True}, "steps must be an int >= 2"),
    ],
)
def test_bad_arguments_are_refused_before_any_step(arguments: dict[str, Any], message: str) -> None:
    def never(state: Any, batch: Any) -> Any:
        raise AssertionError("no step runs")

    with pytest.raises(ValueError, match=message):
        ciclo.lr_find(linear_state(injected()), training.batches(2), train_step=never, **arguments)


def test_a_state_that_is_not_managed_is_refused() -> None:
    with pytest.raises(TypeError, match="needs a ciclo.types.ModelState"):
        ciclo.lr_find(0.0, [1.0])
    with pytest.raises(TypeError, match="no train_step method"):
        ciclo.lr_find(linear_state(injected()), training.batches(2))


def test_plot_draws_the_losses_against_the_rates(tmp_path: Path) -> None:
    result = ciclo.lr_find(
        linear_state(injected()), training.batches(2), steps=5, train_step=training.train_step
    )
    figure = result.plot(path=tmp_path / "lr.png")

    (axes,) = figure.axes
    raw, smoothed = axes.lines[:2]
    assert raw.get_xdata().tolist() == result.rates.tolist()
    assert raw.get_ydata().tolist() == result.losses.tolist()
    assert smoothed.get_ydata().tolist() == result.smoothed.tolist()
    assert axes.get_xscale() == "log"
    assert (tmp_path / "lr.png").read_bytes().startswith(b"\x89PNG")


def test_plot_without_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    result = ciclo.types.LRFindResult(np.ones(3), np.ones(3), np.ones(3), suggestion=None, diverged=False)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(
        ImportError, match=r'LRFindResult.plot needs matplotlib: pip install "ciclo-core\[plot\]"'
    ):
        result.plot()
