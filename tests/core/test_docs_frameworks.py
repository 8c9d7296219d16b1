"""The python blocks of docs/frameworks.md that need only ciclo-core run as written, in page order.

The Keras block runs in tests/docs_keras, where keras is installed.
"""

from __future__ import annotations

import pytest
from support.docs import DOCS, Session

PAGE = DOCS / "frameworks.md"
CORE_BLOCKS = [i for i, (_, requirement) in enumerate(Session(PAGE).blocks) if requirement is None]


@pytest.fixture(scope="module")
def session() -> Session:
    return Session(PAGE)


def test_the_page_has_a_core_adapter_and_a_keras_adapter() -> None:
    requirements = [requirement for _, requirement in Session(PAGE).blocks]
    assert requirements == [None, None, "keras"]


@pytest.mark.parametrize("index", CORE_BLOCKS)
def test_block_runs(session: Session, index: int) -> None:
    session.run_upto(index)
    assert session.done == index + 1


def test_the_adapter_is_about_50_lines(session: Session) -> None:
    adapter, _ = session.blocks[0]
    assert len(adapter.strip().splitlines()) <= 55
