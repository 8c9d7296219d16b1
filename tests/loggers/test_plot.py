"""History.plot: matplotlib figures whose lines hold the history's values, saved as real PNGs."""

from __future__ import annotations

import base64
import gc
import json
import os
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo import managed

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def fake_run() -> ciclo.types.History:
    """Train entries every step, test entries every third step, as `train_loop` logs them."""
    history = ciclo.history()
    for step in range(7):
        logs = ciclo.logs().add_loss("loss", 1.0 / (step + 1)).add_metric("accuracy", step / 10)
        logs.add_output("preds", np.zeros((2, 3)))  # not a curve: left out of "all entries"
        if step % 3 == 2:
            logs.add_loss("loss_test", 2.0 / (step + 1)).add_metric("accuracy_test", step / 20)
        history.append(step, 4 * step, 0.0, logs)
    return history


def lines(figure) -> dict[str, dict[str, tuple[list[float], list[float]]]]:
    """Each subplot's title -> its lines' labels -> (x, y)."""
    return {
        axes.get_title(): {
            line.get_label(): (line.get_xdata().tolist(), line.get_ydata().tolist()) for line in axes.lines
        }
        for axes in figure.axes
    }


def test_lines_hold_the_history_values() -> None:
    history = fake_run()
    drawn = lines(history.plot("loss", "accuracy"))

    assert list(drawn) == ["loss", "accuracy"]
    for entry in ("loss", "accuracy"):
        steps, values = history.collect("steps", entry)
        test_steps, test_values = history.collect("steps", f"{entry}_test")
        assert drawn[entry] == {entry: (steps, values), f"{entry}_test": (test_steps, test_values)}
    assert drawn["loss"]["loss_test"] == ([2, 5], [2 / 3, 2 / 6])


def test_no_entries_draws_every_scalar_entry_once() -> None:
    figure = fake_run().plot()
    drawn = lines(figure)

    assert list(drawn) == ["loss", "accuracy"]  # test entries drawn with their train entry; no outputs
    assert set(drawn["accuracy"]) == {"accuracy", "accuracy_test"}
    assert all(axes.get_xlabel() == "steps" for axes in figure.axes)


def test_full_paths_and_entries_without_test_curves() -> None:
    history = ciclo.history()
    for step in range(3):
        history.append(step, step, 0.0, ciclo.logs().add_metric("loss", step).add_loss("loss", 2.0 * step))
    assert lines(history.plot("metrics.loss")) == {"metrics.loss": {"loss": ([0, 1, 2], [0, 1, 2])}}
    # A name in two collections: each subplot is titled with its full path.
    assert list(lines(history.plot())) == ["metrics.loss", "losses.loss"]
    with pytest.raises(ValueError, match="ambiguous"):
        history.plot("loss")


def test_saves_a_png(tmp_path: Path) -> None:
    path = tmp_path / "history.png"
    figure = fake_run().plot("loss", path=path)

    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == tuple(int(x) for x in figure.get_size_inches() * 100)
    # The file is a real image the reader decodes, with something drawn on it.
    import matplotlib.image

    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (height, width)
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 2


def test_a_real_training_run_with_learning_rate(tmp_path: Path) -> None:
    schedule = optax.linear_schedule(0.1, 0.0, transition_steps=4)
    state = managed.ManagedState.create(
        params=jnp.zeros(()), tx=optax.inject_hyperparams(optax.sgd)(learning_rate=schedule)
    )

    @managed.train_step
    def train_step(state, batch):
        return ciclo.logs().add_loss("loss", (state.params - batch) ** 2), state

    _, history, _ = ciclo.loop(state, [jnp.float32(1.0)] * 4, {ciclo.every(1): [train_step]})
    drawn = lines(history.plot(path=tmp_path / "run.png"))

    assert list(drawn) == ["loss", "learning_rate"]
    np.testing.assert_allclose(drawn["learning_rate"]["learning_rate"][1], [0.1, 0.075, 0.05, 0.025])
    assert (tmp_path / "run.png").read_bytes().startswith(PNG_SIGNATURE)


def test_a_population_draws_one_curve_per_member() -> None:
    class State(managed.ManagedState):
        @managed.train_step
        def train_step(self, batch):
            return ciclo.logs().add_loss("loss", jnp.mean((self.params - batch) ** 2)), self

        @managed.step
        def test_step(self, batch):
            return ciclo.logs().add_loss("loss", jnp.mean((self.params - batch) ** 2)), self

    def make_state(learning_rate):
        return State.create(params=jnp.zeros(2), tx=optax.inject_hyperparams(optax.sgd)(learning_rate))

    pop = ciclo.population(make_state, hparams={"learning_rate": [0.0, 0.1, 0.3]})
    batches = [jnp.ones(2)] * 6
    _, history, _ = ciclo.train_loop(pop, batches, test_dataset=lambda: batches[:1], epoch_duration=3, stop=6)
    losses, tested = history.collect("loss"), history.collect("loss_test")  # (steps, 3), (2, 3)
    for figure in (history.plot("loss"), history.plot()):  # no arguments: a population's entries found
        drawn = lines(figure)
        assert list(drawn)[0] == "loss"
        assert list(drawn["loss"]) == [f"loss #{i}" for i in range(3)] + [f"loss_test #{i}" for i in range(3)]
        for i in range(3):
            assert drawn["loss"][f"loss #{i}"] == (list(range(6)), losses[:, i].tolist())
            assert drawn["loss"][f"loss_test #{i}"] == ([2, 5], tested[:, i].tolist())
        colours = {line.get_label(): line.get_color() for line in figure.axes[0].lines}
        assert colours["loss #1"] == colours["loss_test #1"] != colours["loss #2"]  # a member's own colour
        legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
        assert legend == ["loss #0", "loss #1", "loss #2"]  # one entry per member


def test_errors() -> None:
    history = fake_run()
    with pytest.raises(KeyError, match="'lost' appears in no history entry"):
        history.plot("lost")
    with pytest.raises(ValueError, match="'preds' holds arrays"):
        history.plot("preds")
    with pytest.raises(ValueError, match="no scalar entries"):
        ciclo.history().plot()


def test_missing_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r'pip install "ciclo-core\[plot\]"'):
        fake_run().plot()


@pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <function Socket.__del__:pytest.PytestUnraisableExceptionWarning"
)
def test_a_notebook_shows_the_plot_as_an_image_without_magic(tmp_path: Path) -> None:
    # A fresh kernel on this interpreter, with ciclo importable as here, and no `%matplotlib inline`;
    # MPLBACKEND empty, as in a fresh kernel: ipykernel picks its inline backend. The test dependency
    # group installs these (ipykernel brings jupyter_client).
    import nbclient
    import nbformat
    from jupyter_client import kernelspec as kernel_spec
    from jupyter_client import manager as kernel_manager

    spec_dir = tmp_path / "kernels" / "ciclo-test"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "ciclo test",
        "language": "python",
        "env": {"PYTHONPATH": os.pathsep.join(sys.path), "JAX_PLATFORMS": "cpu", "MPLBACKEND": ""},
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    specs = kernel_spec.KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    manager = kernel_manager.AsyncKernelManager(kernel_name="ciclo-test", kernel_spec_manager=specs)
    history = "\n".join(
        [
            "import ciclo",
            "history = ciclo.history()",
            "for step in range(3):",
            "    history.append(step, step, 0.0, ciclo.logs().add_loss('loss', 1.0 / (step + 1)))",
        ]
    )
    notebook = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(history),
            nbformat.v4.new_code_cell("history.plot()"),  # the cell's value
            nbformat.v4.new_code_cell("display(history.plot('loss'))"),
        ]
    )
    nbclient.NotebookClient(notebook, km=manager, timeout=120).execute()
    gc.collect()  # nbclient leaves two of its client's sockets open: they are closed here, warned of, ignored
    for cell in notebook.cells[1:]:
        images = [
            output["data"]["image/png"] for output in cell.outputs if "image/png" in output.get("data", {})
        ]
        assert len(images) == 1, cell.outputs
        assert base64.b64decode(images[0]).startswith(PNG_SIGNATURE)
