"""docs/adapter.md: a plain-JAX adapter of about 50 lines, then a Keras 3 one.

Its blocks run in tests/core/test_docs_pages.py (ciclo.testing's check of the
adapter among them); the plain-JAX adapter is also a row of the conformance
suite (tests/conformance/adapters/jax.py), and the Keras block's accuracy and
its check by ciclo.testing are in tests/docs_keras.
"""

from __future__ import annotations

from support.docs import DOCS, Session

PAGE = DOCS / "adapter.md"


def test_the_page_has_a_core_adapter_its_checks_and_a_keras_adapter() -> None:
    requirements = [requirement for _, requirement in Session(PAGE).blocks]
    assert requirements == [None, None, None, None, "keras"]
    assert "ciclo.testing.check_adapter(" in Session(PAGE).blocks[2][0]


def test_the_adapter_is_about_50_lines() -> None:
    adapter, _ = Session(PAGE).blocks[0]
    assert len(adapter.strip().splitlines()) <= 55
