"""docs/adapter.md's Keras 3 `stateless_call` adapter trains through ciclo, with the page's data."""

from __future__ import annotations

import jax
from support.docs import DOCS, Session


def test_every_block_of_the_adapter_page_runs() -> None:
    session = Session(DOCS / "adapter.md")
    # Keras adds biases with implicit rank promotion, which the test suite otherwise forbids.
    with jax.numpy_rank_promotion("allow"):
        session.run_upto(len(session.blocks) - 1)
    history = session.namespace["history"]
    assert history.collect("accuracy_test")[-1] > 0.95
    assert type(session.namespace["state"].adapter).__name__ == "KerasAdapter"
