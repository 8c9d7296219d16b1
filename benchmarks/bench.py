"""Training steps per second of ciclo's loops against a bare JAX loop and Keras, on CPU.

What is measured: every implementation trains the same MLP (softmax cross entropy
with integer labels, `optax.adam(1e-3)`) for the same number of steps on the same
synthetic batches, already on the device and cycled, so data loading costs nothing
measurable. Compilation happens in a warm-up run before each timed run; each timed
run ends with `jax.block_until_ready` on the final state, so asynchronous dispatch
flatters no one.

Workloads:
    tiny    MLP 32-32-10, batch 32: the step takes microseconds, so the time goes
            to Python and dispatch: this is where a loop's overhead shows.
    medium  MLP 784-512-512-10, batch 256: the step's compute dominates.

Rows (implementations):
    bare                       a hand-written `for` loop over a `jax.jit`-ed step
    ciclo.loop                 the same step returning `ciclo.logs()`, in `ciclo.loop`
    ciclo.loop + keras_bar     the same, plus a `ciclo.keras_bar` redrawn as on a terminal
    ciclo.loop + tensorboard logger
                               the same, plus a `ciclo.tensorboard` logger writing event files
    train_loop + flax state    `ciclo.create_flax_state(..., strategy="jit")` in `ciclo.train_loop`
    flax state.train_step (hand loop)
                               the same flax state, trained by a hand-written
                               `for batch in islice(data, n): logs, state = state.train_step(batch)`
    train_loop spe=32 + flax state
                               the same flax state in `ciclo.train_loop(...,
                               steps_per_execution=32)`: batches grouped by `ciclo.stacked`,
                               32 managed steps a dispatch in one `lax.scan`
    train_loop + flax state (numpy batches)
                               `train_loop + flax state` fed numpy batches from the host: each
                               step's batch is copied to the device when the step is dispatched
    train_loop prefetch=2 + flax state (numpy batches)
                               the same with `train_loop(..., prefetch=2)`: each batch is put on
                               the device two steps ahead (`ciclo.prefetch_to_device`)
    train_loop + flax state bf16-mixed
                               `train_loop + flax state` created with `precision="bf16-mixed"`:
                               the MLP computes in bfloat16, its parameters stay float32
    fused K=32                 `ciclo.fuse(step)` over `ciclo.stacked(data, 32)` in `ciclo.loop`
                               (no tiny target: superseded by the spe=32 row)
    keras fit spe=1 / spe=32   Keras 3 (JAX backend) `model.fit`, steps_per_execution 1 and 32

How to read the table: implementations run in turns (round 1: every row once, then
round 2, ...), so slow drifts of a noisy machine hit them alike. "steps/s" is the
median over rounds and "µs/step" the same median as time per step; "ratio" is the
median steps/s divided by the bare loop's on the same workload (1.00 = as fast as
the bare loop, above 1 = faster); "round ratios" is the range, over rounds, of
each round's ratio to the bare loop of the same round; "best/best" compares the
fastest round of each (noise from other processes only ever slows a run down, so
on a busy machine it is the steadier figure). Targets are judged on medians (not
in `--smoke` runs, whose counts are too small to mean anything): most on the
ratio to the bare loop, some on the ratio of the row's steps/s to another row's
(`TARGETS` below; the "target" column shows the figure each is judged on).

Usage:
    python benchmarks/bench.py                  # defaults: 10 rounds, tiny 4096 and medium 128 steps
    python benchmarks/bench.py --smoke          # a few steps of everything, what CI runs
    python benchmarks/bench.py --workloads tiny --only bare,ciclo.loop --rounds 9 --output table.md
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import importlib.metadata
import io
import itertools
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

# Keras reads its backend once, when first imported.
os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import ciclo  # noqa: E402

Batch = tuple[jax.Array, jax.Array]
State = tuple[Any, Any]  # (params, opt_state)

DISTINCT_BATCHES = 64
GROUP = 32  # steps per dispatch of the fused, spe=32 and keras spe=32 rows
PREFETCH = 2  # batches put on the device ahead of the step, in the prefetch row
WARMUP_STEPS = GROUP  # before each timed run: compiles the step (the grouped rows' need a full group)
LEARNING_RATE = 1e-3


# ----------------------------------------------------------------------------- workloads


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    sizes: tuple[int, ...]  # input features, hidden widths..., classes
    batch_size: int
    default_steps: int


WORKLOADS = {
    "tiny": Workload("tiny", (32, 32, 10), batch_size=32, default_steps=4096),
    "medium": Workload("medium", (784, 512, 512, 10), batch_size=256, default_steps=128),
}

_numpy_data: dict[str, tuple[np.ndarray, np.ndarray]] = {}
_device_batches: dict[str, list[Batch]] = {}


def numpy_data(workload: Workload) -> tuple[np.ndarray, np.ndarray]:
    """`DISTINCT_BATCHES` batches of inputs and integer labels 0..9, made once (fixed seed)."""
    if workload.name not in _numpy_data:
        rng = np.random.default_rng(0)
        rows = DISTINCT_BATCHES * workload.batch_size
        x = rng.normal(size=(rows, workload.sizes[0])).astype(np.float32)
        y = rng.integers(0, workload.sizes[-1], size=rows).astype(np.int32)
        _numpy_data[workload.name] = (x, y)
    return _numpy_data[workload.name]


def device_batches(workload: Workload) -> list[Batch]:
    """The batches as `(x, y)` JAX arrays, placed on the device once."""
    if workload.name not in _device_batches:
        x, y = numpy_data(workload)
        b = workload.batch_size
        _device_batches[workload.name] = [
            (jax.device_put(x[i * b : (i + 1) * b]), jax.device_put(y[i * b : (i + 1) * b]))
            for i in range(DISTINCT_BATCHES)
        ]
    return _device_batches[workload.name]


def data_iter(workload: Workload) -> Iterator[Batch]:
    """An endless iterator over the device batches."""
    return itertools.cycle(device_batches(workload))


def host_iter(workload: Workload) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """An endless iterator over the same batches as numpy arrays: each must be copied to the device."""
    x, y = numpy_data(workload)
    b = workload.batch_size
    batches = [(x[i * b : (i + 1) * b], y[i * b : (i + 1) * b]) for i in range(DISTINCT_BATCHES)]
    return itertools.cycle(batches)


# ----------------------------------------------------------------------------- the JAX model and step

TX = optax.adam(LEARNING_RATE)


def init_state(workload: Workload, seed: int = 0) -> State:
    """Plain JAX MLP params (He-normal weights, zero biases) and Adam's state."""
    keys = jax.random.split(jax.random.key(seed), len(workload.sizes) - 1)
    params = [
        (
            jax.random.normal(key, (n_in, n_out), jnp.float32) * jnp.sqrt(2.0 / n_in),
            jnp.zeros((n_out,), jnp.float32),
        )
        for key, n_in, n_out in zip(keys, workload.sizes[:-1], workload.sizes[1:], strict=True)
    ]
    return params, TX.init(params)


def mlp(params: Any, x: jax.Array) -> jax.Array:
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def loss_and_accuracy(params: Any, batch: Batch) -> tuple[jax.Array, jax.Array]:
    x, y = batch
    logits = mlp(params, x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss, (logits.argmax(-1) == y).mean()


def update(state: State, batch: Batch) -> tuple[jax.Array, jax.Array, State]:
    """One Adam step: `(loss, accuracy, new_state)`."""
    params, opt_state = state
    (loss, accuracy), grads = jax.value_and_grad(loss_and_accuracy, has_aux=True)(params, batch)
    updates, opt_state = TX.update(grads, opt_state, params)
    return loss, accuracy, (optax.apply_updates(params, updates), opt_state)


@jax.jit
def bare_step(state: State, batch: Batch) -> tuple[dict[str, jax.Array], State]:
    loss, accuracy, state = update(state, batch)
    return {"loss": loss, "accuracy": accuracy}, state


def ciclo_step(state: State, batch: Batch) -> tuple[ciclo.types.Logs, State]:
    loss, accuracy, state = update(state, batch)
    return ciclo.logs().add_loss("loss", loss).add_metric("accuracy", accuracy), state


ciclo_step_jit = jax.jit(ciclo_step)
fused_step = ciclo.fuse(ciclo_step)


# ----------------------------------------------------------------------------- implementations


class Unavailable(Exception):
    """An implementation that cannot run here (a missing package); its row reads n/a."""


def timed(run: Callable[[], Any]) -> float:
    """Seconds taken by `run()` until the state it returns is computed."""
    gc.collect()
    start = time.perf_counter()
    jax.block_until_ready(run())
    return time.perf_counter() - start


def run_bare(workload: Workload, steps: int) -> float:
    def train(state: State, n: int) -> State:
        for batch in itertools.islice(data_iter(workload), n):
            _logs, state = bare_step(state, batch)
        return state

    state = jax.block_until_ready(train(init_state(workload), WARMUP_STEPS))
    return timed(lambda: train(state, steps))


def _ciclo_loop_row(workload: Workload, steps: int, with_bar: bool, logdir: str | None = None) -> float:
    def train(state: State, n: int) -> State:
        callbacks: list[Any] = [ciclo_step_jit]
        if with_bar:
            callbacks.append(ciclo.keras_bar(total=n, file=TerminalSink()))
        if logdir is not None:
            callbacks.append(ciclo.tensorboard(logdir))
        state, _history, _elapsed = ciclo.loop(
            state, data_iter(workload), {ciclo.every(1): callbacks}, stop=n
        )
        return state

    state = jax.block_until_ready(train(init_state(workload), WARMUP_STEPS))
    return timed(lambda: train(state, steps))


class TerminalSink(io.StringIO):
    """Swallows a progress bar's output while making it behave as on a terminal (redraws in place)."""

    def isatty(self) -> bool:
        return True


def run_ciclo_loop(workload: Workload, steps: int) -> float:
    return _ciclo_loop_row(workload, steps, with_bar=False)


def run_ciclo_loop_keras_bar(workload: Workload, steps: int) -> float:
    return _ciclo_loop_row(workload, steps, with_bar=True)


def run_ciclo_loop_tensorboard(workload: Workload, steps: int) -> float:
    """`ciclo.loop` with a `ciclo.tensorboard` logger writing real event files, in a fresh directory."""
    try:
        ciclo.tensorboard("unused")  # imports tensorboardX; creates no file
    except ImportError:
        raise Unavailable("tensorboardX not installed (ciclo-core[tensorboard])") from None
    with tempfile.TemporaryDirectory(prefix="ciclo-bench-tb-") as logdir:
        return _ciclo_loop_row(workload, steps, with_bar=False, logdir=logdir)


def run_fused(workload: Workload, steps: int) -> float:
    def train(state: State, n: int) -> State:
        dataset = ciclo.stacked(data_iter(workload), GROUP)
        state, _history, _elapsed = ciclo.loop(state, dataset, {ciclo.every(1): [fused_step]}, stop=n)
        return state

    state = jax.block_until_ready(train(init_state(workload), WARMUP_STEPS))
    return timed(lambda: train(state, steps))


def _create_flax_state() -> Callable[..., Any]:
    try:
        return ciclo.create_flax_state  # resolved on first use; absent without ciclo-flax
    except (AttributeError, ImportError):
        raise Unavailable("ciclo-flax not installed") from None


_flax_modules: dict[str, Any] = {}


def flax_module(workload: Workload) -> Any:
    """A flax linen MLP of the workload's sizes."""
    if workload.name not in _flax_modules:
        import flax.linen as nn

        class MLP(nn.Module):
            sizes: tuple[int, ...]

            @nn.compact
            def __call__(self, x: jax.Array) -> jax.Array:
                for width in self.sizes[1:-1]:
                    x = nn.relu(nn.Dense(width)(x))
                return nn.Dense(self.sizes[-1])(x)

        _flax_modules[workload.name] = MLP(workload.sizes)
    return _flax_modules[workload.name]


def flax_state(workload: Workload, precision: str = "32") -> Any:
    """A fresh managed flax state (`ciclo.create_flax_state(..., strategy="jit")`) of the workload's MLP."""
    create = _create_flax_state()
    try:
        module = flax_module(workload)
    except ImportError:
        raise Unavailable("flax not installed") from None
    x0 = device_batches(workload)[0][0]
    return create(
        module,
        inputs=x0,
        tx=optax.adam(LEARNING_RATE),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": lambda preds, target: preds.argmax(-1) == target},
        strategy="jit",
        precision=precision,
    )


def _flax_train_loop_row(
    workload: Workload,
    steps: int,
    steps_per_execution: int,
    *,
    host: bool = False,
    prefetch: int | None = None,
    precision: str = "32",
) -> float:
    def train(state: Any, n: int) -> Any:
        # One epoch per run, as `keras fit epochs=1`: the state resets its metrics at its end.
        state, _history, _elapsed = ciclo.train_loop(
            state,
            host_iter(workload) if host else data_iter(workload),
            epoch_duration=n,
            stop=n,
            steps_per_execution=steps_per_execution,
            prefetch=prefetch,
        )
        return state

    state = jax.block_until_ready(train(flax_state(workload, precision), WARMUP_STEPS))
    return timed(lambda: train(state, steps))


def run_flax_train_loop(workload: Workload, steps: int) -> float:
    return _flax_train_loop_row(workload, steps, 1)


def run_flax_train_loop_spe(workload: Workload, steps: int) -> float:
    return _flax_train_loop_row(workload, steps, GROUP)


def run_flax_train_loop_host(workload: Workload, steps: int) -> float:
    return _flax_train_loop_row(workload, steps, 1, host=True)


def run_flax_train_loop_prefetch(workload: Workload, steps: int) -> float:
    return _flax_train_loop_row(workload, steps, 1, host=True, prefetch=PREFETCH)


def run_flax_train_loop_bf16(workload: Workload, steps: int) -> float:
    return _flax_train_loop_row(workload, steps, 1, precision="bf16-mixed")


def run_flax_hand_loop(workload: Workload, steps: int) -> float:
    """The managed step alone: the flax state's `train_step` in a hand-written loop."""

    def train(state: Any, n: int) -> Any:
        for batch in itertools.islice(data_iter(workload), n):
            _logs, state = state.train_step(batch)
        return state

    state = jax.block_until_ready(train(flax_state(workload), WARMUP_STEPS))
    return timed(lambda: train(state, steps))


_keras_models: dict[tuple[str, int], Any] = {}


def keras_model(workload: Workload, steps_per_execution: int) -> Any:
    """A compiled Keras MLP of the workload's sizes, one per steps_per_execution."""
    key = (workload.name, steps_per_execution)
    if key not in _keras_models:
        try:
            import keras
        except ImportError:
            raise Unavailable("keras not installed") from None
        keras.utils.set_random_seed(0)
        layers = [keras.Input(shape=(workload.sizes[0],))]
        layers += [keras.layers.Dense(width, activation="relu") for width in workload.sizes[1:-1]]
        layers.append(keras.layers.Dense(workload.sizes[-1]))
        model = keras.Sequential(layers)
        model.compile(
            optimizer=keras.optimizers.Adam(LEARNING_RATE),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=steps_per_execution,
        )
        _keras_models[key] = model
    return _keras_models[key]


def keras_arrays(workload: Workload, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Numpy arrays holding exactly `steps` batches (the distinct batches, cycled)."""
    x, y = numpy_data(workload)
    rows = steps * workload.batch_size
    repeats = -(-rows // len(x))
    return np.tile(x, (repeats, 1))[:rows], np.tile(y, repeats)[:rows]


def _keras_row(workload: Workload, steps: int, steps_per_execution: int) -> float:
    model = keras_model(workload, steps_per_execution)

    def train(x: np.ndarray, y: np.ndarray) -> Any:
        model.fit(
            x,
            y,
            batch_size=workload.batch_size,
            epochs=1,
            verbose=0,
            shuffle=False,
        )
        return [variable.value for variable in model.variables]

    jax.block_until_ready(train(*keras_arrays(workload, WARMUP_STEPS)))
    x, y = keras_arrays(workload, steps)
    return timed(lambda: train(x, y))


def run_keras_spe1(workload: Workload, steps: int) -> float:
    return _keras_row(workload, steps, 1)


def run_keras_spe32(workload: Workload, steps: int) -> float:
    return _keras_row(workload, steps, GROUP)


IMPLEMENTATIONS: dict[str, Callable[[Workload, int], float]] = {
    "bare": run_bare,
    "ciclo.loop": run_ciclo_loop,
    "ciclo.loop + keras_bar": run_ciclo_loop_keras_bar,
    "ciclo.loop + tensorboard logger": run_ciclo_loop_tensorboard,
    "train_loop + flax state": run_flax_train_loop,
    "flax state.train_step (hand loop)": run_flax_hand_loop,
    f"train_loop spe={GROUP} + flax state": run_flax_train_loop_spe,
    "train_loop + flax state (numpy batches)": run_flax_train_loop_host,
    f"train_loop prefetch={PREFETCH} + flax state (numpy batches)": run_flax_train_loop_prefetch,
    "train_loop + flax state bf16-mixed": run_flax_train_loop_bf16,
    f"fused K={GROUP}": run_fused,
    "keras fit spe=1": run_keras_spe1,
    f"keras fit spe={GROUP}": run_keras_spe32,
}


# ----------------------------------------------------------------------------- targets


BARE = "bare"
HAND_LOOP = "flax state.train_step (hand loop)"
KERAS_ROWS = ("keras fit spe=1", f"keras fit spe={GROUP}")
MAX_STEP_TIME_OVER_BARE = 1.15  # the managed step's time at most 1.15× the bare step's


@dataclasses.dataclass(frozen=True)
class Target:
    """On one workload: this row's median steps/s ≥ `minimum` × `relative_to`'s median steps/s.

    With `relative_to="bare"` (the default) that is the row's ratio to the bare
    loop; naming another row makes the target relative to that row ("faster
    than X by a factor of `minimum`"). `per_step_time` states the same target
    as a bound on time per step: µs/step ≤ (1 / `minimum`) × the other row's.
    """

    workload: str
    minimum: float
    relative_to: str = BARE
    per_step_time: bool = False

    def describe(self) -> str:
        if self.per_step_time:
            return f"µs/step ≤ {1 / self.minimum:.2f}× {self.relative_to}'s"
        if self.relative_to == BARE:
            return f"≥ {self.minimum:.2f}"
        return f"≥ {self.minimum:.2f}× {self.relative_to}"

    def figure(self, ratio: float) -> str:
        """The measured figure the target is judged on, where the table's ratio column does not show it."""
        if self.per_step_time:
            return f"{1 / ratio:.3f}×, "
        return f"{ratio:.3f}, " if self.relative_to != BARE else ""


TARGETS: dict[str, list[Target]] = {
    "ciclo.loop": [Target("tiny", 0.97)],
    "ciclo.loop + keras_bar": [Target("tiny", 0.95)],
    "ciclo.loop + tensorboard logger": [Target("tiny", 0.95)],
    "train_loop + flax state": [Target("tiny", 0.90, relative_to=HAND_LOOP)],
    # The managed step alone: at most 1.15× the bare step's time.
    HAND_LOOP: [Target("tiny", 1 / MAX_STEP_TIME_OVER_BARE, per_step_time=True)],
    f"train_loop spe={GROUP} + flax state": [
        Target("tiny", 3.0),
        Target("tiny", 1.5, relative_to=f"keras fit spe={GROUP}"),
    ],
    # f"fused K={GROUP}" has no tiny target: the spe=32 row, above, supersedes it.
}
# Rows that measure what a CPU cannot show (its "device" is the host, and it emulates bfloat16):
# they are shown beside the rows they change, with no target. README.md says what to expect on a GPU.
CPU_INFORMATIONAL = (
    "train_loop + flax state (numpy batches)",
    f"train_loop prefetch={PREFETCH} + flax state (numpy batches)",
    "train_loop + flax state bf16-mixed",
)
# medium: every other ciclo row (all but the bare loop and Keras) ≥ 0.98 of the bare loop.
for _name in IMPLEMENTATIONS:
    if _name != BARE and _name not in KERAS_ROWS and _name not in CPU_INFORMATIONAL:
        TARGETS.setdefault(_name, []).append(Target("medium", 0.98))


# ----------------------------------------------------------------------------- running and reporting


@dataclasses.dataclass
class Row:
    name: str
    seconds: list[float] = dataclasses.field(default_factory=list)
    unavailable: str | None = None


def measure(workload: Workload, names: Sequence[str], steps: int, rounds: int) -> dict[str, Row]:
    """Runs each implementation once per round, in turn; returns the times of each."""
    rows = {name: Row(name) for name in names}
    for round_index in range(1, rounds + 1):
        for name in names:
            row = rows[name]
            if row.unavailable is not None:
                continue
            progress(f"[{workload.name}] round {round_index}/{rounds}: {name} ... ")
            try:
                seconds = IMPLEMENTATIONS[name](workload, steps)
            except Unavailable as reason:
                row.unavailable = str(reason)
                progress(f"n/a ({reason})\n")
                continue
            row.seconds.append(seconds)
            progress(f"{steps / seconds:,.0f} steps/s\n")
    return rows


def progress(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def steps_per_second(row: Row, steps: int) -> float:
    return steps / statistics.median(row.seconds)


def round_ratios(row: Row, bare: Row | None) -> list[float]:
    """Each round's speed relative to the bare loop of the same round."""
    if bare is None or len(bare.seconds) != len(row.seconds):
        return []
    return [b / s for b, s in zip(bare.seconds, row.seconds, strict=True)]


def judge(name: str, workload: str, speeds: dict[str, float]) -> str:
    """The targets of `name` on `workload`, the figure each is judged on and whether it is met; '' if none."""
    verdicts = []
    for target in TARGETS.get(name, []):
        if target.workload != workload:
            continue
        if target.relative_to not in speeds:
            verdicts.append(f"{target.describe()}: n/a (no {target.relative_to} row)")
            continue
        ratio = speeds[name] / speeds[target.relative_to]
        met = ratio >= target.minimum
        verdicts.append(f"{target.describe()}: {target.figure(ratio)}{'met' if met else 'MISSED'}")
    return "; ".join(verdicts)


def table(workload: Workload, rows: dict[str, Row], steps: int, rounds: int, judge_targets: bool) -> str:
    """One workload's markdown section."""
    bare = rows.get(BARE)
    bare = bare if bare is not None and bare.seconds else None
    speeds = {name: steps_per_second(row, steps) for name, row in rows.items() if row.seconds}
    sizes = "-".join(str(n) for n in workload.sizes)
    runs = f"{steps} steps × {rounds} round{'s' if rounds != 1 else ''}"
    lines = [
        f"### {workload.name}: MLP {sizes}, batch {workload.batch_size}, {runs}",
        "",
        "| implementation | steps/s (median) | µs/step | ratio to bare | round ratios (min–max) | best/best"
        " | target |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, row in rows.items():
        if not row.seconds:
            lines.append(f"| {name} | n/a ({row.unavailable or 'not run'}) | | | | | |")
            continue
        ratio_text = spread = best = ""
        if bare is not None:
            ratio_text = f"{speeds[name] / speeds[BARE]:.3f}"
            per_round = round_ratios(row, bare)
            spread = f"{min(per_round):.3f}–{max(per_round):.3f}" if per_round else ""
            best = f"{min(bare.seconds) / min(row.seconds):.3f}"
        verdict = judge(name, workload.name, speeds) if judge_targets else ""
        micros = 1e6 / speeds[name]
        lines.append(
            f"| {name} | {speeds[name]:,.0f} | {micros:,.1f} | {ratio_text} | {spread} | {best} | {verdict} |"
        )
    return "\n".join(lines)


def header() -> str:
    device = jax.devices()[0]
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    processor = platform.processor() or platform.machine()
    return (
        f"{now} · {platform.system()} {platform.machine()} ({processor}), {os.cpu_count()} CPUs · "
        f"jax {jax.__version__} on {jax.default_backend()} ({device.device_kind}) · "
        f"Python {platform.python_version()} · {package_versions()}"
    )


def package_versions() -> str:
    found = []
    for package in ("ciclo-core", "ciclo-flax", "optax", "flax", "keras"):
        try:
            found.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return ", ".join(found)


# ----------------------------------------------------------------------------- command line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, help="timed steps per run (default: 4096 tiny, 128 medium)")
    parser.add_argument("--rounds", type=int, default=10, help="runs of each implementation (default 10)")
    parser.add_argument("--workloads", default="tiny,medium", help="comma-separated: tiny,medium")
    parser.add_argument("--only", help=f"comma-separated rows, of: {', '.join(IMPLEMENTATIONS)}")
    parser.add_argument("--smoke", action="store_true", help="64 steps, 1 round, every row; no targets")
    parser.add_argument("--output", help="also write the markdown table to this file")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.rounds = 64, 1
    args.workloads = _split(args.workloads, WORKLOADS, "workload", parser)
    args.only = _split(args.only, IMPLEMENTATIONS, "row", parser) if args.only else list(IMPLEMENTATIONS)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.steps is not None and (args.steps < GROUP or args.steps % GROUP):
        parser.error(f"--steps must be a positive multiple of {GROUP} (the grouped rows' group)")
    return args


def _split(value: str, known: dict[str, Any], what: str, parser: argparse.ArgumentParser) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        parser.error(f"unknown {what} {unknown or value!r}; choose from {', '.join(known)}")
    return names


def warm_up_history() -> None:
    """Compiles, once, the history's copies of logged scalars to the host.

    A history starts copying a few hundred steps into a loop; without this, the
    first timed run of a `ciclo` row would pay for that compilation.
    """
    step = jax.jit(lambda state: (ciclo.logs().add_metric("value", state), state + 1.0))
    ciclo.loop(jnp.float32(0.0), itertools.repeat(None), {ciclo.every(1): [step]}, stop=1024)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    warm_up_history()
    sections = [header()]
    for workload_name in args.workloads:
        workload = WORKLOADS[workload_name]
        steps = args.steps or workload.default_steps
        rows = measure(workload, args.only, steps, args.rounds)
        sections.append(table(workload, rows, steps, args.rounds, judge_targets=not args.smoke))
    report = "\n\n".join(sections) + "\n"
    print(report, end="")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as file:
            file.write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
