import copy
import pickle
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo
from ciclo._src.logs import host_copies
from ciclo._src.logs import logs as logs_module


def test_add_methods_and_attribute_access():
    logs = ciclo.logs()
    logs.add_metric("accuracy", 0.9).add_loss("xent", 0.3, add_metric=True).add_output("preds", [1, 2])
    logs.add_entry("custom", "value", 7).add_metrics(a=1).add_losses(b=2).add_outputs(c=3)
    assert logs.metrics.accuracy == 0.9
    assert logs.losses.xent == 0.3 and logs.metrics.xent == 0.3
    assert logs.outputs.preds == [1, 2] and logs.custom.value == 7
    assert logs.entry_value("accuracy") == 0.9
    assert logs.entry_value("custom.value") == 7
    logs.add_losses(add_metrics=True, d=4)
    assert logs.metrics.d == 4


def test_missing_attributes_raise_attribute_error():
    logs = ciclo.logs().add_metric("a", 1)
    with pytest.raises(AttributeError, match="'nope'"):
        _ = logs.nope
    with pytest.raises(AttributeError, match="'b'"):
        _ = logs.metrics.b


def test_updates_is_write_only_and_merges():
    logs = ciclo.logs().add_metric("a", 1)
    logs.updates = {"metrics": {"b": 2}, "losses": {"c": 3}}
    logs.updates = None
    assert logs == {"metrics": {"a": 1, "b": 2}, "losses": {"c": 3}}
    with pytest.raises(AttributeError, match="write-only"):
        _ = logs.updates


def test_merge_copies_and_later_wins():
    source = {"metrics": {"a": 1}}
    logs = ciclo.logs().merge(source).merge({"metrics": {"a": 2}})
    assert logs.metrics.a == 2 and source == {"metrics": {"a": 1}}


def test_merge_rejects_flat_dicts():
    with pytest.raises(TypeError, match="'loss'"):
        ciclo.logs().merge({"loss": 0.5})  # type: ignore[dict-item]


def test_ambiguous_and_missing_keys():
    logs = ciclo.logs().add_metric("loss", 1).add_loss("loss", 2)
    with pytest.raises(ValueError, match="'losses.loss' and 'metrics.loss'"):
        logs.entry_value("loss")
    with pytest.raises(KeyError, match="'accuracy'"):
        logs.entry_value("accuracy")
    assert logs.entry_path("losses.loss") == ("losses", "loss")
    assert logs.entry_path("missing.loss") is None


def test_logs_are_pytrees_returned_from_jit():
    @jax.jit
    def step(x):
        return ciclo.logs().add_metric("double", 2 * x).add_loss("x", x)

    out = step(jnp.float32(3.0))
    assert isinstance(out, ciclo.types.Logs) and isinstance(out.metrics, ciclo.types.Entries)
    assert float(out.metrics.double) == 6.0
    doubled = jax.tree.map(lambda v: v * 2, out)
    assert isinstance(doubled, ciclo.types.Logs) and float(doubled.losses.x) == 6.0


def test_logs_copy_and_pickle():
    logs = ciclo.logs().add_metric("a", 1)
    assert copy.deepcopy(logs) == logs
    assert pickle.loads(pickle.dumps(logs)).metrics.a == 1


def commit_steps(history, values, key="loss", collection="metrics"):
    for step, value in enumerate(values):
        history.commit(ciclo.types.Elapsed(step, step * 4, step * 0.1, 0.0), {collection: {key: value}})


def test_history_collect_single_and_several():
    history = ciclo.history()
    commit_steps(history, [1.0, 2.0, 3.0])
    assert history.collect("loss") == [1.0, 2.0, 3.0]
    steps, samples, times, losses = history.collect("steps", "samples", "time", "metrics.loss")
    assert steps == [0, 1, 2] and samples == [0, 4, 8] and losses == [1.0, 2.0, 3.0]
    assert times == pytest.approx([0.0, 0.1, 0.2])


def test_history_collect_only_entries_with_all_keys():
    history = ciclo.history()
    history.commit(ciclo.types.Elapsed(0, 0, 0.0, 0.0), {"metrics": {"loss": 1.0}})
    history.commit(ciclo.types.Elapsed(1, 0, 0.0, 0.0), {"metrics": {"loss": 2.0, "acc": 0.5}})
    assert history.collect("steps", "acc") == ([1], [0.5])
    assert history.collect("loss") == [1.0, 2.0]


def test_history_collect_errors():
    history = ciclo.history()
    history.commit(ciclo.types.Elapsed(0, 0, 0.0, 0.0), {"metrics": {"loss": 1.0}, "losses": {"loss": 1.0}})
    with pytest.raises(ValueError, match="'losses.loss' and 'metrics.loss'"):
        history.collect("loss")
    with pytest.raises(KeyError, match="'accuracy'.*metrics.loss"):
        history.collect("accuracy")
    with pytest.raises(TypeError, match="at least one key"):
        history.collect()
    assert history.collect("losses.loss") == [1.0]


def test_history_entries_have_elapsed_collection():
    history = ciclo.history()
    commit_steps(history, [5.0, 6.0])
    assert len(history) == 2
    last = history[-1]
    assert last.metrics.loss == 6.0 and last.elapsed.steps == 1 and last.elapsed.samples == 4
    assert [entry.metrics.loss for entry in history] == [5.0, 6.0]
    assert [entry.metrics.loss for entry in history[0:1]] == [5.0]
    with pytest.raises(IndexError):
        _ = history[2]
    assert "2 entries" in repr(history)


def test_history_holds_device_arrays_only_briefly():
    history = ciclo.history()
    n = 5 * logs_module._LAG
    commit_steps(history, [jnp.float32(i) for i in range(n)])
    assert not any(isinstance(v, jax.Array) for row in history._values for v in row)
    # the newest `_LAG` rows, the window of copies in flight, and the rows since: not every row
    assert 0 < len(history) - history.on_host < 3 * logs_module._LAG
    assert history.collect("loss") == [float(i) for i in range(n)]
    assert not any(isinstance(v, jax.Array) for row in history._values for v in row)


def test_history_keeps_arrays_as_numpy():
    history = ciclo.history()
    history.commit(ciclo.types.Elapsed(0, 0, 0.0, 0.0), {"outputs": {"preds": jnp.ones((2, 3))}})
    (preds,) = history.collect("preds")
    assert isinstance(preds, np.ndarray) and preds.shape == (2, 3)


def test_history_commit_does_not_read_recent_values():
    class Tripwire:
        def __array__(self, *args, **kwargs):
            raise AssertionError("a recent value was read")

        copy_to_host_async = __float__ = __array__

    history = ciclo.history()
    for step in range(logs_module._LAG):
        history.commit(ciclo.types.Elapsed(step, 0, 0.0, 0.0), {"metrics": {"loss": Tripwire()}})
    assert len(history) == logs_module._LAG


def test_history_copies_columns_of_scalars_to_python_numbers():
    history = ciclo.history()
    n = 3 * logs_module._LAG + 7
    mesh = jax.make_mesh((1,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    for step in range(n):
        logs = ciclo.logs().add_metrics(
            loss=jnp.float32(step) / 2,
            correct=jnp.int32(step),
            best=jnp.bool_(step % 2),
            # a column whose shape changes midway, and one whose sharding does: copied one by one
            vector=jnp.ones(1 + step // logs_module._LAG),
            placed=jax.device_put(jnp.float32(step), replicated) if step % 3 else jnp.float32(step),
        )
        if step % 5 == 0:
            logs.add_output("extra", step)  # rows with another schema
        history.commit(ciclo.types.Elapsed(step, 0, 0.0, 0.0), logs)
    loss, correct, best, vector, placed = history.collect("loss", "correct", "best", "vector", "placed")
    assert loss == [step / 2 for step in range(n)] and all(type(v) is float for v in loss)
    assert correct == list(range(n)) and all(type(v) is int for v in correct)
    assert best == [bool(step % 2) for step in range(n)] and all(type(v) is bool for v in best)
    assert [v.shape for v in vector] == [(1 + step // logs_module._LAG,) for step in range(n)]
    assert placed == [float(step) for step in range(n)]
    assert history.collect("extra") == list(range(0, n, 5))


@pytest.fixture
def copies(monkeypatch):
    """Every `host_copies.Copy` made while the test runs."""
    made = []
    copy = host_copies.Copy
    monkeypatch.setattr(host_copies, "Copy", lambda *args: made.append(copy(*args)) or made[-1])
    return made


def test_small_arrays_are_stacked_per_column_and_large_ones_copied_one_by_one(copies):
    # A population logs one value per member: such a column is stacked as scalars are; a large one is not.
    history = ciclo.history()
    n = 3 * logs_module._LAG + 7
    large = host_copies.STACKED_SIZE + 1
    for step in range(n):
        logs = ciclo.logs().add_metrics(members=jnp.arange(8.0) + step, large=jnp.full(large, step))
        history.commit(ciclo.types.Elapsed(step, 0, 0.0, 0.0), logs)
    stacked = [copy for copy in copies if copy.first is not None]
    assert stacked and all(copy.array.shape == (host_copies.CHUNK, 8) for copy in stacked)
    alone = [copy.array.shape for copy in copies if copy.first is None]
    assert alone and set(alone) == {(large,)}
    members, large_values = history.collect("members", "large")
    np.testing.assert_array_equal(np.stack(members), np.arange(8.0) + np.arange(n)[:, None])
    assert all(type(row) is np.ndarray and row.shape == (8,) for row in members)
    np.testing.assert_array_equal(np.stack(large_values), np.repeat(np.arange(n)[:, None], large, 1))


def test_history_rows_logging_the_same_scalars_are_copied_column_by_column(copies):
    # Every row logs the same entries: each column of device scalars is stacked and copied whole.
    history = ciclo.history()
    n = 3 * logs_module._LAG + 7
    for step in range(n):
        logs = ciclo.logs().add_metrics(
            loss=jnp.float32(step) / 2, correct=jnp.int32(step), best=jnp.bool_(step % 2)
        )
        history.commit(ciclo.types.Elapsed(step, 0, 0.0, 0.0), logs.add_metric("host", step * 1.5))
    assert copies and all(len(copy.cells) == host_copies.CHUNK for copy in copies), "a column was not stacked"
    assert history.latest().metrics == {
        "loss": (n - 1) / 2,
        "correct": n - 1,
        "best": bool((n - 1) % 2),
        "host": (n - 1) * 1.5,
    }
    assert history.on_host < n  # the newest rows are still on the device
    loss, correct, best, host = history.collect("loss", "correct", "best", "host")
    assert loss == [step / 2 for step in range(n)] and all(type(v) is float for v in loss)
    assert correct == list(range(n)) and all(type(v) is int for v in correct)
    assert best == [bool(step % 2) for step in range(n)] and all(type(v) is bool for v in best)
    assert host == [step * 1.5 for step in range(n)]
    assert history.on_host == n and history[5].metrics.correct == 5
    assert type(history.latest().metrics.loss) is float  # rows on the host give their host values


def test_history_keeps_the_type_of_each_value_in_a_column_of_several_dtypes(monkeypatch):
    # Stacked together under JAX's default promotion, int32 and float32 scalars came back as floats.
    monkeypatch.setattr(logs_module, "_LAG", 2)
    history = ciclo.history()
    with jax.numpy_dtype_promotion("standard"):
        for step in range(8):
            value = jnp.int32(step) if step % 2 else jnp.float32(step)
            history.append(step, 0, 0.0, ciclo.logs().add_metric("mixed", value))
        mixed = history.collect("mixed")
    assert mixed == list(range(8)) and [type(v) for v in mixed] == [float, int] * 4


def test_history_reads_rows_of_any_mapping(monkeypatch):
    monkeypatch.setattr(logs_module, "_LAG", 2)
    history = ciclo.history()
    for step in range(8):
        entries = {"a": jnp.float32(step)} if step % 3 else {"a": jnp.float32(step), "b": step}
        history.append(step, 0, 0.0, types.MappingProxyType({"metrics": types.MappingProxyType(entries)}))
    assert history.collect("a") == list(range(8)) and history.collect("b") == [0, 3, 6]
    assert history.latest() == {"metrics": {"a": 7.0, "b": 6}}


def test_history_rows_of_fused_groups_split_across_windows(monkeypatch):
    # Groups of 5 steps, each followed by its last step's row, read 2 rows at a time: windows
    # start and end inside groups.
    monkeypatch.setattr(logs_module, "_LAG", 2)
    history = ciclo.history()
    seen = []
    for group in range(4):
        first = 6 * group
        per_step = ciclo.logs().add_metric("loss", jnp.arange(first, first + 6, dtype=jnp.float32))
        per_step.add_output("pair", jnp.arange(first, first + 6).repeat(2).reshape(6, 2))
        history.append_steps(first, 4 * first, 0.5, per_step, 5, 4)
        history.append(first + 5, 4 * first + 20, 0.5, ciclo.logs().add_metric("loss", first + 5.0))
        seen.append(history.latest().metrics.loss)
    assert seen == [5.0, 11.0, 17.0, 23.0]
    assert history.collect("steps", "samples", "loss") == (
        list(range(24)),
        list(range(0, 96, 4)),
        list(range(24)),
    )
    pairs = history.collect("steps", "pair")
    assert pairs[0] == [s for s in range(24) if s % 6 != 5]
    assert [pair.tolist() for pair in pairs[1]] == [[s, s] for s in pairs[0]]
    history.append_steps(24, 96, 0.5, ciclo.logs().add_metric("acc", jnp.arange(3.0)), 2, 4)
    assert history.latest().metrics == {"loss": 23.0, "acc": 1.0}  # a fused row's value, read when shown


@pytest.mark.parametrize("mixed", [False, True], ids=["same entries", "two kinds of rows"])
def test_history_latest_stays_newest_when_older_rows_are_read(mixed):
    history = ciclo.history()
    for step in range(10):
        name = "b" if mixed and step % 2 else "a"
        history.commit(
            ciclo.types.Elapsed(step, 0, 0.0, 0.0), ciclo.logs().add_metric(name, jnp.float32(step))
        )
    expected = {"a": 8.0, "b": 9.0} if mixed else {"a": 9.0}
    assert history.latest().metrics == expected
    assert history[2].metrics == {"a": 2.0}  # copies rows 0 to 2 to the host
    assert history.latest().metrics == expected
    assert history.collect("a")[-1] == expected["a"]


def test_history_latest_keeps_entries_of_older_rows_when_the_newer_log_fewer():
    # latest() notes only the newest of pending rows that log the same entries.
    history = ciclo.history()
    for step in range(10):
        logs = ciclo.logs().add_metric("a", jnp.float32(step))
        history.append(step, 0, 0.0, logs.add_metric("b", step) if step < 5 else logs)
        if step in (4, 9):
            assert history.latest().metrics == {"a": float(step), "b": 4}
    history.append(10, 0, 0.0, ciclo.logs().add_loss("c", 1.0))
    history.append(11, 0, 0.0, ciclo.logs().add_metric("a", 11.0))
    assert history.latest() == {"metrics": {"a": 11.0, "b": 4}, "losses": {"c": 1.0}}


def test_history_rows_with_as_many_entries_under_other_names_keep_their_own(monkeypatch):
    # One window holds rows with one entry each, under other names or collections: counting keys
    # alone would take them for one schema.
    monkeypatch.setattr(logs_module, "_LAG", 2)
    kinds = [("metrics", "a"), ("metrics", "b"), ("losses", "a")]
    history = ciclo.history()
    for step in range(12):
        collection, name = kinds[step % 3]
        history.append(
            step, 2 * step, 0.5 * step, ciclo.logs().add_entry(collection, name, jnp.float32(step))
        )
    assert history.on_host > 3  # rows went through windows
    for step in (0, 1, 2, 10):
        collection, name = kinds[step % 3]
        assert history[step] == {
            collection: {name: step},
            "elapsed": {"steps": step, "samples": 2 * step, "time": 0.5 * step},
        }
    assert history.collect("metrics.b", "samples") == ([1.0, 4.0, 7.0, 10.0], [2, 8, 14, 20])


def test_history_with_max_rows_keeps_each_kept_row_with_its_counts(monkeypatch):
    monkeypatch.setattr(logs_module, "_LAG", 2)
    history = ciclo.history(max_rows=3)
    for step in range(20):
        history.append(step, 10 * step, 0.25 * step, ciclo.logs().add_metric("a", step))
    rows = list(history.host_rows(0, len(history)))
    assert [values for _, values, *_ in rows] == [(step,) for step in range(20 - len(history), 20)]
    assert all(counts == [v, 10 * v, 0.25 * v] for _, (v,), *counts in rows)
    assert history.dropped + len(history) == 20 and history.to_host()["elapsed"][-1] == (19, 190, 4.75)


@pytest.mark.parametrize("name", [123, "", None, ("a",)])
def test_an_entry_name_must_be_a_non_empty_string(name):
    # A number as a name gave CSV a column "123" and made TensorBoard raise a TypeError later.
    with pytest.raises(TypeError, match=r"a log entry's name must be a non-empty string, got .* for metrics"):
        ciclo.logs().add_metric(name, 1.0)
