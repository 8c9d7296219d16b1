"""The loops know members: a population's history, bars, early stopping, pruning, checkpoints and backups.

One tiny least-squares state, members differing in their learning rate (one of 0: it never improves).
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support.population import Regression

import ciclo

FEATURES = 3
RATES = [0.0, 0.003, 0.03, 0.3]


def make_state(learning_rate: float, seed: int = 0) -> Regression:
    w = jax.random.normal(jax.random.key(seed), (FEATURES,))
    return Regression.create(
        params={"w": w}, tx=optax.inject_hyperparams(optax.sgd)(learning_rate=learning_rate)
    )


def make_population(rates: list[float] = RATES) -> Any:
    return ciclo.population(make_state, hparams={"learning_rate": rates})


def data(count: int = 16) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(count, 4, FEATURES)).astype(np.float32)
    return [(x, x @ np.arange(1, FEATURES + 1, dtype=np.float32)) for x in xs]


def bits(tree: Any) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def assert_bitwise(a: Any, b: Any) -> None:
    for x, y in zip(bits(a), bits(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_history_collects_steps_by_members_and_a_members_own_history() -> None:
    pop, history, _ = ciclo.train_loop(make_population(), data(), stop=6)
    losses = history.collect("mse")
    assert isinstance(losses, np.ndarray) and losses.shape == (6, 4)
    steps, losses = history.collect("steps", "mse")
    assert steps == list(range(6)) and losses.shape == (6, 4)
    w = np.asarray(make_state(0.0).params["w"])  # learning rate 0: member 0 keeps its first params
    np.testing.assert_allclose(losses[:, 0], [np.mean((x @ w - y) ** 2) for x, y in data()[:6]], rtol=1e-6)
    own = history.member(3)
    assert own.collect("mse") == losses[:, 3].tolist()  # host floats, as one model's history holds
    assert own.collect("steps") == steps
    with pytest.raises(IndexError, match="member 4 out of range for a population of 4"):
        history.member(4)


def test_one_models_history_keeps_lists_and_refuses_member() -> None:
    _, history, _ = ciclo.train_loop(make_state(0.1), data(), stop=3)
    assert isinstance(history.collect("mse"), list)
    with pytest.raises(ValueError, match="population"):
        history.member(0)


def test_the_bar_shows_the_best_member_and_the_spread() -> None:
    out = io.StringIO()
    ciclo.train_loop(make_population(), data(), stop=4, callbacks=[ciclo.keras_bar(total=4, file=out)])
    last = out.getvalue().splitlines()[-1]
    # the member with the highest learning rate is the best; member 0 (rate 0) the worst
    assert "mse: " in last and "(best #3, " in last and "Array" not in last and "[" not in last.split("] ")[1]


def test_the_tqdm_bar_shows_the_best_member_too() -> None:
    pytest.importorskip("tqdm")
    out = io.StringIO()
    bar = ciclo.tqdm_bar(total=4, file=out, bar_format="{n}/{total}{postfix}")
    ciclo.train_loop(make_population(), data(), stop=4, callbacks=[bar])
    assert "mse=" in out.getvalue().splitlines()[-1].split("\r")[-1]
    assert "(best #3, " in out.getvalue()


def epoch_recorder(records: list[tuple[np.ndarray, np.ndarray]]) -> Any:
    def record(state: Any) -> Any:
        records.append((np.asarray(state.active), np.asarray(state.members.params["w"])))
        return None, state

    return record


def test_early_stopping_freezes_a_member_bit_for_bit_without_recompiling() -> None:
    records: list[tuple[np.ndarray, np.ndarray]] = []
    stopper = ciclo.early_stopping("mse", patience=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ciclo.types.RecompileWarning)
        pop, _, elapsed = ciclo.train_loop(
            make_population(),
            data(),
            {ciclo.on_epoch_end: [stopper, epoch_recorder(records)]},
            epoch_duration=2,
            stop=16,
        )
    assert elapsed.steps == 16  # the others go on
    assert stopper.stopped[0] and not stopper.stopped[3]
    assert np.asarray(pop.active).tolist() == [not s for s in stopper.stopped]
    first = next(i for i, (active, _) in enumerate(records) if not active[0])
    stopped_w = records[first][1][0]
    for _, w in records[first:]:
        np.testing.assert_array_equal(w[0], stopped_w)  # frozen from its stop on
    assert not np.array_equal(records[first][1][3], records[-1][1][3])  # member 3 trained on
    np.testing.assert_array_equal(np.asarray(pop.member(0).params["w"]), stopped_w)


def test_the_loop_ends_when_every_member_stopped() -> None:
    stopper = ciclo.early_stopping("mse", patience=0)
    pop, _, elapsed = ciclo.train_loop(
        make_population([0.0, 0.0]), data(), callbacks=[stopper], epoch_duration=2, stop=40
    )
    assert elapsed.steps == 4 and stopper.stopped == [True, True]  # a first check, then none better
    assert not np.asarray(pop.active).any()


def test_restore_best_weights_gives_each_member_its_best() -> None:
    values = iter([[3.0, 1.0], [2.0, 2.0], [4.0, 3.0], [5.0, 4.0]])

    def scores(state: Any) -> Any:
        return ciclo.logs().add_metric("score", jnp.array(next(values))), state

    stopper = ciclo.early_stopping("score", patience=1, mode="min", restore_best_weights=True)
    records: list[tuple[np.ndarray, np.ndarray]] = []
    pop, _, elapsed = ciclo.train_loop(
        make_population([0.1, 0.1]),
        data(),
        {ciclo.on_epoch_end: [scores, epoch_recorder(records), stopper]},
        epoch_duration=1,
        stop=8,
    )
    assert elapsed.steps == 4 and stopper.stopped == [True, True]
    w = np.asarray(pop.members.params["w"])
    np.testing.assert_array_equal(w[0], records[1][1][0])  # member 0's best: the second check
    np.testing.assert_array_equal(w[1], records[0][1][1])  # member 1's: the first


def test_prune_halves_the_active_members_by_rank() -> None:
    pruner = ciclo.prune(every=1, keep=0.5, monitor="mse")
    records: list[tuple[np.ndarray, np.ndarray]] = []
    pop, history, _ = ciclo.train_loop(
        make_population(),
        data(),
        {ciclo.on_epoch_end: [pruner, epoch_recorder(records)]},
        epoch_duration=4,
        stop=16,
    )
    assert pruner.pruned == [1, 0, 2]  # the better first: rates 0.003 and 0, then 0.03
    assert [active.tolist() for active, _ in records[:2]] == [
        [False, False, True, True],
        [False, False, False, True],
    ]
    assert np.asarray(pop.active).tolist() == [False, False, False, True]
    index, best = pop.best(history, "mse")
    assert index == 3
    assert_bitwise(best, pop.member(3))
    assert type(best) is Regression


def test_best_ranks_the_newest_values_of_a_history_or_logs() -> None:
    pop, history, _ = ciclo.train_loop(make_population(), data(), stop=6)
    newest = history.collect("mse")[-1]
    assert pop.best(history, "mse")[0] == int(np.argmin(newest))
    assert pop.best(history, "mse", mode="max")[0] == int(np.argmax(newest))
    scores = ciclo.logs().add_metric("accuracy", np.array([0.2, np.nan, 0.9, 0.5]))
    index, best = pop.best(scores, "accuracy")  # "auto": an accuracy is better higher; NaN last
    assert index == 2 and type(best) is Regression
    assert pop.best(ciclo.logs().add_loss("loss", np.array([np.nan, 3.0, 1.0, 2.0])))[0] == 2
    with pytest.raises(KeyError, match="population.best monitors 'loss', which is not in the logs"):
        pop.best(history)
    with pytest.raises(ValueError, match="mode must be"):
        pop.best(history, "mse", mode="lowest")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"every": 0}, ValueError, "every must be an int >= 1"),
        ({"keep": 1.5}, ValueError, r"fraction of the members kept, in \(0, 1\)"),
        ({"keep": 0}, ValueError, "keep must be an int >= 1"),
        ({"monitor": ""}, TypeError, "monitor"),
    ],
)
def test_prune_refuses_bad_arguments(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ciclo.prune(**kwargs)


def test_prune_refuses_one_model() -> None:
    with pytest.raises(TypeError, match="population"):
        ciclo.prune()(ciclo.types.Elapsed.create(), make_state(0.1), ciclo.logs().add_loss("loss", 1.0))


def test_restore_member_equals_the_populations_member(tmp_path: Any) -> None:
    ckpt = ciclo.checkpoint(tmp_path, keep=None, monitor="mse", async_save=False)
    pop, _, _ = ciclo.train_loop(make_population(), data(), callbacks=[ckpt], epoch_duration=2, stop=6)
    ckpt.close()
    for i in (0, 3):
        restored = ciclo.restore_checkpoint(tmp_path, make_state(0.5, seed=7), member=i)
        assert type(restored) is Regression
        assert_bitwise(restored, pop.member(i))
    with pytest.raises(IndexError, match="has 4 members"):
        ciclo.restore_checkpoint(tmp_path, make_state(0.5), member=4)


def test_best_step_of_a_member_and_a_one_model_checkpoint_refused(tmp_path: Any) -> None:
    ckpt = ciclo.checkpoint(tmp_path / "pop", keep=None, monitor="score", mode="min", async_save=False)
    pop = make_population([0.1, 0.1])
    for step, scores in enumerate([[1.0, 5.0], [2.0, 4.0], [3.0, 3.0]], start=1):
        state = pop.replace(members=pop.members.replace(params={"w": jnp.full((2, FEATURES), float(step))}))
        ckpt.save(step, state, ciclo.logs().add_metric("score", jnp.array(scores)))
    ckpt.close()
    target = make_state(0.1)

    def best_w(member: int) -> float:
        restored = ciclo.restore_checkpoint(tmp_path / "pop", target, step="best", member=member)
        return float(restored.params["w"][0])

    assert (best_w(0), best_w(1)) == (1.0, 3.0)
    one = ciclo.checkpoint(tmp_path / "one", async_save=False)
    one.save(1, target)
    one.close()
    with pytest.raises(
        ValueError, match=r"not a population's \(ciclo.population\); restore it without member="
    ):
        ciclo.restore_checkpoint(tmp_path / "one", target, member=0)


def run_with_backup(directory: Any, *extra: Any, stop: int = 12) -> Any:
    stopper = ciclo.early_stopping("mse", patience=1, name="stopper")
    return ciclo.train_loop(
        make_population(),
        data(),
        {ciclo.on_epoch_end: [stopper, *extra]},
        epoch_duration=2,
        stop=stop,
        backup=ciclo.backup(directory, every=2),
    )


def test_a_population_backup_resumes_bit_for_bit_stopped_members_included(tmp_path: Any) -> None:
    reference, reference_history, _ = run_with_backup(tmp_path / "reference")
    assert not np.asarray(reference.active).all()  # a member stopped before the end

    class Crash(Exception):
        pass

    def crash_at_6(elapsed: Any) -> None:
        if elapsed.steps >= 6:
            raise Crash

    with pytest.raises(Crash):
        run_with_backup(tmp_path / "run", lambda state, batch, elapsed: crash_at_6(elapsed))
    resumed, history, elapsed = run_with_backup(tmp_path / "run")
    assert elapsed.steps == 12
    assert_bitwise(resumed, reference)
    np.testing.assert_array_equal(history.collect("mse"), reference_history.collect("mse"))
