"""A training script that backs itself up: the fault tests kill it and run it again.

Usage: python worker.py MODE DIRECTORY [PROCESS_ID PORT [PAUSE]]

MODE is `loop` (a hand-written jitted step in `ciclo.loop`), `spikes` (a managed state with a
`ciclo.SpikeGuard` in `train_loop`, over data with a planted spike), `population` (a
`ciclo.population` of 4 members in `train_loop`, early stopping freezing some), `grain_prefetch`
(the same step in `ciclo.train_loop(..., prefetch=2)` over a grain iterator:
shuffled each epoch, batched, sharded by process), `train_loop` (a flax state
with dropout and Adam, a test loop each epoch, early stopping and a best
checkpoint), or `distributed_<strategy>` (2 processes under `jax.distributed`,
`ciclo.loop` over a managed state; JAX's heartbeat timeout is
`processes.HEARTBEAT` seconds). `train_loop` also logs
to TensorBoard (`DIRECTORY/tb`), CSV (`DIRECTORY/log.csv`), W&B offline
(`DIRECTORY/wandb`) and MLflow (`DIRECTORY/mlruns`), and when it finishes
writes the W&B and MLflow run ids to `DIRECTORY/runs.json`. The script prints
`saving <step>` just before each backup and `step <n>` after each step, and
when it finishes writes `DIRECTORY/result_<process>.npz` (parameters and
History). Run again after a kill, it resumes from `DIRECTORY/backup`.

PAUSE (`step:<n>` or `save:<n>`) freezes that process of a 2-process run at a
moment, so that a test kills it exactly there: after its step n, or as its
backup of step n starts (the backup asks the callbacks for their state: the
other process is then inside that save, waiting for this one). It prints
`paused` and waits to be killed. `stop:<n>` stops the process (SIGSTOP) in its
step n, a host stuck alive; with it or `watch`, the run has a watchdog (2 s).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import time

from support.processes import device_flags

MODE = sys.argv[1]
DIRECTORY = sys.argv[2]
if MODE.startswith("distributed_"):
    os.environ["XLA_FLAGS"] = device_flags(2)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import ciclo  # noqa: E402

STOP = 60
EVERY = 5


def announce(every: int):
    """A backup schedule that prints `saving <step>` when a backup is due, before it is written."""

    def schedule(elapsed: ciclo.types.Elapsed) -> bool:
        if elapsed.steps % every == 0:
            print(f"saving {elapsed.steps}", flush=True)
            return True
        return False

    return schedule


def progress(state, batch, elapsed):
    print(f"step {elapsed.steps + 1}", flush=True)


def regression_batches(n: int = STOP, batch: int = 16, features: int = 8):
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        x = rng.normal(size=(batch, features)).astype(np.float32)
        out.append((x, np.sin(x[:, :1]) + x[:, 1:2] * x[:, 2:3]))
    return out


def save_result(params, history, process: int = 0) -> None:
    leaves = {f"param_{i}": np.asarray(leaf) for i, leaf in enumerate(jax.tree.leaves(params))}
    columns = {}
    for key in ("loss", "loss_test", "accuracy_test", "losses.mse", "skipped"):
        try:
            steps, values = history.collect("steps", key)
        except KeyError:
            continue
        columns[f"history_{key}_steps"] = np.asarray(steps)
        columns[f"history_{key}"] = np.asarray(values)
    path = os.path.join(DIRECTORY, f"result_{process}.npz")
    np.savez(path + ".tmp.npz", **leaves, **columns)
    os.replace(path + ".tmp.npz", path)


def regression_model():
    """Parameters and a hand-written jitted step of a small regression model."""
    key = jax.random.key(0)
    k1, k2 = jax.random.split(key)
    params = {
        "w1": jax.random.normal(k1, (8, 256)) / 3.0,
        "w2": jax.random.normal(k2, (256, 1)) / 16.0,
    }

    @jax.jit
    def train_step(params, batch):
        x, y = batch

        def loss_fn(p):
            hidden = x
            for _ in range(8):  # a slower step: the kills land at many different points
                hidden = jnp.tanh(hidden @ p["w1"]) @ p["w1"].T
            return jnp.mean((jnp.tanh(hidden @ p["w1"]) @ p["w2"] - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        # A small rate: the loss stays finite over the whole run, so every backup is written (a
        # non-finite state is never backed up, which would leave the kills nothing to resume from).
        params = jax.tree.map(lambda p, g: p - 0.002 * g, params, grads)
        return ciclo.logs().add_loss("loss", loss), params

    return params, train_step


def hand_written_loop() -> None:
    params, train_step = regression_model()
    params, history, _ = ciclo.loop(
        params,
        regression_batches(),
        {ciclo.every(1): [train_step, progress]},
        stop=STOP,
        backup=ciclo.backup(os.path.join(DIRECTORY, "backup"), every=announce(EVERY)),
    )
    save_result(params, history)


def spike_guard_loop() -> None:
    import optax

    from ciclo import managed

    @managed.train_step
    def train_step(state, batch):
        x, y = batch
        preds = jnp.tanh(x @ state.params["w1"]) @ state.params["w2"]
        return ciclo.logs().add_loss("loss", jnp.mean((preds - y) ** 2))

    params, _ = regression_model()
    state = managed.ManagedState.create(
        params=params, tx=optax.adam(1e-3), skip_spikes=ciclo.SpikeGuard(window=8)
    )
    data = regression_batches()
    x, y = data[45]
    data[45] = (x, y + 100.0)  # a planted spike, judged by a resumed run with the statistics it restored
    state, history, _ = ciclo.train_loop(
        state,
        data,
        {ciclo.on_train_step: [train_step, progress]},
        stop=STOP,
        backup=ciclo.backup(os.path.join(DIRECTORY, "backup"), every=announce(EVERY)),
    )
    stats = optax.tree_utils.tree_get(state.opt_state, "SpikeStats")
    assert history.collect("skipped")[45] == 1
    save_result({"params": state.params, "statistics": stats}, history)


def population_loop() -> None:
    import optax

    from ciclo import managed

    class Regression(managed.ManagedState):
        @managed.train_step
        def train_step(self, batch):
            x, y = batch
            preds = jnp.tanh(x @ self.params["w1"]) @ self.params["w2"]
            return ciclo.logs().add_loss("loss", jnp.mean((preds - y) ** 2)), self

        @managed.step
        def test_step(self, batch):
            x, y = batch
            preds = jnp.tanh(x @ self.params["w1"]) @ self.params["w2"]
            return ciclo.logs().add_loss("loss", jnp.mean((preds - y) ** 2)), self

    params, _ = regression_model()

    def make_state(seed, learning_rate):
        noise = jax.random.normal(jax.random.key(seed), params["w2"].shape) / 16.0
        tx = optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate)
        return Regression.create(params={**params, "w2": params["w2"] + noise}, tx=tx)

    # A learning rate of 0 never improves: early stopping freezes those members part way.
    pop = ciclo.population(make_state, seeds=[0, 1], hparams={"learning_rate": [3e-4, 0.0]})
    stopper = ciclo.early_stopping("loss_test", patience=1)
    pop, history, _ = ciclo.train_loop(
        pop,
        regression_batches(),
        {ciclo.on_train_step: [progress]},
        test_dataset=lambda: regression_batches(4),
        callbacks=[stopper],
        epoch_duration=EVERY,
        stop=STOP,
        backup=ciclo.backup(os.path.join(DIRECTORY, "backup"), every=announce(EVERY)),
    )
    assert not np.asarray(pop.active).all(), "no member stopped: the run tests no frozen member"
    save_result({"params": pop.members.params, "active": pop.active}, history)


def grain_prefetch_loop() -> None:
    import grain

    params, train_step = regression_model()
    x, y = (np.concatenate(column) for column in zip(*regression_batches(15), strict=True))
    shard = grain.sharding.ShardByJaxProcess()  # one process here: all the rows
    rows = grain.MapDataset.source([(x[i], y[i]) for i in range(len(x))])
    rows = rows[shard.shard_index :: shard.shard_count]
    read_ahead = grain.ReadOptions(num_threads=2, prefetch_buffer_size=4)  # as docs/data.md reads
    dataset = rows.shuffle(seed=0).repeat().batch(16).to_iter_dataset(read_ahead)
    # Killed with batches read ahead: the backup holds the position of the last batch trained on.
    params, history, _ = ciclo.train_loop(
        params,
        iter(dataset),
        {ciclo.on_train_step: [train_step, progress]},
        stop=STOP,
        prefetch=2,
        backup=ciclo.backup(os.path.join(DIRECTORY, "backup"), every=announce(EVERY)),
    )
    save_result(params, history)


def flax_train_loop() -> None:
    import flax.linen as nn
    import optax

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x, training: bool = False):
            x = nn.relu(nn.Dense(64)(x))
            x = nn.Dropout(0.2, deterministic=not training)(x)
            return nn.Dense(10)(x)

    from support.blobs import blob_batches

    # 10 overlapping classes in 2 features: the test loss rises and falls and the accuracy moves, so
    # early stopping and the best checkpoint have state to resume. Made here: importing scikit-learn
    # for a dataset would cost each of the test's runs (reference, killed ones, last) 2 s at start.
    task = functools.partial(blob_batches, features=2, classes=10)
    train = task(STOP, seed=0, batch=32)
    test = task(6, seed=1, batch=64)

    state = ciclo.create_flax_state(
        MLP(),
        inputs=train[0][0][:1],
        tx=optax.adam(1e-2),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": lambda logits, labels: jnp.argmax(logits, -1) == labels},
        key=0,
    )
    # Offline and on disk: no network, nothing outside DIRECTORY.
    os.environ.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_DIR=DIRECTORY,
        MLFLOW_ALLOW_FILE_STORE="true",
        MLFLOW_DISABLE_TELEMETRY="true",
        DO_NOT_TRACK="true",
    )
    wandb = ciclo.wandb_logger(project="ciclo")
    mlflow = ciclo.mlflow_logger("ciclo", tracking_uri="file:" + os.path.join(DIRECTORY, "mlruns"))
    epoch = 10
    state, history, _ = ciclo.train_loop(
        state,
        train,
        {ciclo.every(1): [progress]},
        callbacks=[
            ciclo.early_stopping("loss_test", patience=3),
            ciclo.checkpoint(os.path.join(DIRECTORY, "best"), monitor="accuracy_test", keep=1),
            ciclo.tensorboard(os.path.join(DIRECTORY, "tb")),
            ciclo.csv_logger(os.path.join(DIRECTORY, "log.csv")),
            wandb,
            mlflow,
        ],
        test_dataset=lambda: test,
        epoch_duration=epoch,
        stop=STOP,
        backup=ciclo.backup(os.path.join(DIRECTORY, "backup"), every=announce(epoch)),
    )
    runs = {"wandb": wandb.state_dict()["run_id"], "mlflow": mlflow.state_dict()["run_id"]}
    with open(os.path.join(DIRECTORY, "runs.json"), "w") as file:
        json.dump(runs, file)
    save_result(state.params, history)


class Pause:
    """Freezes this process at `where` (`step:<n>` or `save:<n>`, see the module's docstring); "" never."""

    def __init__(self, where: str) -> None:
        self.moment, _, step = where.partition(":")
        self.step = int(step) if step else -1
        self.steps = 0

    def __call__(self, state, batch, elapsed) -> None:
        self.steps = int(elapsed.steps) + 1
        if self.moment == "step" and self.steps == self.step:
            self.wait()
        if self.moment == "stop" and self.steps == self.step:
            os.kill(os.getpid(), signal.SIGSTOP)  # alive and silent until killed

    def state_dict(self) -> dict:
        if self.moment == "save" and self.steps == self.step:
            self.wait()
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def wait(self) -> None:
        print("paused", flush=True)
        time.sleep(300)  # killed meanwhile
        raise SystemExit(f"paused at {self.moment} {self.step} and not killed in 300 s")


def distributed(strategy: str, process_id: int, port: int, pause: str) -> None:
    from support import processes

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=2,
        process_id=process_id,
        initialization_timeout=120,
        heartbeat_timeout_seconds=processes.HEARTBEAT,
    )
    from support import training

    rows = slice(process_id * training.BATCH // 2, (process_id + 1) * training.BATCH // 2)
    data = [(x[rows], y[rows]) for x, y in training.batches(STOP)]
    state = training.managed_state("mlp", strategy)
    checkpoints = os.path.join(DIRECTORY, "checkpoints")
    state, history, _ = ciclo.loop(
        state,
        data,
        {
            ciclo.every(1): [training.train_step, progress, Pause(pause)],
            ciclo.at_step_end(ciclo.every(10)): ciclo.checkpoint(checkpoints, keep=2),
        },
        stop=STOP,
        backup=ciclo.backup(os.path.join(DIRECTORY, "backup"), every=EVERY),
        # A save blocked on the stopped peer (the next backup comes before its step blocks) is a hang
        # too after save_timeout: under the heartbeat timeout, as 80 s is under JAX's default 100 s.
        watchdog=ciclo.watchdog(step_timeout=2, startup_timeout=120, save_timeout=processes.HEARTBEAT / 2)
        if pause.partition(":")[0] in ("stop", "watch")
        else None,
    )
    # Each process wrote its own shards of the checkpoints; restoring puts them back on the mesh.
    restored = ciclo.restore_checkpoint(checkpoints, state, step=50)
    assert restored.params[1]["w"].sharding == state.params[1]["w"].sharding
    params = state.with_strategy("eager").params
    checkpointed = restored.with_strategy("eager").params
    save_result({"final": params, "checkpoint_50": checkpointed}, history, process_id)


if __name__ == "__main__":
    if MODE == "loop":
        hand_written_loop()
    elif MODE == "spikes":
        spike_guard_loop()
    elif MODE == "grain_prefetch":
        grain_prefetch_loop()
    elif MODE == "train_loop":
        flax_train_loop()
    elif MODE == "population":
        population_loop()
    elif MODE.startswith("distributed_"):
        pause = sys.argv[5] if len(sys.argv) > 5 else ""
        distributed(MODE.removeprefix("distributed_"), int(sys.argv[3]), int(sys.argv[4]), pause)
    else:
        raise SystemExit(f"unknown mode {MODE!r}")
