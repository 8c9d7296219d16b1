from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.optional import optional

from ciclo._src.state.metrics import CluMetric, Mean, Metric, as_metric, call_with_available

# Installed on Python < 3.12 only: its cases are left out of the parameter lists elsewhere.
jax_metrics = optional("jax_metrics")

# clu's Average (and so Accuracy) computes `total / count`, a float32 by an int32 count, which
# strict dtype promotion rejects: the tests that compute a clu metric run with standard promotion.
clu_promotion = pytest.mark.usefixtures("standard_dtype_promotion")


def stack(*metrics):
    """What `jax.lax.all_gather` does to a metric: a new leading axis on every leaf."""
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *metrics)


def classification_batches(sizes, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (
            jnp.asarray(rng.normal(size=(n, classes)), jnp.float32),
            jnp.asarray(rng.integers(0, classes, size=n), jnp.int32),
        )
        for n in sizes
    ]


def batch_accuracy(preds, target):
    return (preds.argmax(-1) == target).mean()


def sample_accuracy(preds, target):
    return preds.argmax(-1) == target


def true_accuracy(batches):
    correct = sum(int((p.argmax(-1) == t).sum()) for p, t in batches)
    return correct / sum(len(t) for _, t in batches)


def run(metric, batches):
    for preds, target in batches:
        metric = metric.update(preds=preds, target=target)
    return metric


# --- clu stand-ins ---------------------------------------------------------------------
# clu cannot be installed in the test environment of ciclo-core: `import clu.metrics`
# imports flax. These classes copy the interface of clu.metrics (Average, Accuracy,
# Collection) exactly: class methods `empty()` and `from_model_output(**kwargs)`, no
# reset/update, and `reduce()` scanning `_reduce_merge` over the leading axis.


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CluAverage:
    total: jax.Array
    count: jax.Array

    @classmethod
    def empty(cls):
        return cls(total=jnp.array(0, jnp.float32), count=jnp.array(0, jnp.int32))

    @classmethod
    def from_model_output(cls, values, mask=None, **_):
        values = values[None] if values.ndim == 0 else values
        mask = jnp.ones_like(values, dtype=bool) if mask is None else mask.astype(bool)
        return cls(
            total=jnp.where(mask, values, 0).sum(),
            count=jnp.where(mask, 1, 0).sum().astype(jnp.int32),
        )

    def merge(self, other):
        return type(self)(total=self.total + other.total, count=self.count + other.count)

    def _reduce_merge(self, other):
        return self.merge(other)

    def reduce(self):
        first = jax.tree.map(lambda x: x[0], self)
        remainder = jax.tree.map(lambda x: x[1:], self)
        return jax.lax.scan(lambda acc, m: (acc._reduce_merge(m), None), first, remainder)[0]

    def compute(self):
        return self.total / self.count


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CluAccuracy(CluAverage):
    @classmethod
    def from_model_output(cls, *, logits, labels, **kwargs):
        metric = super().from_model_output(values=(logits.argmax(-1) == labels).astype(jnp.float32), **kwargs)
        return cls(**vars(metric))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CluCollection:
    # clu's `Collection` has `single_from_model_output`, not `from_model_output`.
    accuracy: CluAccuracy

    @classmethod
    def empty(cls):
        return cls(accuracy=CluAccuracy.empty())

    @classmethod
    def single_from_model_output(cls, **kwargs):
        return cls(accuracy=CluAccuracy.from_model_output(**kwargs))

    def merge(self, other):
        return type(self)(accuracy=self.accuracy.merge(other.accuracy))

    def reduce(self):
        return type(self)(accuracy=self.accuracy.reduce())

    def compute(self):
        return {"accuracy": self.accuracy.compute()}


# --- Mean ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "sizes", "expected"),
    [
        # A scalar result is one observation: the mean over batches.
        (batch_accuracy, [4, 4, 4], "per_batch"),
        (batch_accuracy, [4, 2, 5], "per_batch"),
        # A per-sample result counts each sample: the mean over samples.
        (sample_accuracy, [4, 4, 4], "per_sample"),
        (sample_accuracy, [4, 2, 5], "per_sample"),
    ],
)
def test_mean(fn, sizes, expected):
    batches = classification_batches(sizes)
    metric = run(Mean(fn), batches)
    if expected == "per_batch":
        want = np.mean([float(batch_accuracy(p, t)) for p, t in batches])
        assert float(metric.count) == len(sizes)
    else:
        want = true_accuracy(batches)
        assert float(metric.count) == sum(sizes)
    assert float(metric.compute()) == pytest.approx(want)
    assert metric.total.dtype == metric.count.dtype == jnp.float32


def test_mean_counts_every_element_of_an_array_result():
    metric = Mean(lambda preds: preds).update(preds=jnp.arange(6.0).reshape(2, 3))
    assert (float(metric.total), float(metric.count)) == (15.0, 6.0)


def test_mean_merge_equals_sequential_updates():
    first, second = classification_batches([4, 3]), classification_batches([5], seed=1)
    merged = run(Mean(sample_accuracy), first).merge(run(Mean(sample_accuracy), second))
    assert float(merged.compute()) == pytest.approx(true_accuracy(first + second))
    assert merged.fn is sample_accuracy


def test_mean_reduce_over_a_stacked_leading_axis():
    parts = [classification_batches([4], seed=s) for s in range(3)]
    metrics = [run(Mean(sample_accuracy), part) for part in parts]
    reduced = stack(*metrics).reduce()
    assert reduced.total.shape == reduced.count.shape == ()
    assert float(reduced.count) == 12
    assert float(reduced.compute()) == pytest.approx(true_accuracy(sum(parts, [])))


def test_mean_reduce_after_all_gather():
    (preds, target), *_ = classification_batches([8])
    preds, target = preds.reshape(4, 2, 3), target.reshape(4, 2)

    def per_device(p, t):
        local = Mean(sample_accuracy).update(preds=p, target=t)
        return jax.lax.all_gather(local, "devices").reduce()

    reduced = jax.vmap(per_device, axis_name="devices")(preds, target)
    assert reduced.count.shape == (4,)  # every device holds the same reduced metric
    np.testing.assert_allclose(reduced.compute(), true_accuracy([(preds.reshape(8, 3), target.reshape(8))]))


def test_mean_reset():
    metric = run(Mean(sample_accuracy), classification_batches([4])).reset()
    assert metric.fn is sample_accuracy
    assert (float(metric.total), float(metric.count)) == (0.0, 0.0)
    assert math.isnan(float(metric.compute()))


def test_mean_is_a_pytree_with_a_static_fn():
    metric = Mean(sample_accuracy)
    leaves, treedef = jax.tree.flatten(metric)
    assert len(leaves) == 2
    assert jax.tree.unflatten(treedef, leaves).fn is sample_accuracy
    assert jax.tree.structure(Mean(batch_accuracy)) != treedef


def test_mean_inside_jit_compiles_once():
    traces = 0

    def counted(preds, target):
        nonlocal traces
        traces += 1
        return sample_accuracy(preds, target)

    @jax.jit
    def step(metric, preds, target):
        return metric.update(preds=preds, target=target)

    batches = classification_batches([4] * 5)
    metric = Mean(counted)
    for preds, target in batches:
        metric = step(metric, preds, target)
    assert traces == 1
    assert float(metric.compute()) == pytest.approx(true_accuracy(batches))


def test_mean_passes_only_the_arguments_fn_takes():
    seen = []
    metric = Mean(lambda target, **rest: seen.append(sorted(rest)) or target)
    metric.update(preds=jnp.zeros(2), target=jnp.ones(2), batch=None)
    assert seen == [["batch", "preds"]]
    assert float(Mean(lambda target: target).update(preds=None, target=jnp.ones(3)).compute()) == 1.0


# --- call_with_available ---------------------------------------------------------------


def accuracy(preds, labels):
    return preds == labels


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (lambda preds, target: (preds, target), (1, 2)),
        (lambda target: target, 2),
        (lambda preds, scale=10: preds * scale, 10),
        (lambda preds, *args, target: (preds, args, target), (1, (), 2)),
        (lambda preds, **kwargs: (preds, sorted(kwargs)), (1, ["batch", "target"])),
        (lambda x=5, /, **kwargs: (x, len(kwargs)), (5, 3)),
        (functools.partial(lambda k, target: k + target, 3), 5),
        (lambda: 0, 0),
    ],
)
def test_call_with_available(fn, expected):
    assert call_with_available(fn, preds=1, target=2, batch=None) == expected


@pytest.mark.parametrize(
    ("available", "match"),
    [
        (
            {"preds": 1, "target": 2, "inputs": 3, "batch": 4},
            "^accuracy\\(\\) needs argument 'labels', but only preds, target, inputs, batch are available$",
        ),
        ({}, "^accuracy\\(\\) needs arguments 'preds', 'labels', but none are available$"),
    ],
)
def test_call_with_available_missing_arguments(available, match):
    with pytest.raises(TypeError, match=match):
        call_with_available(accuracy, **available)


@pytest.mark.parametrize("fn", [lambda preds, /: preds, np.add])
def test_call_with_available_rejects_positional_only(fn):
    with pytest.raises(TypeError, match="positional-only.*wrap it"):
        call_with_available(fn, preds=1)


def test_call_with_available_rejects_an_uninspectable_callable():
    with pytest.raises(TypeError, match="signature of <built-in function max> to pass it arguments by name"):
        call_with_available(max, preds=1)


# --- clu -------------------------------------------------------------------------------


def clu_outputs(preds, target):
    # clu's own keyword names: Accuracy takes logits= and labels=.
    return {"preds": preds, "target": target, "logits": preds, "labels": target}


@clu_promotion
def test_clu_metric_update_merge_compute():
    first, second = classification_batches([4, 2]), classification_batches([5], seed=1)
    metric = as_metric(CluAccuracy)
    assert isinstance(metric, CluMetric) and metric.cls is CluAccuracy
    a, b = metric, metric
    for batch in first:
        a = a.update(**clu_outputs(*batch))
    for batch in second:
        b = b.update(**clu_outputs(*batch))
    assert float(a.merge(b).compute()) == pytest.approx(true_accuracy(first + second))
    assert int(a.reset().metric.count) == 0


@clu_promotion
def test_clu_metric_reduce_and_jit():
    parts = [classification_batches([4], seed=s) for s in range(3)]
    traces = 0

    @jax.jit
    def step(metric, preds, target):
        nonlocal traces
        traces += 1
        return metric.update(**clu_outputs(preds, target))

    metrics = [step(as_metric(CluAccuracy), *part[0]) for part in parts]
    reduced = stack(*metrics).reduce()
    assert isinstance(reduced.metric, CluAccuracy)
    assert float(reduced.compute()) == pytest.approx(true_accuracy(sum(parts, [])))
    assert traces == 1


@clu_promotion
def test_clu_collection():
    batches = classification_batches([4, 2])
    metric = as_metric(CluCollection)
    for batch in batches:
        metric = metric.update(**clu_outputs(*batch))
    assert metric.compute()["accuracy"] == pytest.approx(true_accuracy(batches))


# --- as_metric ---------------------------------------------------------------------------


def test_as_metric_dispatch():
    mean = Mean(sample_accuracy)
    assert as_metric(mean) is mean
    wrapped = as_metric(CluMetric(CluAverage.empty(), CluAverage))
    assert isinstance(wrapped, CluMetric) and wrapped.cls is CluAverage
    instance = CluAverage.from_model_output(values=jnp.arange(3.0))
    from_instance = as_metric(instance)
    assert isinstance(from_instance, CluMetric)
    assert from_instance.metric is instance and from_instance.cls is CluAverage
    from_fn = as_metric(sample_accuracy)
    assert isinstance(from_fn, Mean) and from_fn.fn is sample_accuracy


@pytest.mark.parametrize(
    ("obj", "match"),
    [
        (42, "got 42 of type int; it accepts a Metric"),
        ("accuracy", "got 'accuracy' of type str"),
        (int, "got the class int; it accepts"),
        *(
            [(jax_metrics.metrics.Accuracy, "class Accuracy \\(pass an instance, not the class\\)")]
            if jax_metrics
            else []
        ),
    ],
)
def test_as_metric_rejects(obj, match):
    with pytest.raises(TypeError, match=match):
        as_metric(obj)


@pytest.mark.parametrize(
    ("obj", "is_metric"),
    [
        (Mean(sample_accuracy), True),
        (CluMetric(CluAverage.empty(), CluAverage), True),
        (CluAverage.empty(), False),  # clu has no reset/update
        (sample_accuracy, False),
        *([(jax_metrics.metrics.Accuracy(), True)] if jax_metrics else []),
    ],
)
def test_metric_protocol(obj, is_metric):
    assert isinstance(obj, Metric) is is_metric
    if is_metric:
        assert as_metric(obj) is obj  # a Metric is used as it is, whichever library it is from


# --- clu and jax_metrics agree with Mean ---------------------------------------------------

ACCURACIES = {
    "clu": lambda: as_metric(CluAccuracy),
    **({"jax_metrics": lambda: jax_metrics.metrics.Accuracy()} if jax_metrics else {}),
}
"""Accuracy metrics of other libraries: the clu stand-in, and jax_metrics where it is installed."""


@clu_promotion
@pytest.mark.parametrize("library", list(ACCURACIES))
@pytest.mark.parametrize(
    ("fn", "sizes"),
    [(batch_accuracy, [4, 4, 4]), (sample_accuracy, [4, 4, 4]), (sample_accuracy, [4, 2, 5])],
)
def test_accuracy_of_another_library_agrees_with_mean(fn, sizes, library):
    batches = classification_batches(sizes)

    @jax.jit
    def step(metric, preds, target):
        return metric.update(**clu_outputs(preds, target), inputs=None)

    ours, theirs = Mean(fn), ACCURACIES[library]()
    assert isinstance(theirs, Metric)
    for preds, target in batches:
        ours, theirs = step(ours, preds, target), step(theirs, preds, target)
    assert float(ours.compute()) == pytest.approx(float(theirs.compute()))
    assert float(theirs.compute()) == pytest.approx(true_accuracy(batches))


if jax_metrics is not None:
    # Defined only where jax_metrics is installed, rather than skipped elsewhere.

    def test_jax_metrics_merge_and_reduce_need_the_removed_jax_tree_map():
        # jax_metrics 0.2.5 implements merge() and reduce() with `jax.tree_map`, which JAX
        # removed in 0.6: update/compute/reset work, merging or reducing raises. This test
        # fails once a release fixes it, so that the fix is noticed.
        metric = jax_metrics.metrics.Accuracy().update(preds=jnp.eye(3), target=jnp.arange(3))
        assert float(metric.compute()) == 1.0
        assert int(metric.reset().tp) == 0
        with pytest.raises(AttributeError, match="tree_map"):
            metric.merge(metric)
        with pytest.raises(AttributeError, match="tree_map"):
            stack(metric, metric).reduce()
