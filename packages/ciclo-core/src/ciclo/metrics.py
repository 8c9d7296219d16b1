"""Stateful metrics: the `Metric` protocol, a running mean for plain callables, a clu adapter.

Example:
    >>> import jax.numpy as jnp
    >>> from ciclo import metrics
    >>> accuracy = metrics.as_metric(lambda preds, target: preds.argmax(-1) == target)
    >>> accuracy = accuracy.update(preds=jnp.eye(3), target=jnp.array([0, 1, 0]))
    >>> float(accuracy.compute())
    0.6666666865348816
"""

from ciclo._src.state.metrics import CluMetric as CluMetric
from ciclo._src.state.metrics import Mean as Mean
from ciclo._src.state.metrics import Metric as Metric
from ciclo._src.state.metrics import as_metric as as_metric
from ciclo._src.state.metrics import call_with_available as call_with_available

__all__ = ["CluMetric", "Mean", "Metric", "as_metric", "call_with_available"]
