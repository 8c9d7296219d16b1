"""Runs a whole loop inside a callback (an evaluation loop inside training, say)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Literal, final

import numpy as np

from ciclo._src.elapsed import Elapsed
from ciclo._src.logs import History, Logs
from ciclo._src.loop import LoopState
from ciclo._src.types import CallbackOutput, S

AggregationName = Literal["last", "first", "mean", "sum", "min", "max"]
Aggregation = AggregationName | Callable[[Sequence[Any]], Any]
"""How an entry's values over the inner loop's history become one value."""

AggregationLike = Aggregation | Mapping[str, Aggregation]
"""One aggregation for every collection, or `{collection: aggregation}` ("last" for the rest)."""

LoopFn = Callable[[Any], tuple[Any, History, Elapsed]]

_REDUCERS: dict[str, Callable[[Sequence[Any]], Any]] = {
    "last": lambda values: values[-1],
    "first": lambda values: values[0],
    "mean": lambda values: _reduce(np.mean, values),
    "sum": lambda values: _reduce(np.sum, values),
    "min": lambda values: _reduce(np.min, values),
    "max": lambda values: _reduce(np.max, values),
}


def _reduce(fn: Callable[..., Any], values: Sequence[Any]) -> Any:
    result = fn(np.stack([np.asarray(v) for v in values]), axis=0)
    return result.item() if np.ndim(result) == 0 else result


def _check_aggregation(aggregation: Any, where: str) -> Callable[[Sequence[Any]], Any]:
    if callable(aggregation):
        return aggregation  # type: ignore[no-any-return]
    if aggregation in _REDUCERS:
        return _REDUCERS[aggregation]
    raise ValueError(
        f"{where}: unknown aggregation {aggregation!r}; use one of {sorted(_REDUCERS)} or a function"
    )


@final
class InnerLoop(Generic[S]):
    """Runs a loop function as a callback; see `ciclo.inner_loop`."""

    def __init__(
        self,
        name: str | None,
        loop_fn: LoopFn,
        output_state: bool,
        aggregation: AggregationLike,
    ) -> None:
        if not callable(loop_fn):
            raise TypeError(
                f"inner_loop needs a function state -> (state, history, elapsed), got {loop_fn!r}"
            )
        self.name = name
        self.loop_fn = loop_fn
        self.output_state = output_state
        self._default = _REDUCERS["last"]
        self._per_collection: dict[str, Callable[[Sequence[Any]], Any]] = {}
        if isinstance(aggregation, Mapping):
            for collection, agg in aggregation.items():
                self._per_collection[collection] = _check_aggregation(agg, f"aggregation[{collection!r}]")
        else:
            self._default = _check_aggregation(aggregation, "aggregation")

    def __call__(self, state: S) -> CallbackOutput[S]:
        """Runs the inner loop from `state`; returns its aggregated logs and a state.

        The state is the inner loop's final state with `output_state=True`,
        else `state` unchanged.
        """
        inner_state, inner_history, _ = self.loop_fn(state)
        return self.aggregate(inner_history), (inner_state if self.output_state else state)

    def aggregate(self, history: History) -> Logs:
        """Reduces a history to one `Logs`, renaming entries with the `_name` suffix."""
        values: dict[tuple[str, str], list[Any]] = {}
        for entry in history:
            for collection, entries in entry.items():
                if collection == "elapsed":
                    continue
                for key, value in entries.items():
                    values.setdefault((collection, key), []).append(value)
        logs = Logs()
        suffix = f"_{self.name}" if self.name else ""
        for (collection, key), series in values.items():
            reduce = self._per_collection.get(collection, self._default)
            logs.add_entry(collection, key + suffix, reduce(series))
        return logs

    def __loop_callback__(self, loop_state: LoopState[S]) -> CallbackOutput[S]:
        """Runs the inner loop from the current state."""
        return self(loop_state.state)


def inner_loop(
    name_or_loop_fn: str | LoopFn,
    maybe_loop_fn: LoopFn | None = None,
    *,
    output_state: bool = False,
    aggregation: AggregationLike = "last",
) -> InnerLoop[Any]:
    """A callback that runs a whole loop, e.g. an evaluation loop during training.

    The loop function receives the current state and returns
    `(state, history, elapsed)`, as `ciclo.loop` and the predefined loops do.
    Its history is reduced to one `Logs` per collection with `aggregation`, and
    each entry is renamed `<entry>_<name>` when a name is given.

    Args:
        name_or_loop_fn: the name used as suffix, or the loop function.
        maybe_loop_fn: the loop function when a name is given first.
        output_state: return the inner loop's final state (default: keep the
            outer state unchanged).
        aggregation: `"last"`, `"first"`, `"mean"`, `"sum"`, `"min"`, `"max"`, a
            function of the list of values, or a dict mapping collection names
            to those (collections not in the dict use `"last"`).

    Example:
        >>> import ciclo
        >>> def eval_step(state, batch):
        ...     return ciclo.logs().add_metric("error", batch)
        >>> evaluate = ciclo.inner_loop(
        ...     "test",
        ...     lambda state: ciclo.loop(state, [1.0, 2.0, 3.0], {ciclo.every(1): [eval_step]}),
        ...     aggregation="mean",
        ... )
        >>> evaluate(state=None)
        ({'metrics': {'error_test': 2.0}}, None)
    """
    if isinstance(name_or_loop_fn, str):
        if maybe_loop_fn is None:
            raise TypeError(f"inner_loop({name_or_loop_fn!r}, ...) also needs the loop function")
        return InnerLoop(name_or_loop_fn, maybe_loop_fn, output_state, aggregation)
    if maybe_loop_fn is not None:
        raise TypeError("inner_loop takes (name, loop_fn) or (loop_fn), not two loop functions")
    return InnerLoop(None, name_or_loop_fn, output_state, aggregation)
