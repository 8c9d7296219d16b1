"""docs/frameworks/equinox.md runs as written, in tests(equinox) where equinox is installed."""

from __future__ import annotations

import equinox as eqx
from support.framework_pages import run_page


def test_the_page_trains_and_gives_the_module_and_its_state_back(tmp_path) -> None:
    namespace = run_page("equinox", tmp_path)
    assert namespace["test_accuracy"] > 0.9
    assert isinstance(namespace["model"], eqx.nn.Sequential)
    assert isinstance(namespace["model_state"], eqx.nn.State)
