"""docs/frameworks/keras.md runs as written where keras is installed (the conformance session)."""

from __future__ import annotations

import jax
from support.framework_pages import run_page


def test_the_page_trains_and_gives_the_keras_model_back(tmp_path) -> None:
    # Keras adds biases with implicit rank promotion, which the test suite otherwise forbids.
    namespace = run_page("keras", tmp_path, jax.numpy_rank_promotion("allow"))
    assert namespace["test_accuracy"] > 0.9
    assert type(namespace["trained"]).__name__ == "Sequential"
