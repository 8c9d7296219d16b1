"""`ciclo.preflight`: a train step compiled ahead of time, its memory per device and its FLOPs."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any, final

import jax

from ciclo._src.base.checks import check_bool, check_int, warn
from ciclo._src.base.reprs import cut, short
from ciclo._src.base.types import Trainable
from ciclo._src.state.managed import ManagedStep
from ciclo._src.state.summary import human, layout


@final
@dataclasses.dataclass(frozen=True)
class Preflight:
    """What one call of a train step needs on each device, from XLA's analysis of its compiled program.

    Attributes:
        step: the step analysed.
        memory: bytes per device of `"arguments"`, `"outputs"`, `"temporaries"`, `"generated code"` and
            `"aliased"` (outputs that reuse an argument's buffer), from `compiled.memory_analysis()`;
            None where the backend reports no memory analysis.
        flops: the step's floating-point operations per device, from `compiled.cost_analysis()`; None
            where XLA gives no count.
        largest: the state's largest arrays: `(path, partition spec, bytes per device)`, at most five.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> step = managed.train_step(lambda state, batch: ciclo.logs().add_loss("l", batch @ state.params))
        >>> state = managed.ManagedState.create(params=jnp.ones(4), tx=optax.sgd(0.1))
        >>> print(ciclo.preflight(state, jnp.ones(4), step=step))  # doctest: +ELLIPSIS
        preflight of managed.train_step(<lambda>), per device:
          arguments ...
          total ...
          flops ...
        the state's largest arrays, per device:
          params      16 B  single device
          ...
    """

    step: str
    memory: dict[str, int] | None
    flops: float | None
    largest: tuple[tuple[str, str, int], ...]

    @property
    def total_bytes(self) -> int | None:
        """The estimate per device: arguments, outputs, temporaries and code, less what is aliased."""
        return None if self.memory is None else sum(self.memory.values()) - 2 * self.memory["aliased"]

    def __str__(self) -> str:
        lines = [f"preflight of {self.step}, per device:"]
        total = self.total_bytes
        if self.memory is None or total is None:
            lines.append(f"  memory: not known, the {jax.default_backend()} backend reports no analysis")
        else:
            lines += [f"  {name:<15}{human(n):>10}" for name, n in {**self.memory, "total": total}.items()]
        lines.append(f"  {'flops':<15}{'not known' if self.flops is None else f'{self.flops:,.0f}':>10}")
        lines.append("the state's largest arrays, per device:")
        width = max((len(path) for path, _, _ in self.largest), default=0)
        lines += [f"  {path:<{width}}{human(n):>11}  {spec}" for path, spec, n in self.largest]
        return "\n".join(lines)


def preflight(state: Any, batch: Any, *, step: ManagedStep[Any] | None = None) -> Preflight:
    """Compiles a train step ahead of time and reports its memory per device and its FLOPs.

    The step is compiled on `state` and `batch` (`jax.jit(...).lower(...).compile()`, as
    `ManagedStep.lower` traces it, without donating the state: the outputs are counted beside the
    arguments) and XLA's analysis of the program is read; nothing runs.
    `train_loop(preflight=True, device_memory=...)` does it before step 0 (docs/strategies.md,
    "Will it fit? Preflight").

    Args:
        state: a managed state.
        batch: one batch, as the loop would pass it.
        step: the `managed.train_step` to compile; default: the state's class's `train_step`.

    Raises:
        TypeError: if there is no managed train step to compile.
        ValueError: under a strategy that runs one program per device (pmap).

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> from ciclo import managed
        >>> @managed.train_step
        ... def train_step(state, batch):
        ...     return ciclo.logs().add_loss("mse", jnp.mean((batch @ state.params) ** 2)), state
        >>> state = managed.ManagedState.create(params=jnp.ones((8, 4)), tx=optax.sgd(0.1))
        >>> report = ciclo.preflight(state, jnp.ones((32, 8)), step=train_step)
        >>> report.total_bytes > 0 and report.flops > 2 * 32 * 8 * 4
        True
    """
    if step is None and isinstance(state, Trainable):
        step = type(state).train_step  # type: ignore[assignment]  # the class's attribute: a ManagedStep
    if not isinstance(step, ManagedStep):
        raise TypeError(
            f"ciclo.preflight compiles a managed train step, and {type(state).__name__}'s train_step is "
            f"{short(step)}: pass step= a function decorated with @managed.train_step"
        )
    lowered = step.lower(state, batch)
    if lowered is None:
        raise ValueError(
            f"ciclo.preflight cannot analyse {step!r} under {short(state.strategy)}: it runs one program "
            'per device. Its state is replicated as under strategy="data_parallel": preflight that one'
        )
    compiled = lowered.compile()
    stats, cost = compiled.memory_analysis(), compiled.cost_analysis()
    memory = None
    if stats is not None:
        memory = {
            "arguments": stats.argument_size_in_bytes,
            "outputs": stats.output_size_in_bytes,
            "temporaries": stats.temp_size_in_bytes,
            "generated code": stats.generated_code_size_in_bytes,
            "aliased": stats.alias_size_in_bytes,  # outputs written over an argument's buffer
        }
    flops = None if cost is None else cost.get("flops")
    largest = sorted(layout(state), key=lambda leaf: -leaf.per_device)[:5]
    return Preflight(
        repr(step),
        memory,
        None if flops is None or flops <= 0 else float(flops),
        tuple((leaf.key(0), leaf.spec, leaf.per_device) for leaf in largest),
    )


def preflight_check(
    steps: list[Any], *, report: bool, device_memory: int | None
) -> list[Callable[[Any, Any], None]]:
    """`train_loop(preflight=, device_memory=)`: a callback for step 0 that preflights the managed steps."""
    check_bool(report, "preflight")
    if device_memory is not None:
        check_int(device_memory, "device_memory", 1, " (bytes per device)")
    if not (report or device_memory):
        return []
    managed = [step for step in steps if isinstance(step, ManagedStep)]
    if not managed:
        raise TypeError(
            "train_loop(preflight=..., device_memory=...) compiles the loop's managed train step ahead of "
            "time, and the loop has none: give a state whose train_step is a @managed.train_step, or "
            "leave preflight and device_memory out"
        )

    def preflight_step_0(state: Any, batch: Any) -> None:
        for step in managed:
            found = preflight(state, batch, step=step)
            if report:
                sys.stdout.write(f"{found}\n")
            total = found.total_bytes
            if device_memory is not None and total is None:
                warn(f"device_memory= is not checked: {jax.default_backend()} reports no memory analysis")
            elif device_memory is not None and total is not None and total > device_memory:
                arrays = cut(
                    ", ".join(f"{path} {human(n)} ({spec})" for path, spec, n in found.largest), 1000
                )
                raise ValueError(
                    f"{step!r} needs an estimated {human(total)} per device ({total:,} bytes), more than "
                    f"device_memory={device_memory:,}: the run stops before step 0. The state's largest "
                    f"arrays per device: {arrays}. To fit, split the state over the devices "
                    '(strategy="fsdp"), use smaller batches, or pass the device\'s real memory'
                )

    return [preflight_step_0]
