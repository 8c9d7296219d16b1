"""The public surface: sorted, resolvable, typed, importable without frameworks."""

import importlib.metadata
import re
from typing import Any

import pytest
from support.optional import optional

import ciclo


def test_version_matches_distribution():
    assert ciclo.__version__ == importlib.metadata.version("ciclo-core")


def test_py_typed_is_shipped():
    files = importlib.metadata.files("ciclo-core") or []
    assert any(str(f).endswith("ciclo/py.typed") for f in files)


def test_builtins_satisfy_their_protocols():
    callbacks = [
        ciclo.noop,
        ciclo.inner_loop(lambda s: (s, ciclo.history(), ciclo.types.Elapsed.create())),
        ciclo.early_stopping("loss"),
        ciclo.keras_bar(total=10),
    ]
    for callback in callbacks:
        assert isinstance(callback, ciclo.types.LoopCallback), callback
    schedules: list[ciclo.types.Schedule] = [ciclo.every(1), ciclo.after(2), ciclo.always(), ciclo.never()]
    assert all(callable(schedule) for schedule in schedules)


def test_named_schedules_are_their_names():
    assert ciclo.on_train_step == "on_train_step"
    assert ciclo.on_epoch_end == "on_epoch_end"
    assert ciclo.hooks.on_predict_step == "on_predict_step"


# Every public namespace: ciclo's, and the adapters' where installed.
NAMESPACES = [ciclo.hooks, ciclo.managed, ciclo.metrics, ciclo.strategies, ciclo.testing, ciclo.types]
ADAPTERS = [module for name in ("ciclo_flax", "ciclo_haiku", "ciclo_equinox") if (module := optional(name))]
PUBLIC = [ciclo, *NAMESPACES, *ADAPTERS]
# The only names reachable on a namespace without being in its `__all__`: ciclo 0.1.9's names that moved
# (a DeprecationWarning names their home) and the adapters' `create_*_state`, which `ciclo` finds by
# entry point (group "ciclo.frameworks"; their home is their adapter package).
DEPRECATED = {
    **dict.fromkeys(("Elapsed", "History", "LoopState", "Logs", "Period"), "types"),
    **dict.fromkeys(
        ("DataParallel", "Eager", "JIT", "Strategy", "get_strategy", "register_strategy"), "strategies"
    ),
}


@pytest.mark.parametrize("module", PUBLIC, ids=lambda module: module.__name__)
def test_all_is_sorted_unique_and_resolves(module):
    assert module.__all__ == sorted(module.__all__)
    assert len(set(module.__all__)) == len(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None, name


@pytest.mark.parametrize("module", PUBLIC, ids=lambda module: module.__name__)
def test_a_namespace_reaches_only_what_its_all_lists(module):
    extra = {name for name in vars(module) if not name.startswith("_")} - set(module.__all__)
    if module is ciclo:  # what `ciclo.__getattr__` resolved by entry point stays in `vars(ciclo)`
        extra = {name for name in extra if not re.fullmatch(r"create_\w+_state", name)}
    assert extra == set()


def test_each_name_has_one_home():
    homes: dict[str, list[str]] = {}
    for module in PUBLIC:
        for name in module.__all__:
            if name != "__version__":  # each package's own version
                homes.setdefault(name, []).append(module.__name__)
    assert {name: where for name, where in homes.items() if len(where) > 1} == {}


HOOKS_OF_0_1 = {
    *("on_epoch_end", "on_reset_step", "on_train_begin", "on_train_end", "on_train_step"),
    *("on_train_batch_begin", "on_train_batch_end", "on_test_begin", "on_test_end", "on_test_step"),
    *("on_test_batch_begin", "on_test_batch_end"),
}


def test_ciclo_0_1_hook_names_live_on_ciclo_and_the_others_in_hooks():
    # The seeds (0.1's README and guide) write `ciclo.on_train_step`: 0.1's home is their one home.
    assert len(HOOKS_OF_0_1) == 12
    for name in HOOKS_OF_0_1:
        assert getattr(ciclo, name) == name and name in ciclo.__all__
        with pytest.raises(AttributeError):
            getattr(ciclo.hooks, name)
    assert {name for name in ciclo.__all__ if name.startswith("on_")} == HOOKS_OF_0_1
    assert {name for name in ciclo.hooks.__all__ if name.startswith("on_")} == {
        f"on_predict_{when}" for when in ("begin", "end", "step", "batch_begin", "batch_end")
    }
    # The state methods' names are the methods': `train_step` is the managed decorator's name only.
    for name in ("train_step", "test_step", "predict_step", "reset_step"):
        assert name in ciclo.hooks.TRAIN + ciclo.hooks.TEST + ciclo.hooks.PREDICT
        with pytest.raises(AttributeError):
            getattr(ciclo.hooks, name)
    assert callable(ciclo.managed.train_step)


def test_the_surface_is_small_and_exports_each_object_once():
    assert len(ciclo.__all__) <= 72  # 70 until issue 49 asked for ciclo.population, prune and optuna_trials
    homes: dict[int, list[str]] = {}
    for module in PUBLIC:
        for name in module.__all__:
            value = getattr(module, name)
            # ciclo.types.State and Batch are both typing.Any: two names for documentation's sake.
            if name != "__version__" and value is not Any:
                homes.setdefault(id(value), []).append(f"{module.__name__}.{name}")
    assert [where for where in homes.values() if len(where) > 1] == []


def test_ciclo_exports_what_you_call_and_types_what_you_annotate_with():
    classes = [name for name in ciclo.__all__ if isinstance(getattr(ciclo, name), type)]
    # The one class you subclass, and the settings of skip_spikes= that issue 48 names ciclo.SpikeGuard.
    assert classes == ["Callback", "SpikeGuard"]
    assert not [
        name
        for name in ciclo.types.__all__
        if callable(getattr(ciclo.types, name))
        and not isinstance(getattr(ciclo.types, name), type)
        and not hasattr(getattr(ciclo.types, name), "__origin__")
    ]


@pytest.mark.parametrize(("old", "namespace"), sorted(DEPRECATED.items()))
def test_a_moved_name_still_resolves_with_a_warning_naming_its_place(old, namespace):
    with pytest.warns(DeprecationWarning, match=rf"ciclo\.{old} is now ciclo\.{namespace}\.{old}") as caught:
        assert getattr(ciclo, old) is getattr(getattr(ciclo, namespace), old)
    assert "migration" in str(caught[0].message)


# Exported by ciclo 0.1.9's `ciclo/__init__.py`: only these may resolve as old names.
CICLO_0_1_9 = {
    *("History", "Logs", "LoopState", "Elapsed", "Period", "Strategy", "JIT", "DataParallel", "Eager"),
    *("get_strategy", "register_strategy", "LoopCallbackBase", "LoopElement", "FlaxState", "callback"),
    "inject",
}


@pytest.mark.parametrize("name", ["ModelState", "Metric", "train_step", "on_predict_step", "Checkpoint"])
def test_a_name_that_never_shipped_on_ciclo_is_not_kept_alive(name):
    with pytest.raises(AttributeError):
        getattr(ciclo, name)


def test_every_moved_name_has_a_home():
    assert ciclo._MOVED == DEPRECATED
    assert set(ciclo._MOVED) <= CICLO_0_1_9
    for old, namespace in ciclo._MOVED.items():
        assert old in getattr(ciclo, namespace).__all__, old
        assert old not in ciclo.__all__, old
