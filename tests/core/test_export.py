"""`ciclo.export` and `ciclo.load_exported` with a framework-free adapter (flax: tests/adapters/flax)."""

from __future__ import annotations

import os
import pickle
import re
import sys
import threading
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support.optional import optional

import ciclo
from ciclo import managed

needs_flatbuffers = pytest.mark.skipif(
    optional("flatbuffers") is None, reason="jax.export serializes with flatbuffers (the export extra)"
)


class TwoLayers:
    """A tanh layer and a linear one, with a model state that training counts up (prediction leaves it)."""

    def init(self, key: jax.Array, inputs: jax.Array) -> tuple[Any, Any]:
        first, second = jax.random.split(key)
        params = {
            "w1": jax.random.normal(first, (inputs.shape[-1], 4)),
            "w2": jax.random.normal(second, (4, 2)),
        }
        return params, jnp.zeros(())

    def apply(self, params, model_state, inputs, *, key, training):
        preds = jnp.tanh(inputs @ params["w1"]) @ params["w2"] + model_state.astype(inputs.dtype)
        return preds, model_state + 1.0 if training else model_state


def _trained(**options: Any) -> ciclo.types.ModelState:
    state = ciclo.create_model_state(
        TwoLayers(),
        inputs=jnp.zeros((1, 3)),
        tx=optax.sgd(0.1),
        losses={"mse": lambda preds, target: (preds - target) ** 2},
        **options,
    )
    rng = np.random.default_rng(0)
    for _ in range(3):
        _, state = state.train_step((rng.normal(size=(4, 3)).astype(np.float32), np.ones((4, 2), np.float32)))
    return state


def _predicted(state: ciclo.types.ModelState, x: np.ndarray) -> np.ndarray:
    logs, _ = state.predict_step(x)
    return np.asarray(logs.outputs["preds"])


@needs_flatbuffers
@pytest.mark.parametrize("precision", ["32", "bf16-mixed"])
def test_the_file_predicts_what_predict_step_does_for_any_batch_size(
    strategy: str, precision: str, tmp_path: Path
) -> None:
    # Eager rounds each operation to bfloat16, a compiled program not always: there they agree to bfloat16's
    # rounding (8 bits of mantissa), elsewhere to float32's.
    tolerance = 2**-7 if strategy == "eager" and precision != "32" else 1e-6
    state = _trained(strategy=strategy, precision=precision)
    path = tmp_path / "serving" / "model.jax"  # its folder is created
    exported = ciclo.export(state, np.zeros((5, 3), np.float32), path)
    assert str(exported.in_avals) == "(ShapedArray(float32[batch,3]),)"
    predict = ciclo.load_exported(path)
    for batch in (1, 7):
        x = np.random.default_rng(batch).normal(size=(batch, 3)).astype(np.float32)
        served, expected = np.asarray(predict(x)), _predicted(state, x)
        np.testing.assert_allclose(served, expected, rtol=tolerance, atol=tolerance)


@needs_flatbuffers
def test_use_ema_exports_the_ema_weights(tmp_path: Path) -> None:
    state = _trained(ema_decay=0.5)
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    ciclo.export(state, x, tmp_path / "ema.jax", use_ema=True)
    ciclo.export(state, x, tmp_path / "params.jax")
    ema = np.asarray(ciclo.load_exported(tmp_path / "ema.jax")(x))
    np.testing.assert_allclose(ema, _predicted(state.with_ema_params(), x), rtol=1e-6, atol=1e-6)
    assert not np.allclose(ema, np.asarray(ciclo.load_exported(tmp_path / "params.jax")(x)))
    with pytest.raises(ValueError, match=r"use_ema=True\): this state keeps no EMA .*ema_decay="):
        ciclo.export(_trained(), x, tmp_path / "none.jax", use_ema=True)


@needs_flatbuffers
def test_fixed_shapes_without_batch_polymorphism(tmp_path: Path) -> None:
    state = _trained()
    exported = ciclo.export(
        state, jax.ShapeDtypeStruct((2, 3), jnp.float32), tmp_path / "m.jax", batch_polymorphic=False
    )
    assert str(exported.in_avals) == "(ShapedArray(float32[2,3]),)"
    predict = ciclo.load_exported(tmp_path / "m.jax")
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(np.asarray(predict(x)), _predicted(state, x), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="shape"):
        predict(np.ones((3, 3), np.float32))


class Untraceable:
    """An adapter whose apply reads its inputs' values in Python: jax.jit cannot trace it."""

    def init(self, key, inputs):
        return jnp.ones(()), None

    def apply(self, params, model_state, inputs, *, key, training):
        return inputs * float(inputs.sum()), model_state


@needs_flatbuffers
def test_what_cannot_be_exported_is_refused_with_the_fix(tmp_path: Path) -> None:
    managed_state = managed.ManagedState.create(params=jnp.ones(()), tx=optax.sgd(0.1))
    with pytest.raises(
        TypeError, match=r"takes a ciclo.types.ModelState .* got ManagedState: .*jax.export.export"
    ):
        ciclo.export(managed_state, jnp.ones((1, 3)), tmp_path / "m.jax")
    state = _trained()
    with pytest.raises(ValueError, match=r"hold a scalar \(.*\): give inputs with a batch axis"):
        ciclo.export(state, {"x": jnp.ones(())}, tmp_path / "m.jax")
    with pytest.raises(TypeError, match="batch_polymorphic must be True or False, got 'yes'"):
        ciclo.export(state, jnp.ones((1, 3)), tmp_path / "m.jax", batch_polymorphic="yes")
    with pytest.raises(TypeError, match="use_ema must be True or False, got 1"):
        ciclo.export(state, jnp.ones((1, 3)), tmp_path / "m.jax", use_ema=1)
    untraceable = ciclo.create_model_state(Untraceable(), inputs=jnp.ones((1, 3)), tx=optax.sgd(0.1))
    with pytest.raises(
        ValueError, match=r"could not export .*Concretization.*batch_polymorphic=False.*traceable"
    ):
        ciclo.export(untraceable, jnp.ones((1, 3)), tmp_path / "m.jax")
    assert not (tmp_path / "m.jax").exists()


def test_without_flatbuffers_the_extra_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "flatbuffers", None)  # import flatbuffers raises ImportError
    with pytest.raises(ImportError, match=r'pip install "ciclo-core\[export\]"'):
        ciclo.export(_trained(), jnp.ones((1, 3)), tmp_path / "m.jax")
    with pytest.raises(ImportError, match=r'pip install "ciclo-core\[export\]"'):
        ciclo.load_exported(tmp_path / "m.jax")


@needs_flatbuffers
def test_a_file_that_is_not_a_ciclo_export_or_is_damaged_is_refused_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "m.jax"
    ciclo.export(_trained(), np.zeros((2, 3), np.float32), path)
    data = path.read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    files = {
        "empty": b"",
        "truncated": data[: len(data) // 2],
        "json": b'{"params": [1, 2, 3]}',
        "pickle": pickle.dumps({"params": [1.0, 2.0]}),
        "flipped": bytes(flipped),
    }
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / name))} is not a ciclo export"):
            ciclo.load_exported(tmp_path / name)
    # jax alone still reads what ciclo.export wrote.
    x = np.ones((4, 3), np.float32)
    np.testing.assert_array_equal(
        jax.export.deserialize(bytearray(data)).call(x), ciclo.load_exported(path)(x)
    )


@needs_flatbuffers
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are a POSIX feature")
def test_a_fifo_is_refused_without_being_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.jax"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []
    worker = threading.Thread(target=lambda: outcome.extend(_raised(ciclo.load_exported, fifo)), daemon=True)
    worker.start()
    worker.join(30)
    if worker.is_alive():  # release the reader that blocks in open()
        with open(fifo, "wb"):
            pass
        pytest.fail("load_exported blocked on a FIFO")
    assert isinstance(outcome[0], ValueError)
    assert str(outcome[0]).startswith(f"{fifo} is not a ciclo export: it is not a regular file")
    with pytest.raises(ValueError, match="is not a ciclo export: it is not a regular file"):
        ciclo.load_exported(tmp_path)


def _raised(fn: Any, *args: Any) -> list[BaseException]:
    try:
        fn(*args)
    except BaseException as error:  # noqa: BLE001 - handed to the test's thread
        return [error]
    return []
