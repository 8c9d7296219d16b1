"""The data a backup stores besides the state: encoded as plain JSON, read back without running code."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo
from ciclo._src.resume.host_json import from_json, to_json


def round_trip(value):
    return from_json(json.loads(json.dumps(to_json(value, "value"))), "value")


def test_values_come_back_with_their_types_and_dtypes():
    value = {
        "ints": [1, -2, True, None, "text"],
        "floats": (0.5, math.inf, -math.inf),
        "numpy": [np.float32(0.25), np.int64(7), np.arange(6, dtype=np.int16).reshape(2, 3)],
        "bf16": jnp.ones((2,), jnp.bfloat16),
        "bytes": b"\x00\xff",
        (1, ("a",)): "a tuple key",
        "$not_a_tag": 1,
    }
    back = round_trip(value)
    assert back["ints"] == [1, -2, True, None, "text"]
    assert back["floats"] == (0.5, math.inf, -math.inf)
    assert type(back["numpy"][0]) is np.float32 and back["numpy"][0] == np.float32(0.25)
    assert type(back["numpy"][1]) is np.int64
    np.testing.assert_array_equal(back["numpy"][2], value["numpy"][2])
    assert back["numpy"][2].dtype == np.int16
    assert back["bf16"].dtype == jnp.bfloat16
    assert back["bytes"] == b"\x00\xff"
    assert back[(1, ("a",))] == "a tuple key" and back["$not_a_tag"] == 1
    assert math.isnan(round_trip(math.nan))


def test_a_typed_key_comes_back_as_a_key_of_its_implementation():
    key = jax.random.key(3)
    back = round_trip(key)
    assert jnp.issubdtype(back.dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(back), jax.random.key_data(key))


def test_an_object_is_refused_where_it_is_encoded():
    with pytest.raises(
        TypeError, match=r"value\['best'\]\[0\] is of type object, which a backup cannot hold"
    ):
        to_json({"best": [object()]}, "value")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"$code": "print(1)"}, r"unknown fields \['\$code'\]"),
        ({"$float": "1e999"}, r"not nan, inf or -inf"),
        ({"$array": {"dtype": "object", "shape": [], "scalar": True, "data": ""}}, r"dtype object"),
        ({"$array": {"dtype": "float32", "shape": [3], "scalar": False, "data": "AAAA"}}, r"holds 3 bytes"),
        (
            {"$array": {"dtype": "float32", "shape": [-1], "scalar": False, "data": ""}},
            r"not a list of sizes",
        ),
        ({"$state": "0"}, r"kept state '0' that the backup does not hold"),
        ({"$bytes": "not base64!"}, r"not base64"),
    ],
)
def test_data_it_did_not_write_is_refused_with_where_it_is(data, message):
    with pytest.raises(ValueError, match=r"the file\['field'\]\[0\] .*" + message):
        from_json({"field": [data]}, "the file")


class Unsaveable:
    def __call__(self, state):
        return None, state

    def state_dict(self):
        return {"handle": object()}

    def load_state_dict(self, state):
        pass


def test_a_callback_state_that_is_not_data_is_refused_before_the_first_step(tmp_path):
    steps = []

    def step(state, batch):
        steps.append(batch)
        return None, state

    with pytest.raises(TypeError, match=r"the state of callback Unsaveable\['handle'\] is of type object"):
        ciclo.loop(0, range(3), {ciclo.every(1): [step, Unsaveable()]}, backup=tmp_path)
    assert steps == []


HUGE = "x" * 1_000_000  # a crafted field of a backup's document


def nested(depth):
    data = {"$float": "1e999"}
    for _ in range(depth):
        data = {HUGE[: 10_000 + depth]: data}
    return data


def early_stopping_snapshot(**changes):
    return {**ciclo.early_stopping("loss").state_dict(), **changes}


@pytest.mark.parametrize(
    ("load", "message"),
    [
        (lambda: from_json({"$" + HUGE: 1}, "doc"), r"unknown fields"),
        (
            lambda: from_json({"$key": {"impl": HUGE, "data": to_json(np.zeros(2, np.uint32), "d")}}, "doc"),
            r"\$key of impl 'xxx.*', which JAX does not know",
        ),
        (
            lambda: from_json(
                {"$array": {"dtype": "float32", "shape": [1] * 100_000, "scalar": False, "data": ""}}, "doc"
            ),
            r"holds 0 bytes, not those of a float32 array of shape \(1, 1, ",
        ),
        (
            lambda: from_json(
                {"$array": {"dtype": {"names": [HUGE]}, "shape": [], "scalar": True, "data": ""}}, "doc"
            ),
            r"dtype",
        ),
        (lambda: from_json(nested(40), "doc"), r"doc\['xxx.*not nan, inf or -inf"),
        (
            lambda: ciclo.early_stopping("loss").load_state_dict(early_stopping_snapshot(**{HUGE: 1})),
            r"unknown: \['xxx",
        ),
        (
            lambda: ciclo.early_stopping("loss").load_state_dict(early_stopping_snapshot(best=HUGE)),
            r"'xxx.*where a number belongs",
        ),
    ],
)
def test_a_crafted_huge_value_is_echoed_bounded(load, message):
    with pytest.raises((ValueError, TypeError), match=message) as info:
        load()
    assert len(str(info.value)) < 1_000
