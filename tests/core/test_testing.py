"""`ciclo.testing`: a good adapter passes every clause; a broken one fails naming its clause."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo
import ciclo.testing
from ciclo._src.testing.kit import Kit

INPUTS = jnp.zeros((1, 4))


@dataclasses.dataclass(frozen=True, eq=False)
class Good:
    """A small MLP in plain JAX, with batch statistics and dropout, written as docs/adapter.md says."""

    hidden: int = 8
    classes: int = 3
    dropout: float = 0.3

    def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Any, Any]:
        k1, k2 = jax.random.split(key)
        features = inputs.shape[-1]
        params = {
            "w1": jax.random.normal(k1, (features, self.hidden)) / features**0.5,
            "w2": jax.random.normal(k2, (self.hidden, self.classes)) / self.hidden**0.5,
            "b2": jnp.zeros((1, self.classes)),
        }
        return params, {"mean": jnp.zeros((1, self.hidden))}

    def apply(
        self, params: Any, model_state: Any, inputs: Any, *, key: Any, training: bool
    ) -> tuple[Any, Any]:
        h = inputs @ params["w1"]
        h, model_state = self.normalise(h, model_state, training)
        h = self.drop(jax.nn.relu(h), key, training)
        return h @ params["w2"] + params["b2"], model_state

    def normalise(self, h: jax.Array, model_state: Any, training: bool) -> tuple[jax.Array, Any]:
        if training:
            mean = h.mean(0, keepdims=True)
            return h - mean, {"mean": 0.9 * model_state["mean"] + 0.1 * mean}
        return h - model_state["mean"], model_state

    def drop(self, h: jax.Array, key: Any, training: bool) -> jax.Array:
        if not training:
            return h
        keep = jax.random.bernoulli(key, 1 - self.dropout, h.shape)
        return jnp.where(keep, h / (1 - self.dropout), 0.0)

    def to_model(self, params: Any, model_state: Any) -> Any:
        return lambda inputs: self.apply(params, model_state, inputs, key=None, training=False)[0]


def test_a_good_adapter_passes_and_the_report_says_what_was_checked() -> None:
    report = ciclo.testing.check_adapter(Good(), inputs=INPUTS, uses_key=True, has_model_state=True)
    resumable = importlib.util.find_spec("orbax") is not None
    assert report.checked == tuple(
        clause
        for clause in ciclo.testing.CLAUSES
        if clause != "strategies" and (resumable or clause != "resume")
    )
    assert report.skipped["strategies"] == "only jit requested"
    assert "micro-batches differ from their join" in report.skipped["accumulation: the joined batch"]
    assert "checked: protocol, init_kinds" in str(report)


# --- broken adapters, one per clause family -----------------------------------------------------


class KeyAsRng(Good):
    def apply(self, params: Any, model_state: Any, inputs: Any, rng: Any, training: bool) -> Any:  # type: ignore[override]
        return super().apply(params, model_state, inputs, key=rng, training=training)


class Unhashable(Good):
    __hash__ = None  # type: ignore[assignment]  # as a dataclass with eq=True and frozen=False has


class NotAPair(Good):
    def init(self, key: jax.Array, inputs: jax.Array) -> Any:
        return super().init(key, inputs)[0]


class PythonScalarParam(Good):
    def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Any, Any]:
        params, model_state = super().init(key, inputs)
        return {**params, "temperature": 1.0}, model_state


class IntegerParam(Good):
    def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Any, Any]:
        params, model_state = super().init(key, inputs)
        return {**params, "count": jnp.zeros((), jnp.int32)}, model_state


class DropoutInEvaluation(Good):
    def drop(self, h: jax.Array, key: Any, training: bool) -> jax.Array:
        return super().drop(h, key, True)


class StatisticsUpdatedInEvaluation(Good):
    def normalise(self, h: jax.Array, model_state: Any, training: bool) -> tuple[jax.Array, Any]:
        return super().normalise(h, model_state, True)


class FixedDropoutKey(Good):
    def drop(self, h: jax.Array, key: Any, training: bool) -> jax.Array:
        return super().drop(h, jax.random.key(0), training)


class StatisticsNeverUpdated(Good):
    def normalise(self, h: jax.Array, model_state: Any, training: bool) -> tuple[jax.Array, Any]:
        return super().normalise(h, model_state, False)


class StatisticsChangeDtype(Good):
    def normalise(self, h: jax.Array, model_state: Any, training: bool) -> tuple[jax.Array, Any]:
        h, new = super().normalise(h, model_state, training)
        return h, {"mean": new["mean"].astype(jnp.bfloat16)} if training else new


class WeaklyTypedStatistics(Good):
    def normalise(self, h: jax.Array, model_state: Any, training: bool) -> tuple[jax.Array, Any]:
        h, new = super().normalise(h, model_state, training)
        return h, {"mean": jnp.full((1, self.hidden), 0.5)} if training else new


class HostRoundingWhenEager(Good):
    """Takes a numpy shortcut on concrete statistics, a path jit never runs: eager trains otherwise."""

    def normalise(self, h: jax.Array, model_state: Any, training: bool) -> tuple[jax.Array, Any]:
        if not isinstance(model_state["mean"], jax.core.Tracer):
            h = h - jnp.asarray(np.asarray(model_state["mean"]).astype(np.float16), jnp.float32) + 0.01
        return super().normalise(h, model_state, training)


class PredictionsOnly(Good):
    def apply(self, params: Any, model_state: Any, inputs: Any, *, key: Any, training: bool) -> Any:  # type: ignore[override]
        return super().apply(params, model_state, inputs, key=key, training=training)[0]


_calls = iter(range(10**6))


class CountingInit(Good):
    """Ignores its key for a global counter: each call draws other params."""

    def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Any, Any]:
        return super().init(jax.random.key(next(_calls)), inputs)


class UnseededNumpyInit(Good):
    def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Any, Any]:
        params, model_state = super().init(key, inputs)
        w1 = np.random.normal(size=params["w1"].shape)  # noqa: NPY002 - unseeded on purpose
        return {**params, "w1": jnp.asarray(w1, jnp.float32)}, model_state


class FixedKeyInit(Good):
    def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Any, Any]:
        return super().init(jax.random.key(0), inputs)


class ToModelInTraining(Good):
    def to_model(self, params: Any, model_state: Any) -> Any:
        return lambda inputs: self.apply(params, model_state, inputs, key=jax.random.key(0), training=True)[0]


@pytest.mark.parametrize(
    ("adapter", "options", "clause", "seen"),
    [
        (KeyAsRng(), {}, "protocol", "cannot be called as ciclo calls it"),
        (Unhashable(), {}, "protocol", "Unhashable is not hashable"),
        (PredictionsOnly(), {}, "protocol", "apply returned Array("),
        (NotAPair(), {}, "init_kinds", "not a pair"),
        (CountingInit(), {}, "init_key", "init gave other params for the same key"),
        (UnseededNumpyInit(), {}, "init_key", "init gave other params for the same key"),
        (FixedKeyInit(), {}, "init_key", "init gave the same params for two keys"),
        (PythonScalarParam(), {}, "init_kinds", "[('temperature', '1.0')]"),
        (IntegerParam(), {}, "init_kinds", "not floating point"),
        (DropoutInEvaluation(), {}, "deterministic_evaluation", "for two keys"),
        (
            StatisticsUpdatedInEvaluation(),
            {},
            "deterministic_evaluation",
            "model_state whose statistics differ",
        ),
        (FixedDropoutKey(), {"uses_key": True}, "key_use", "same outputs for two keys"),
        (StatisticsNeverUpdated(), {}, "model_state_updates", "unchanged"),
        (StatisticsChangeDtype(), {}, "model_state_updates", "structure, shape or dtype"),
        (WeaklyTypedStatistics(), {}, "compiles_once", "traced 1 more time(s) after the first step"),
        (ToModelInTraining(), {}, "to_model", "away from predict_step's, of shape (16, 3)"),
        (
            HostRoundingWhenEager(),
            {"strategies": ("jit", "eager")},
            "strategies",
            "under 'eager' the model_state",
        ),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Good) else None,
)
def test_a_broken_adapter_fails_naming_the_clause(
    adapter: Good, options: dict[str, Any], clause: str, seen: str
) -> None:
    with pytest.raises(AssertionError, match=rf"^ciclo.testing clause '{clause}' failed: .* Fix: ") as caught:
        ciclo.testing.check_adapter(adapter, inputs=INPUTS, **options)
    assert seen in str(caught.value)
    assert len(str(caught.value)) < 600


def test_an_init_that_ignores_its_key_is_named_by_the_strategies_clause() -> None:
    # On several devices the sharded state draws its own params: the fix names init, not apply.
    kit = Kit(CountingInit(), inputs=INPUTS, strategies=("jit", "eager"))
    with pytest.raises(AssertionError, match=r"clause 'strategies' failed: .*before any step.* Fix: .*init"):
        kit.run("strategies")


def test_init_key_is_skipped_for_a_model_with_no_random_leaves() -> None:
    class ZerosInit(Good):
        def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Any, Any]:
            params, model_state = super().init(key, inputs)
            return jax.tree.map(jnp.zeros_like, params), model_state

    assert "no random leaves" in (Kit(ZerosInit(), inputs=INPUTS).run("init_key") or "")


def test_the_resume_clause_is_quiet(capfd: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("orbax.checkpoint")
    assert Kit(Good(), inputs=INPUTS).run("resume") is None
    assert "resumed" not in capfd.readouterr().err


def test_key_use_is_skipped_unless_the_author_says_the_model_has_dropout() -> None:
    # Only the author knows whether the model has dropout: without uses_key=True the clause is skipped.
    with pytest.raises(AssertionError, match="clause 'key_use'"):
        ciclo.testing.check_adapter(FixedDropoutKey(), inputs=INPUTS, uses_key=True)
    kit = Kit(FixedDropoutKey(), inputs=INPUTS)
    assert (
        kit.run("key_use")
        == "training gives the same outputs whatever the key (no dropout): key use not checked"
    )


def test_bad_arguments_are_refused_before_any_clause() -> None:
    with pytest.raises(ValueError, match="unknown strategies \\['jitt'\\]"):
        ciclo.testing.check_adapter(Good(), inputs=INPUTS, strategies=("jitt",))
    with pytest.raises(TypeError, match="one floating-point array"):
        ciclo.testing.check_adapter(Good(), inputs=[[0.0, 0.0]])
    # A name is spelt as get_strategy takes it.
    assert Kit(Good(), inputs=INPUTS, strategies=("jit", "data-parallel")).requested == (
        "jit",
        "data_parallel",
    )
    with pytest.raises(TypeError, match="unknown option\\(s\\) \\['use_key'\\]; check_adapter takes"):
        ciclo.testing.check_adapter(Good(), inputs=INPUTS, use_key=True)


# --- the pytest form ----------------------------------------------------------------------------


class TestGoodThroughAdapterTests(ciclo.testing.AdapterTests):
    """What an adapter package's own test suite writes: one test per clause, states shared.

    The adapter is check_adapter's above (programs alike: read back from JAX's compilation cache).
    """

    inputs = INPUTS
    uses_key = True

    def make_adapter(self) -> Good:
        return Good()


def test_adapter_tests_has_one_test_per_clause() -> None:
    tests = sorted(name for name in vars(ciclo.testing.AdapterTests) if name.startswith("test_"))
    assert tests == sorted(f"test_{clause}" for clause in ciclo.testing.CLAUSES)


def test_adapter_tests_without_pytest_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pytest", None)
    monkeypatch.delitem(sys.modules, "ciclo._src.testing.pytest_class")
    with pytest.raises(ImportError, match=r'pip install "ciclo-core\[testing\]"'):
        ciclo.testing.AdapterTests  # noqa: B018
