"""The learning-rate range test: `ciclo.lr_find` and what it returns, `ciclo.types.LRFindResult`.

The rate is set in the `optax.inject_hyperparams` state inside the optimizer
state, a value the compiled step takes as input: the sweep compiles the step once.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final, final

import numpy as np

from ciclo._src.base.checks import check_int
from ciclo._src.base.reprs import short
from ciclo._src.base.types import CarriesOptimizer, Trainable
from ciclo._src.data.fused import as_logs_and_state
from ciclo._src.logs.plot import new_figure
from ciclo._src.state.learning_rate import injected_learning_rates, on_host, with_learning_rate
from ciclo._src.strategies._placement import copied

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SMOOTHING: Final = 0.98
"""The weight of the past in the smoothed loss (an exponential moving average, bias-corrected)."""

DIVERGENCE: Final = 4.0
"""The sweep stops once the smoothed loss exceeds this many times its lowest value (Lightning's)."""


@final
@dataclasses.dataclass(frozen=True, eq=False)  # arrays: == would be ambiguous
class LRFindResult:
    """What `ciclo.lr_find` measured: one point per learning rate tried, in the order tried.

    Attributes:
        rates: the learning rates tried, growing exponentially.
        losses: the training loss (the sum of the step's `losses`) at each rate.
        smoothed: `losses` smoothed by a bias-corrected moving average (`SMOOTHING`).
        suggestion: the rate where the smoothed loss falls fastest against
            log(rate), leaving out the first tenth of the points and the last;
            None when fewer than 3 points remain (lower `max_lr` or `min_lr`).
        diverged: whether the sweep stopped early because the loss diverged.
    """

    rates: np.ndarray[Any, np.dtype[np.float64]]
    losses: np.ndarray[Any, np.dtype[np.float64]]
    smoothed: np.ndarray[Any, np.dtype[np.float64]]
    suggestion: float | None
    diverged: bool

    def plot(self, path: str | os.PathLike[str] | None = None) -> Figure:
        """Draws the loss against the learning rate (log scale), raw and smoothed, with the suggestion.

        Needs matplotlib (`pip install "ciclo-core[plot]"`).

        Args:
            path: where to save the figure (as PNG, or the format its suffix names).

        Example:
            >>> import numpy as np
            >>> rates = np.geomspace(1e-3, 1.0, 4)
            >>> losses = np.array([1.0, 0.9, 0.5, 2.0])
            >>> result = LRFindResult(rates, losses, losses, suggestion=0.1, diverged=False)
            >>> [line.get_label() for line in result.plot().axes[0].lines]
            ['loss', 'smoothed', 'suggestion 0.1']
        """
        figure = new_figure("LRFindResult.plot", 6.0, 4.0)
        axes = figure.add_subplot(1, 1, 1)
        axes.plot(self.rates, self.losses, alpha=0.35, label="loss")
        axes.plot(self.rates, self.smoothed, label="smoothed")
        if self.suggestion is not None:
            axes.axvline(
                self.suggestion, color="tab:red", linestyle="--", label=f"suggestion {self.suggestion:.3g}"
            )
        axes.set_xscale("log")
        axes.set_xlabel("learning rate")
        axes.set_ylabel("loss")
        axes.grid(alpha=0.3)
        axes.legend()
        if path is not None:
            figure.savefig(os.fspath(path), dpi=100)
        return figure


def _batches(dataset: Iterable[Any]) -> Iterator[Any]:
    """The dataset's batches, from its start again when it ends (a one-shot iterator ends the sweep)."""
    while True:
        iterator = iter(dataset)
        empty = True
        for batch in iterator:
            empty = False
            yield batch
        if empty or iterator is dataset:
            return


def suggest(rates: np.ndarray[Any, Any], smoothed: np.ndarray[Any, Any], skip_begin: int) -> float | None:
    """The rate where `smoothed` falls fastest against log(rate), without the first points and the last.

    Example:
        >>> rates = np.geomspace(1e-5, 1.0, 6)
        >>> float(suggest(rates, np.array([1.0, 0.99, 0.98, 0.6, 0.55, 3.0]), skip_begin=0))
        0.01
    """
    kept = np.arange(skip_begin, len(rates) - 1)
    kept = kept[np.isfinite(smoothed[kept])]
    if len(kept) < 3:
        return None
    slopes = np.gradient(smoothed[kept], np.log(rates[kept]))
    return float(rates[kept[int(np.argmin(slopes))]])


def lr_find(
    state: Any,
    dataset: Iterable[Any],
    *,
    min_lr: float = 1e-7,
    max_lr: float = 10.0,
    steps: int = 100,
    train_step: Callable[[Any, Any], Any] | None = None,
) -> LRFindResult:
    """The learning-rate range test (Lightning's `Tuner.lr_find`): loss against an exponentially growing rate.

    Trains a copy of `state` (left as it was) for `steps` optimizer steps, the
    rate growing from `min_lr` to `max_lr`, until the loss diverges. The state's
    `tx` must inject a constant `learning_rate` (`optax.inject_hyperparams`);
    see docs/recipes.md, "Learning-rate range test". A `dataset` that ends is
    started again; a one-shot iterator that ends ends the sweep.

    Args:
        state: a `ciclo.types.ModelState` or `managed.ManagedState`.
        dataset: the training batches.
        min_lr: the first rate tried.
        max_lr: the last rate tried, if the loss has not diverged before.
        steps: how many rates to try (optimizer steps).
        train_step: the step to run, `(state, batch) -> (logs, state)` with the
            loss in the `losses` collection (a `managed.train_step`); default:
            the state's `train_step` method.

    Raises:
        ValueError: for bounds or `steps` out of range, a `tx` without one
            constant injected learning rate, or a step that logs no loss.
        TypeError: for a state that is not a managed state, or has no step.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> fit = managed.train_step(lambda s, x: ciclo.logs().add_loss("l2", jnp.sum((s.params - x) ** 2)))
        >>> tx = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)
        >>> state = managed.ManagedState.create(params=jnp.zeros(2), tx=tx)
        >>> result = ciclo.lr_find(state, [jnp.ones(2)], max_lr=100.0, steps=30, train_step=fit)
        >>> result.diverged, 0.01 < result.suggestion < 1.0, float(state.params[0])  # sgd diverges above 1
        (True, True, 0.0)
    """
    for name, value in (("min_lr", min_lr), ("max_lr", max_lr)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ValueError(f"{name} must be a positive finite number, got {short(value)}")
    if min_lr >= max_lr:
        raise ValueError(
            f"min_lr ({short(min_lr)}) must be below max_lr ({short(max_lr)}): the sweep grows from one to "
            "the other, e.g. min_lr=1e-7, max_lr=10.0"
        )
    check_int(steps, "steps", 2, " (the rates tried)")
    if not isinstance(state, CarriesOptimizer):
        raise TypeError(
            "ciclo.lr_find sets the learning rate in the state's optimizer state: it needs a "
            "ciclo.types.ModelState (ciclo.create_model_state, the adapters' create_*_state) or a "
            f"managed.ManagedState, got {short(state)}"
        )
    step = train_step
    if step is None:
        if not isinstance(state, Trainable):
            raise TypeError(
                f"{type(state).__name__} has no train_step method: pass the step, "
                "ciclo.lr_find(state, dataset, train_step=my_step), with my_step a managed.train_step"
            )
        step = type(state).train_step  # unbound, so that the step takes the state it is given
    injected = injected_learning_rates(state.opt_state)
    if not injected:
        raise ValueError(
            f"ciclo.lr_find sets the learning rate through optax.inject_hyperparams, and this state's tx "
            f"({short(state.tx)}) has no learning_rate hyperparameter: create the state with the optimizer "
            "wrapped, tx=optax.inject_hyperparams(optax.adam)(learning_rate=1e-3) for optax.adam(1e-3). "
            "(A plain optax optimizer keeps its rate in a closure, which ciclo cannot change.)"
        )
    if len(injected) > 1:
        raise ValueError(
            f"ciclo.lr_find sweeps one learning rate, and this state's tx injects {len(injected)} (one per "
            "optax.multi_transform group, say): sweep one group's rate with a tx that injects only it"
        )
    rates = np.geomspace(min_lr, max_lr, steps)
    micro_batches = state.options.accumulate_steps
    batches = _batches(dataset)
    current = copied(state)  # the steps may donate their input: the caller's state stays whole
    losses: list[float] = []
    smoothed: list[float] = []
    average, diverged = 0.0, False
    for rate in rates:
        current = current.replace(opt_state=with_learning_rate(current.opt_state, float(rate)))
        total, taken = 0.0, 0
        for batch in batches:
            logs, current = as_logs_and_state(step, current, batch)
            step_losses = logs.get("losses")
            if not step_losses:
                raise ValueError(
                    f"ciclo.lr_find reads the loss from the step's logs, and {short(step)} logged no losses "
                    f"(collections: {sorted(logs)}); log it with logs.add_loss('loss', value)"
                )
            total += sum(float(np.asarray(value).reshape(-1)[0]) for value in step_losses.values())
            taken += 1
            if taken == micro_batches:
                break
        if taken < micro_batches:
            if not losses:
                raise ValueError(f"ciclo.lr_find: the dataset {short(dataset)} gave no batch to train on")
            break
        (used,) = injected_learning_rates(current.opt_state)
        used = float(on_host(used).flat[0])
        if not math.isclose(used, rate, rel_tol=1e-5):
            raise ValueError(
                f"ciclo.lr_find set the learning rate to {rate:.6g} and the optimizer used {used:.6g}: "
                "its injected learning_rate is a schedule, which inject_hyperparams recomputes at each "
                "step. Run the test with a constant rate, tx=optax.inject_hyperparams(optax.adam)("
                "learning_rate=1e-3), then build the schedule around the rate found"
            )
        loss = total / micro_batches
        average = SMOOTHING * average + (1 - SMOOTHING) * loss
        losses.append(loss)
        smoothed.append(average / (1 - SMOOTHING ** len(losses)))
        best = min(smoothed)
        if not math.isfinite(loss) or (len(losses) > 1 and best > 0 and smoothed[-1] > DIVERGENCE * best):
            diverged = True
            break
    rates_tried, smoothed_losses = rates[: len(losses)], np.array(smoothed)
    suggestion = suggest(rates_tried, smoothed_losses, skip_begin=steps // 10)
    return LRFindResult(rates_tried, np.array(losses), smoothed_losses, suggestion, diverged)
