"""docs/logging.md, "Logging and monitoring": every runnable block runs, and prints what the page shows."""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Iterator

import pytest
from support.docs import DOCS, Session

PAGE = DOCS / "logging.md"
_OUTPUT = re.compile(r"^```python\n.*?^```\n\n```text\n(?P<text>.*?)^```$", re.DOTALL | re.MULTILINE)


# The loggers' sections; the sections other features added to the page are run, and checked by their tests.
LOGGER_SECTIONS = (
    "How loggers work",
    "CSV:",
    "TensorBoard:",
    "Weights & Biases:",
    "MLflow:",
    "clu metric writers:",
)


def shown_outputs() -> dict[str, str]:
    """The ```text block right after a python block of the loggers' sections, by that block's code."""
    text = PAGE.read_text(encoding="utf-8")
    shown = {}
    for match in _OUTPUT.finditer(text):
        headings = re.findall(r"^## (.*)$", text[: match.start()], re.MULTILINE)
        if not headings or not headings[-1].startswith(LOGGER_SECTIONS):
            continue
        code = match.group(0).split("```python\n", 1)[1].split("\n```", 1)[0] + "\n"
        shown[code] = match["text"]
    return shown


@pytest.fixture
def offline(tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", os.fspath(tmp_path))
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.chdir(tmp_path)
    yield


def test_the_page_runs_and_prints_what_it_shows(offline: None) -> None:
    session = Session(PAGE)
    shown = shown_outputs()
    assert len(session.blocks) >= 8
    checked = 0
    for index, (code, _) in enumerate(session.blocks):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            session.run_upto(index)
        if code in shown:
            assert out.getvalue() == shown[code], f"block {index} printed {out.getvalue()!r}"
            checked += 1
    assert checked >= 8
