"""Drawing with matplotlib, imported only when something is drawn: `History.plot` and `new_figure`."""

from __future__ import annotations

import functools
import importlib
import io
import math
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ciclo._src.base.entry_paths import entry_path as _entry_path
from ciclo._src.base.reprs import short

if TYPE_CHECKING:
    from matplotlib.figure import Figure


TEST_SUFFIX = "_test"
"""The suffix `train_loop` gives test entries: `loss_test` is drawn with `loss`."""


def _curves(ordered: Sequence[tuple[str, str]], entries: Sequence[str]) -> list[tuple[str, list[str]]]:
    """The subplots to draw: a title and the keys of the curves drawn in it."""
    present = frozenset(ordered)
    names = [name for _, name in ordered]
    if entries:
        plots = []
        for entry in entries:
            if _entry_path(entry, present) is None:
                raise KeyError(
                    f"{short(entry)} appears in no history entry; present: {[f'{c}.{n}' for c, n in ordered]}"
                )
            test = entry + TEST_SUFFIX
            plots.append((entry, [entry, test] if _entry_path(test, present) is not None else [entry]))
        return plots
    plots = []
    for collection, name in ordered:
        if name.endswith(TEST_SUFFIX) and (collection, name[: -len(TEST_SUFFIX)]) in present:
            continue  # drawn with its train entry
        title = name if names.count(name) == 1 else f"{collection}.{name}"
        keys = [f"{collection}.{name}"]
        if (collection, name + TEST_SUFFIX) in present:
            keys.append(f"{collection}.{name}{TEST_SUFFIX}")
        plots.append((title, keys))
    return plots


def new_figure(user: str, width: float, height: float) -> Figure:
    """An empty figure of `width` x `height` inches, without `pyplot` (no screen; no global state)."""
    try:
        figure_module = importlib.import_module("matplotlib.figure")
        backend = importlib.import_module("matplotlib.backends.backend_agg")
    except ImportError as error:
        raise ImportError(f'{user} needs matplotlib: pip install "ciclo-core[plot]"') from error
    figure: Figure = figure_module.Figure(figsize=(width, height), layout="constrained")
    backend.FigureCanvasAgg(figure)
    # Without pyplot a notebook would show `<Figure size ...>`: IPython shows `_repr_png_` as an image.
    figure._repr_png_ = functools.partial(_png, figure)  # type: ignore[attr-defined]
    return figure


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def plot_history(
    paths: Sequence[tuple[str, str]],
    collect: Callable[[str, str], tuple[list[Any], ...]],
    entries: Sequence[str],
    path: str | os.PathLike[str] | None,
) -> Figure:
    """Draws `entries` (all scalar entries of `paths` when empty) against steps; see `History.plot`.

    A population's entry, collected as `(steps, members)`, is one curve per member, labelled `#i`.
    """
    drawn: list[tuple[str, list[tuple[str, int | None, list[Any], list[Any]]]]] = []
    for title, keys in _curves(paths, entries):
        curves: list[tuple[str, int | None, list[Any], list[Any]]] = []
        for key in keys:
            steps, values = collect("steps", key)
            if isinstance(values, np.ndarray) and values.ndim == 2:  # a population's: (steps, members)
                curves += [(key, member, steps, column.tolist()) for member, column in enumerate(values.T)]
                continue
            if not all(isinstance(value, (int, float)) for value in values):  # host values: no numpy scalars
                if entries:
                    raise ValueError(
                        f"History.plot draws scalar entries (a population's: one value per member); "
                        f"{short(key)} holds arrays"
                    )
                break  # outputs and other arrays: not curves
            curves.append((key, None, steps, [float(value) for value in values]))
        else:
            drawn.append((title, curves))
    if not drawn:
        raise ValueError("History.plot found no scalar entries to draw; the history is empty")
    columns = min(len(drawn), 3)
    rows = math.ceil(len(drawn) / columns)
    figure = new_figure("History.plot", 4.5 * columns, 3.2 * rows)
    for index, (title, curves) in enumerate(drawn):
        axes = figure.add_subplot(rows, columns, index + 1)
        legend = []  # every curve; of a population's, each member's curve of the first entry
        for key, member, steps, values in curves:
            label = key.partition(".")[2] or key
            lines = axes.plot(
                steps,
                values,
                label=label if member is None else f"{label} #{member}",
                # A test entry logged once per epoch is one point: draw it so that it shows.
                marker="o" if key.endswith(TEST_SUFFIX) else None,
                color=None if member is None else f"C{member % 10}",  # a member's curves in its colour
            )
            legend += lines if member is None or key == curves[0][0] else []
        axes.set_title(title)
        axes.set_xlabel("steps")
        axes.grid(alpha=0.3)
        if len(legend) > 1:
            axes.legend(
                handles=legend, fontsize="small" if len(legend) > 4 else None, ncols=1 + len(legend) // 6
            )
    if path is not None:
        figure.savefig(os.fspath(path), dpi=100)
    return figure
