"""docs/frameworks/flax_linen.md and flax_nnx.md run as written, in tests(flax) where flax is installed."""

from __future__ import annotations

import flax.linen as nn
from flax import nnx
from support.framework_pages import run_page


def test_the_linen_page_trains_and_gives_the_variables_back(tmp_path) -> None:
    namespace = run_page("flax_linen", tmp_path)
    assert isinstance(namespace["best"].adapter.module, nn.Module)
    assert namespace["test_accuracy"] > 0.9
    assert set(namespace["variables"]) == {"params", "batch_stats"}


def test_the_nnx_page_trains_and_gives_the_module_back(tmp_path) -> None:
    namespace = run_page("flax_nnx", tmp_path)
    assert namespace["test_accuracy"] > 0.9
    assert isinstance(namespace["model"], nnx.Module)
