import numpy as np
import pytest

import ciclo


def eval_loop(values):
    def step(state, batch):
        return ciclo.logs().add_metric("m", batch).add_loss("l", -batch).add_output("o", np.full(2, batch))

    return lambda state: ciclo.loop(state + 1, values, {ciclo.every(1): [step]})


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [("last", 3.0), ("first", 1.0), ("mean", 2.0), ("sum", 6.0), ("min", 1.0), ("max", 3.0), (len, 3)],
)
def test_aggregations(aggregation, expected):
    logs, state = ciclo.inner_loop("test", eval_loop([1.0, 2.0, 3.0]), aggregation=aggregation)(0)
    assert logs["metrics"]["m_test"] == expected
    assert state == 0


def test_per_collection_aggregation_and_arrays():
    inner = ciclo.inner_loop(eval_loop([1.0, 3.0]), aggregation={"metrics": "mean", "outputs": "sum"})
    logs, _ = inner(0)
    assert logs["metrics"]["m"] == 2.0
    assert logs["losses"]["l"] == -2.0  # not in the dict: a per-batch loss, so its mean
    np.testing.assert_array_equal(logs["outputs"]["o"], [4.0, 4.0])


def test_output_state_and_loop_callback():
    inner = ciclo.inner_loop("t", eval_loop([1.0]), output_state=True)
    _, state = inner(10)
    assert state == 11
    state, history, _ = ciclo.loop(0, range(2), {ciclo.every(1): [inner]})
    assert state == 2
    assert history.collect("m_t") == [1.0, 1.0]


def test_empty_inner_history():
    with pytest.warns(ciclo.types.DataWarning, match="yielded no batch"):  # an empty dataset is warned about
        logs, _ = ciclo.inner_loop("t", eval_loop([]))(0)
    assert logs == {}


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (("name",), {}, TypeError, "also needs the loop function"),
        ((lambda s: s, lambda s: s), {}, TypeError, "not two loop functions"),
        (("name", 3), {}, TypeError, "inner_loop needs a function"),
        (("name", lambda s: s), {"aggregation": "median"}, ValueError, "'median'"),
        (
            ("name", lambda s: s),
            {"aggregation": {"metrics": "avg"}},
            ValueError,
            "aggregation\\['metrics'\\]",
        ),
    ],
)
def test_bad_arguments(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        ciclo.inner_loop(*args, **kwargs)
