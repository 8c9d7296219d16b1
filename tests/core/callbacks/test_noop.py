import ciclo


def test_noop_changes_nothing():
    state, history, elapsed = ciclo.loop({"a": 1}, range(3), {ciclo.every(1): [ciclo.noop]})
    assert state == {"a": 1} and len(history) == 0 and elapsed.steps == 3
    assert isinstance(ciclo.noop, ciclo.types.LoopCallback)
    assert repr(ciclo.noop) == "ciclo.noop"
