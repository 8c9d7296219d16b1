"""The public surface: sorted, resolvable, typed, importable without frameworks."""

import importlib.metadata
import subprocess
import sys

import ciclo


def test_all_is_sorted_and_resolves():
    assert ciclo.__all__ == sorted(ciclo.__all__)
    for name in ciclo.__all__:
        assert getattr(ciclo, name) is not None, name


def test_version_matches_distribution():
    assert ciclo.__version__ == importlib.metadata.version("ciclo-core")


def test_py_typed_is_shipped():
    files = importlib.metadata.files("ciclo-core") or []
    assert any(str(f).endswith("ciclo/py.typed") for f in files)


def test_import_ciclo_imports_no_framework_nor_orbax():
    code = (
        "import sys, ciclo\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'flax', 'haiku', 'equinox', 'orbax', 'tensorflow', 'torch', 'tqdm', 'clu'})\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_builtins_satisfy_their_protocols():
    callbacks = [
        ciclo.noop,
        ciclo.inner_loop(lambda s: (s, ciclo.history(), ciclo.Elapsed.create())),
        ciclo.early_stopping("loss"),
        ciclo.keras_bar(total=10),
    ]
    for callback in callbacks:
        assert isinstance(callback, ciclo.LoopCallback), callback
    schedules: list[ciclo.Schedule] = [ciclo.every(1), ciclo.after(2), ciclo.always(), ciclo.never()]
    assert all(callable(schedule) for schedule in schedules)


def test_named_schedules_are_their_names():
    assert ciclo.on_train_step == "on_train_step"
    assert ciclo.on_epoch_end == "on_epoch_end"
    assert ciclo.predict_step == "predict_step"
