import pytest
from support.bars import Clock

from ciclo._src.callbacks import _progress


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(_progress, "perf_counter", fake)
    return fake
