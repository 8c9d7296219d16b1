"""docs/adapter.md's Keras 3 `stateless_call` adapter: it trains through ciclo and meets ciclo.testing."""

from __future__ import annotations

import jax
from support.docs import DOCS, Session

import ciclo.testing


def test_every_block_of_the_adapter_page_runs() -> None:
    session = Session(DOCS / "adapter.md")
    # Keras adds biases with implicit rank promotion, which the test suite otherwise forbids.
    with jax.numpy_rank_promotion("allow"):
        session.run_upto(len(session.blocks) - 1)
    history = session.namespace["history"]
    assert history.collect("accuracy_test")[-1] > 0.95
    assert type(session.namespace["state"].adapter).__name__ == "KerasAdapter"

    # The page's adapter on a small model of its own, through the kit framework authors run (on the
    # conformance session's 4 devices, data_parallel and fsdp included).
    keras = session.namespace["keras"]
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(3),
        ]
    )
    with jax.numpy_rank_promotion("allow"):
        report = ciclo.testing.check_adapter(
            session.namespace["KerasAdapter"](model),
            inputs=jax.numpy.zeros((1, 4)),
            strategies=("jit", "data_parallel", "fsdp"),
            has_model_state=True,
            skip={
                "precision": "Keras computes in its layers' dtype policy (keras.mixed_precision)",
                "init_key": "Keras seeds its own initialisers when the model is built",
            },
        )
    # Keras draws dropout masks from its own seed generator, in the model state, not from the key.
    assert report.skipped["key_use"].startswith("training gives the same outputs whatever the key")
    assert {"model_state_updates", "learns", "strategies", "accumulation", "ema", "resume"} <= set(
        report.checked
    )
