"""ciclo.preflight: a train step compiled ahead of time; train_loop(preflight=, device_memory=)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
import pytest
from support import training

import ciclo
from ciclo import managed


def test_the_report_reads_xla_memory_and_cost_analysis() -> None:
    state, batch = training.mlp_state("jit"), training.batches(1)[0]
    report = ciclo.preflight(state, batch)  # the state's own train_step

    assert report.step == "ModelState.train_step"
    stats = type(state).train_step.lower(state, batch).compile().memory_analysis()
    assert report.memory == {
        "arguments": stats.argument_size_in_bytes,
        "outputs": stats.output_size_in_bytes,
        "temporaries": stats.temp_size_in_bytes,
        "generated code": stats.generated_code_size_in_bytes,
        "aliased": stats.alias_size_in_bytes,
    }
    state_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(state))
    assert report.memory["arguments"] >= state_bytes  # the state and the batch come in
    assert report.total_bytes == sum(report.memory.values()) - 2 * report.memory["aliased"]
    # The middle layer alone: 2 * rows * 64 * 64 multiply-adds forward.
    assert report.flops is not None and report.flops > 2 * training.BATCH * 64 * 64
    assert report.largest[0] == ("params/1/w", "single device", 64 * 64 * 4)
    assert len(report.largest) == 5
    text = str(report)
    assert text.startswith("preflight of ModelState.train_step, per device:")
    assert "  arguments " in text and "  total " in text and "params/1/w" in text


def test_a_step_given_by_hand_and_what_cannot_be_preflighted() -> None:
    @managed.train_step
    def train_step(state: Any, batch: Any) -> Any:
        return ciclo.logs().add_loss("mse", jnp.mean((batch @ state.params) ** 2)), state

    state = managed.ManagedState.create(params=jnp.ones((8, 4)), tx=optax.sgd(0.1))
    report = ciclo.preflight(state, jnp.ones((16, 8)), step=train_step)
    assert report.step == "managed.train_step(train_step)"
    assert report.largest == (("params", "single device", 128), ("step", "single device", 4))

    with pytest.raises(TypeError, match=r"ManagedState's train_step is None: pass step="):
        ciclo.preflight(state, jnp.ones((16, 8)))  # a ManagedState has no step of its own
    with pytest.raises(TypeError, match="@managed.train_step"):
        ciclo.preflight(state, jnp.ones((16, 8)), step=lambda state, batch: None)  # type: ignore[arg-type]
    pmapped = training.mlp_state("pmap")
    with pytest.raises(ValueError, match="one program per device"):
        ciclo.preflight(pmapped, training.batches(1)[0])


def test_a_backend_without_memory_analysis_is_said_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jax.stages.Compiled, "memory_analysis", lambda self: None)
    state, data = training.mlp_state("jit"), training.batches(2)
    report = ciclo.preflight(state, data[0])
    assert report.memory is None and report.total_bytes is None
    assert "memory: not known, the cpu backend reports no analysis" in str(report)
    with pytest.warns(UserWarning, match="device_memory= is not checked: cpu reports no memory analysis"):
        state, history, _ = ciclo.train_loop(state, data, device_memory=1)
    assert int(state.step) == 2


def test_train_loop_prints_the_report_before_step_0(capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[str] = []

    def on_train_step(state: Any) -> None:
        seen.append(capsys.readouterr().out)

    state, history, _ = ciclo.train_loop(
        training.mlp_state("jit"), training.batches(3), {ciclo.on_train_step: on_train_step}, preflight=True
    )
    assert int(state.step) == 3
    assert seen[0].startswith("preflight of ModelState.train_step, per device:")
    assert seen[1:] == ["", ""]  # once


def test_device_memory_below_the_estimate_stops_before_step_0() -> None:
    state, data = training.mlp_state("jit"), training.batches(3)
    estimate = ciclo.preflight(state, data[0]).total_bytes
    assert estimate is not None
    steps: list[int] = []
    with pytest.raises(ValueError) as raised:
        ciclo.train_loop(
            state,
            data,
            {ciclo.on_train_batch_begin: lambda state: steps.append(int(state.step))},
            device_memory=estimate - 1,
        )
    assert steps == []  # no step began
    message = str(raised.value)
    assert len(message) < 2000
    assert f"({estimate:,} bytes), more than device_memory={estimate - 1:,}" in message
    assert "params/1/w 16.0 KiB (single device)" in message and 'strategy="fsdp"' in message
    trained, history, _ = ciclo.train_loop(state, data, device_memory=estimate)
    assert int(trained.step) == 3 and len(history) == 3


def test_train_loop_checks_the_preflight_arguments() -> None:
    state, data = training.mlp_state("jit"), training.batches(1)
    with pytest.raises(TypeError, match="preflight must be True or False, got 1"):
        ciclo.train_loop(state, data, preflight=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"device_memory must be an int >= 1 \(bytes per device\), got 0"):
        ciclo.train_loop(state, data, device_memory=0)
    with pytest.raises(TypeError, match="device_memory must be an int"):
        ciclo.train_loop(state, data, device_memory=2.0**30)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="and the loop has none"):
        ciclo.train_loop(0, data, {ciclo.on_train_step: lambda state: state + 1}, preflight=True)
