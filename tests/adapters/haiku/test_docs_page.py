"""docs/frameworks/haiku.md runs as written, in tests(haiku) where haiku is installed."""

from __future__ import annotations

import jax
from support.framework_pages import run_page


def test_the_page_trains_and_gives_params_and_state_back(tmp_path) -> None:
    # hk.BatchNorm (`decay**counter`) and hk.dropout (a bool mask times float32) need standard promotion.
    namespace = run_page("haiku", tmp_path, jax.numpy_dtype_promotion("standard"))
    assert namespace["test_accuracy"] > 0.9
    assert sorted(namespace["haiku_state"]) == ["batch_norm/~/mean_ema", "batch_norm/~/var_ema"]
