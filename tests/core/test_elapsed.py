import datetime

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo


def test_elapsed_is_a_pytree_usable_under_jit():
    elapsed = ciclo.types.Elapsed.create(steps=3, samples=12)

    @jax.jit
    def f(e: ciclo.types.Elapsed) -> jax.Array:
        return e.steps * 10 + e.samples

    assert int(f(elapsed)) == 42
    leaves, treedef = jax.tree.flatten(elapsed)
    assert jax.tree.unflatten(treedef, leaves) == elapsed


@pytest.mark.parametrize(
    ("period", "elapsed", "reached"),
    [
        (ciclo.at(10), ciclo.types.Elapsed(9, 0, 0.0, 0.0), False),
        (ciclo.at(10), ciclo.types.Elapsed(10, 0, 0.0, 0.0), True),
        (ciclo.at(samples=100), ciclo.types.Elapsed(1, 99, 0.0, 0.0), False),
        (ciclo.at(samples=100), ciclo.types.Elapsed(1, 128, 0.0, 0.0), True),
        (ciclo.at(time=1.5), ciclo.types.Elapsed(0, 0, 1.4, 0.0), False),
        (ciclo.at(time=datetime.timedelta(seconds=1)), ciclo.types.Elapsed(0, 0, 1.0, 0.0), True),
        (ciclo.at(steps=100, samples=10), ciclo.types.Elapsed(1, 10, 0.0, 0.0), True),  # any field
        (ciclo.at(date=1000.0), ciclo.types.Elapsed(0, 0, 1.0, 999.5), True),
    ],
)
def test_period_comparisons(period, elapsed, reached):
    assert (elapsed >= period) is reached
    assert (elapsed < period) is (not reached)


def test_period_strict_comparisons():
    elapsed = ciclo.types.Elapsed(10, 0, 0.0, 0.0)
    assert not elapsed > ciclo.at(10)
    assert elapsed <= ciclo.at(10)
    assert elapsed > ciclo.at(9)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, ValueError, "at least one"),
        ({"steps": -1}, ValueError, "-1"),
        ({"steps": 1.5}, TypeError, "1.5"),
        ({"samples": -3}, ValueError, "-3"),
        ({"time": -2.0}, ValueError, "-2.0"),
        ({"time": "soon"}, TypeError, "soon"),
    ],
)
def test_period_rejects_bad_values(kwargs, error, match):
    with pytest.raises(error, match=match):
        ciclo.types.Period(**kwargs)


def test_period_create_is_at():
    assert ciclo.types.Period.create(5) == ciclo.at(5)
    assert ciclo.at(date=datetime.datetime.fromtimestamp(100.0)).date == 100.0


def test_elapse_counts_steps_and_samples(batches):
    seen = [(e.steps, e.samples) for e, _ in ciclo.elapse(batches[:3])]
    assert seen == [(0, 0), (1, 4), (2, 8)]


def test_elapse_stops_without_reading_past_the_stop(batches):
    iterator = iter(batches)
    out = list(ciclo.elapse(iterator, stop=ciclo.at(samples=8)))
    assert len(out) == 2
    assert next(iterator) is batches[2]  # the third batch was not consumed


def test_elapse_resumes_from_initial(batches):
    first = list(ciclo.elapse(batches, stop=3))
    last_elapsed = first[-1][0]
    resumed = ciclo.types.Elapsed(last_elapsed.steps + 1, last_elapsed.samples + 4, last_elapsed.time, 0.0)
    steps = [e.steps for e, _ in ciclo.elapse(batches, initial=resumed, stop=5)]
    assert steps == [3, 4]


def test_elapse_custom_batch_size_fn(batches):
    samples = [e.samples for e, _ in ciclo.elapse(batches[:3], batch_size_fn=lambda b: 10)]
    assert samples == [0, 10, 20]


def test_elapse_counts_one_sample_for_scalar_batches():
    assert [e.samples for e, _ in ciclo.elapse([1, 2, 3])] == [0, 1, 2]


def test_elapse_time_increases(batches):
    times = [e.time for e, _ in ciclo.elapse(batches[:5])]
    assert times == sorted(times)
    assert times[0] >= 0


def test_elapse_rejects_negative_stop():
    with pytest.raises(ValueError, match="-1"):
        list(ciclo.elapse([1], stop=-1))


def test_elapse_with_jax_arrays_counts_leading_dim():
    data = [{"x": jnp.zeros((7, 2))}] * 2
    assert [e.samples for e, _ in ciclo.elapse(data)] == [0, 7]


def test_elapsed_subtraction_and_dict():
    a = ciclo.types.Elapsed(10, 40, 2.0, 5.0)
    b = ciclo.types.Elapsed(4, 16, 0.5, 5.0)
    diff = a - b
    assert (diff.steps, diff.samples, diff.time) == (6, 24, 1.5)
    assert a.to_dict() == {"steps": 10, "samples": 40, "time": 2.0}
    assert a.date == 7.0


def test_elapsed_compare_with_non_period_fails():
    with pytest.raises(TypeError, match="Period"):
        _ = ciclo.types.Elapsed.create() >= 3  # type: ignore[operator]


def test_elapsed_create_validates():
    with pytest.raises(ValueError, match="-2"):
        ciclo.types.Elapsed.create(steps=-2)
    assert np.isclose(ciclo.types.Elapsed.create().time, 0.0)
