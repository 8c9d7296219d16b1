"""Runs a whole loop inside a callback: `ciclo.inner_loop`, and `train_loop`'s test pass at epoch ends."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Generic, Literal, final

import numpy as np

from ciclo._src.base.batches import count, leading_dim
from ciclo._src.base.checks import DataWarning, TestData, check_bool
from ciclo._src.base.elapsed import Elapsed
from ciclo._src.base.reprs import short
from ciclo._src.base.types import CallbackOutput, S
from ciclo._src.callbacks._monitor import snapshot_fields
from ciclo._src.engine.callback import Callback
from ciclo._src.engine.phases import LoopState
from ciclo._src.logs.logs import History, Logs
from ciclo._src.logs.step_output import NO_LOGS, describe
from ciclo._src.state.metrics import running_entries

AggregationName = Literal["last", "first", "mean", "sum", "min", "max"]
Aggregation = AggregationName | Callable[[Sequence[Any]], Any]
"""How an entry's values over the inner loop's history become one value."""

AggregationLike = Aggregation | Mapping[str, Aggregation]
"""One aggregation for every entry, or a dict of them by entry or collection (see `ciclo.inner_loop`)."""

LoopFn = Callable[[Any], tuple[Any, History, Elapsed]]

Reducer = Callable[[Sequence[Any], np.ndarray], Any]  # (values, samples per step) -> value

# Per-batch values, reduced to their mean weighted by samples by default; other collections
# (`stateful_metrics`, running values as Keras', `outputs`) keep their last value.
PER_BATCH_COLLECTIONS: Final = ("metrics", "losses")

# Collections a dict may name although the inner loop logged nothing there (a test step with no losses).
_KNOWN_COLLECTIONS: Final = frozenset((*PER_BATCH_COLLECTIONS, "stateful_metrics", "outputs"))


def _reduce(fn: Callable[..., Any], values: Sequence[Any], **kwargs: Any) -> Any:
    stacked = np.stack([np.asarray(v) for v in values])
    result = fn(stacked, axis=0, **kwargs)
    if np.issubdtype(stacked.dtype, np.floating):
        result = result.astype(stacked.dtype)
    return result.item() if np.ndim(result) == 0 else result


_REDUCERS: dict[str, Reducer] = {
    "last": lambda values, _: values[-1],
    "first": lambda values, _: values[0],
    # Batches that count no samples (plain Python values count one each) weigh the same.
    "mean": lambda values, samples: _reduce(
        np.average, values, weights=samples if samples.sum() > 0 else None
    ),
    "sum": lambda values, _: _reduce(np.sum, values),
    "min": lambda values, _: _reduce(np.min, values),
    "max": lambda values, _: _reduce(np.max, values),
}


def _check_aggregation(aggregation: Any, where: str) -> Reducer:
    if isinstance(aggregation, str):
        if aggregation in _REDUCERS:
            return _REDUCERS[aggregation]
    elif callable(aggregation):
        fn = aggregation
        return lambda values, _: fn(values)
    raise ValueError(
        f"{where}: unknown aggregation {short(aggregation)}; use one of {sorted(_REDUCERS)} or a function"
    )


# A loss's sums so far: of each step's value times its samples, and of the values, each step weighing one.
_SUMS: Final = ("weighted", "samples", "total", "steps")


@final
class RunningLosses(Callback):
    """Logs each loss of a step as its sample-weighted mean over the steps so far: `test_loop`'s losses.

    The history names these entries in `History.running`, so that an inner
    loop keeps their last value; a backup keeps the sums (docs/loops.md).
    """

    state_key = "test_loop.running_losses"

    def __init__(self, batch_size_fn: Callable[[Any], int] | None) -> None:
        self._batch_size_fn = leading_dim if batch_size_fn is None else batch_size_fn
        self._sums: dict[str, dict[str, Any]] = {}

    def on_start(self, loop_state: LoopState[Any], /) -> None:
        # A resumed run's losses, whose sums `load_state_dict` handed back, are running values too.
        loop_state.history.running.update(f"losses.{name}" for name in self._sums)

    def __loop_callback__(self, loop_state: LoopState[Any]) -> CallbackOutput[Any]:
        losses = loop_state.logs.get("losses")
        if not losses:
            return NO_LOGS, loop_state.state
        _, samples = count(loop_state.batch, self._batch_size_fn)
        running = Logs()
        for name, value in losses.items():
            sums = self._sums.get(name)
            if sums is None:
                sums = self._sums[name] = dict.fromkeys(_SUMS, 0)
                loop_state.history.running.add(f"losses.{name}")
            sums["weighted"] = sums["weighted"] + value * samples  # new values: a backup may hold the old
            sums["total"] = sums["total"] + value
            sums["samples"] += samples
            sums["steps"] += 1
            # The mean `"mean"` gives: by samples, else (batches that count none) by steps.
            by_samples = sums["samples"] > 0
            running.add_loss(
                name, sums["weighted"] / sums["samples"] if by_samples else sums["total"] / sums["steps"]
            )
        return running, loop_state.state

    def state_dict(self) -> dict[str, dict[str, Any]]:
        """The sums of each loss so far, by the loss's name."""
        return {name: dict(sums) for name, sums in self._sums.items()}

    def load_state_dict(self, state: Any, /) -> None:
        if not isinstance(state, Mapping):
            raise TypeError(
                f"test_loop's running losses take the dict state_dict() returned, got {short(state)}"
            )
        sums = {}
        for name, fields in state.items():
            checked = snapshot_fields(fields, _SUMS, f"test_loop's running loss {short(name)}")
            sums[str(name)] = {**checked, "samples": int(checked["samples"]), "steps": int(checked["steps"])}
        self._sums = sums


@final
class InnerLoop(Callback, Generic[S]):
    """Runs a loop function as a callback; see `ciclo.inner_loop`."""

    def __init__(
        self,
        name: str | None,
        loop_fn: LoopFn,
        output_state: bool,
        aggregation: AggregationLike | None,
    ) -> None:
        if not callable(loop_fn):
            raise TypeError(
                f"inner_loop needs a function state -> (state, history, elapsed), got {short(loop_fn)}"
            )
        check_bool(output_state, "output_state")
        self.name = name
        self.loop_fn = loop_fn
        self.output_state = output_state
        self._every: Reducer | None = None  # one rule for all entries, else rules by path, name, collection
        self._by_key: dict[str, Reducer] = {}
        if isinstance(aggregation, Mapping):
            for key, agg in aggregation.items():
                if not isinstance(key, str):
                    raise TypeError(f"aggregation keys are entry or collection names, got {short(key)}")
                self._by_key[key] = _check_aggregation(agg, f"aggregation[{short(key)}]")
        elif aggregation is not None:
            self._every = _check_aggregation(aggregation, "aggregation")

    def __repr__(self) -> str:
        # Named in the notes of errors raised inside the inner loop ("raised by callback ...").
        return f"inner_loop({self.name!r}, {describe(self.loop_fn)})"

    def __call__(self, state: S) -> CallbackOutput[S]:
        """Runs the inner loop from `state`: its aggregated logs, and its final state if `output_state`."""
        inner_state, inner_history, elapsed = self.loop_fn(state)
        logs = self.aggregate(inner_history, elapsed=elapsed, state=state)
        return logs, (inner_state if self.output_state else state)

    def aggregate(self, history: History, *, elapsed: Elapsed, state: Any = None) -> Logs:
        """Reduces a history to one `Logs` as `ciclo.inner_loop` says, entries renamed `<entry>_<name>`.

        `elapsed`, the inner loop's final counts, tells the samples of its last
        step; `state`, the one it started from, its running metrics.
        """
        values: dict[tuple[str, str], list[Any]] = {}
        steps: dict[tuple[str, str], list[int]] = {}
        counts: list[tuple[int, int]] = []
        for index, entry in enumerate(history):
            for collection, entries in entry.items():
                if collection == "elapsed":
                    counts.append((entries["steps"], entries["samples"]))
                    continue
                for key, value in entries.items():
                    values.setdefault((collection, key), []).append(value)
                    steps.setdefault((collection, key), []).append(index)
        if not values:
            return Logs()
        # A key that names no entry is refused, so that a misspelt name is not silently ignored.
        known = {part for c, n in values for part in (f"{c}.{n}", c, n)} | _KNOWN_COLLECTIONS
        unknown = [key for key in self._by_key if key not in known]
        if unknown:
            raise ValueError(
                f"aggregation names {short(unknown[0])}, which is no entry or collection of the inner "
                f"loop's logs; present: {sorted(f'{c}.{n}' for c, n in values)}"
            )
        running = {*running_entries(state), *history.running}  # paths of running values: the last
        # An entry is committed with the counts before its step, so its step counted the samples up to
        # the next entry (or to `elapsed`, for the last one); a gap of several steps shares them evenly.
        ends = [*counts[1:], (elapsed.steps, elapsed.samples)]
        samples = np.array(
            [
                (seen_next - seen) / max(at_next - at, 1)
                for (at, seen), (at_next, seen_next) in zip(counts, ends, strict=True)
            ]
        )
        logs = Logs()
        suffix = f"_{self.name}" if self.name else ""
        for (collection, key), series in values.items():
            by_key = self._by_key
            reduce = (
                self._every or by_key.get(f"{collection}.{key}") or by_key.get(key) or by_key.get(collection)
            )
            if reduce is None:
                per_batch = collection in PER_BATCH_COLLECTIONS and f"{collection}.{key}" not in running
                reduce = _REDUCERS["mean" if per_batch else "last"]
            logs.add_entry(collection, key + suffix, reduce(series, samples[steps[(collection, key)]]))
        return logs

    def __loop_callback__(self, loop_state: LoopState[S]) -> CallbackOutput[S]:
        return self(loop_state.state)


def inner_loop(
    name_or_loop_fn: str | LoopFn,
    maybe_loop_fn: LoopFn | None = None,
    *,
    output_state: bool = False,
    aggregation: AggregationLike | None = None,
) -> InnerLoop[Any]:
    """A callback that runs a whole loop, e.g. an evaluation loop during training.

    The loop function takes the state and returns `(state, history, elapsed)`,
    as the loops do. Its history is reduced to one value per entry, renamed
    `<entry>_<name>` when a name is given. An entry's reduction is, first
    match wins: `aggregation`'s rule for it; the last value for the state's
    running metrics; the mean weighted by samples for `metrics` and `losses`;
    else the last value (docs/loops.md, "How test results are aggregated").

    Args:
        name_or_loop_fn: the name used as suffix, or the loop function.
        maybe_loop_fn: the loop function when a name is given first.
        output_state: return the inner loop's final state (default: keep the
            outer state unchanged).
        aggregation: `"last"`, `"first"`, `"mean"` (weighted by samples),
            `"sum"`, `"min"`, `"max"`, a function of the list of values, or a
            dict of those by full path, entry name or collection.

    Raises:
        ValueError: for an unknown aggregation, and, when the inner loop has
            run, for a dict key that names none of its entries or collections.

    Example:
        >>> import ciclo, numpy as np
        >>> def eval_step(state, batch):
        ...     return ciclo.logs().add_metric("error", float(batch.mean()))
        >>> batches = [np.full(4, 1.0), np.full(4, 2.0), np.full(2, 4.0)]  # the last batch is short
        >>> evaluate = ciclo.inner_loop(
        ...     "test", lambda state: ciclo.loop(state, batches, {ciclo.every(1): [eval_step]})
        ... )
        >>> evaluate(state=None)  # the mean over the 10 samples
        ({'metrics': {'error_test': 2.0}}, None)
        >>> ciclo.inner_loop("test", evaluate.loop_fn, aggregation={"error": "last"})(None)
        ({'metrics': {'error_test': 4.0}}, None)
    """
    if isinstance(name_or_loop_fn, str):
        if maybe_loop_fn is None:
            raise TypeError(f"inner_loop({short(name_or_loop_fn)}, ...) also needs the loop function")
        return InnerLoop(name_or_loop_fn, maybe_loop_fn, output_state, aggregation)
    if maybe_loop_fn is not None:
        raise TypeError("inner_loop takes (name, loop_fn) or (loop_fn), not two loop functions")
    return InnerLoop(None, name_or_loop_fn, output_state, aggregation)


def epoch_test(
    test_dataset: Callable[[], Iterable[Any]] | None,
    test_loop: Callable[[Any, Iterable[Any]], tuple[Any, History, Elapsed]],
    *,
    name: str,
    bounded: bool,
    inner_loop_kwargs: Mapping[str, Any] | None,
    aggregation: AggregationLike | None,
) -> InnerLoop[Any] | None:
    """`train_loop`'s test pass: `test_loop(state, test_dataset())` as an `inner_loop` named `name`.

    `bounded`: each pass stops at a `test_duration` (an endless test set is then allowed). None
    without a `test_dataset`.
    """
    if not isinstance(name, str):
        raise TypeError(f"test_name must be a string, got {short(name)}")
    if test_dataset is None:
        return None
    if not callable(test_dataset):
        raise TypeError(
            f"test_dataset must be a zero-argument function returning the test batches, "
            f"e.g. `test_dataset=lambda: get_test_batches()`; got {short(test_dataset)}"
        )
    kwargs: dict[str, Any] = dict(inner_loop_kwargs or {})
    if aggregation is not None:
        if "aggregation" in kwargs:
            raise TypeError("pass test_aggregation or inner_loop_kwargs['aggregation'], not both")
        kwargs["aggregation"] = aggregation
    make_test_dataset = TestData(test_dataset, bounded=bounded)

    def run_test(state: Any) -> tuple[Any, History, Elapsed]:
        data = make_test_dataset()
        with warnings.catch_warnings():
            # A test set shorter than test_duration is no news; an empty one is warned below.
            warnings.simplefilter("ignore", DataWarning)
            result = test_loop(state, data)
        if result[2].steps == 0:
            warnings.warn(
                f"a test pass yielded no batch: test_dataset() returned {type(data).__name__} "
                f"{data!r:.60} with nothing in it; return the test batches (fresh on each call)",
                DataWarning,
                stacklevel=2,
            )
        return result

    return inner_loop(name, run_test, **kwargs)
