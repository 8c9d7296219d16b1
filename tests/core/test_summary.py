"""ciclo.summary: parameters and bytes per top-level module, optimizer state, totals."""

from __future__ import annotations

import io
from typing import Any

import jax
import jax.numpy as jnp
import optax
import pytest
from support import summary, training

import ciclo
from ciclo import managed


def test_a_managed_state_by_top_level_key(capsys: pytest.CaptureFixture[str]) -> None:
    params = {
        "encoder": {"w": jnp.zeros((5, 7)), "b": jnp.zeros(7)},
        "head": {"w": jnp.zeros((7, 2), jnp.bfloat16)},
        "scale": jnp.ones(()),
    }
    state = managed.ManagedState.create(params=params, tx=optax.adam(1e-3))
    text = ciclo.summary(state)

    assert capsys.readouterr().out == text + "\n"
    rows = summary.parse(text)
    assert list(rows) == ["encoder", "head", "scale", "params", "optimizer state", "other", "total"]
    assert rows["encoder"] == summary.count(params["encoder"]) == (42, 168)
    assert rows["head"] == (14, 28)  # bfloat16: two bytes each
    assert rows["params"] == summary.count(params) == (57, 200)
    assert rows["optimizer state"] == (None, summary.count(state.opt_state)[1])
    assert rows["other"] == (None, 4)  # the int32 step counter
    assert rows["total"] == (57, summary.count(state)[1])
    assert "KiB" not in text and "200 B" in text


def test_same_numbers_under_every_strategy(strategy: str) -> None:
    # Under pmap the arrays carry a device axis, and under fsdp they are sharded: neither counts.
    state = training.managed_state("mlp", strategy)
    rows = summary.parse(ciclo.summary(state, file=io.StringIO()))
    host = state.with_strategy("eager")
    assert rows == summary.parse(ciclo.summary(host, file=io.StringIO()))
    assert [name for name in rows][:3] == ["0", "1", "2"]  # list indices name the layers
    assert rows["params"] == summary.count(host.params)


def test_a_model_state_counts_its_model_state() -> None:
    class Normalised:
        def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Any, Any]:
            return {"dense": jnp.zeros((inputs.shape[-1], 3)), "norm": jnp.ones(3)}, {"mean": jnp.zeros(3)}

        def apply(self, params: Any, model_state: Any, inputs: Any, *, key: Any, training: bool) -> Any:
            return inputs @ params["dense"] * params["norm"], model_state

    state = ciclo.create_model_state(
        Normalised(),
        inputs=jnp.ones((1, 4)),
        tx=optax.sgd(0.1, momentum=0.9),
        metrics={"m": lambda preds: preds},
    )
    rows = summary.parse(ciclo.summary(state, file=io.StringIO()))
    assert rows == summary.expected_rows(state, state.params)
    assert rows["model state"] == (None, 12) and rows["optimizer state"] == (None, 60)


def test_a_state_for_inference_says_it_has_no_optimizer() -> None:
    class Dense:
        def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Any, Any]:
            return {"dense": jnp.zeros((inputs.shape[-1], 3))}, None

        def apply(self, params: Any, model_state: Any, inputs: Any, *, key: Any, training: bool) -> Any:
            return inputs @ params["dense"], model_state

    state = ciclo.create_model_state(Dense(), inputs=jnp.ones((1, 4)))  # no tx: for inference
    text = ciclo.summary(state, file=io.StringIO())
    rows = summary.parse(text)
    assert list(rows) == ["dense", "params", "no optimizer (no tx)", "other", "total"]
    assert rows["no optimizer (no tx)"] == (None, None) and " 0 B" not in text
    assert rows["total"] == (12, summary.count(state)[1])
    assert rows["other"] == (None, summary.count(state)[1] - 48)  # the step and the key


def test_any_pytree_is_summarised_as_parameters() -> None:
    out = io.StringIO()
    text = ciclo.summary({"a": jnp.zeros((1000, 1100)), "b": [jnp.zeros(3, jnp.int8)]}, file=out)
    assert out.getvalue() == text + "\n"
    assert summary.parse(text) == {"a": (1_100_000, 4_400_000), "b": (3, 3), "total": (1_100_003, 4_400_003)}
    assert "1,100,003" in text and "4.2 MiB" in text
    one_array = summary.parse(ciclo.summary(jnp.zeros(3), file=io.StringIO()))
    assert one_array == {"(params)": (3, 12), "total": (3, 12)}
