import datetime

import pytest

import ciclo


def fired(schedule, steps, samples_per_step=0, times=None):
    out = []
    for i, s in enumerate(steps):
        t = times[i] if times is not None else 0.0
        if schedule(ciclo.types.Elapsed(s, s * samples_per_step, t, 0.0)):
            out.append(s)
    return out


def test_every_steps_fires_from_zero():
    assert fired(ciclo.every(2), range(9)) == [0, 2, 4, 6, 8]
    assert fired(ciclo.every(1), range(4)) == [0, 1, 2, 3]


def test_after_every_offsets():
    assert fired(ciclo.after(steps=3).every(steps=5), range(15)) == [3, 8, 13]


def test_after_fires_from_then_on():
    assert fired(ciclo.after(3), range(6)) == [3, 4, 5]
    assert fired(ciclo.after(samples=8), range(5), samples_per_step=4) == [2, 3, 4]


@pytest.mark.parametrize("k", [3, 5, 32])
def test_every_fires_when_a_boundary_is_crossed_in_a_jump(k):
    # Fused execution advances several steps at once: every boundary crossed counts.
    steps = list(range(0, 100, k))
    expected = [s for i, s in enumerate(steps) if i == 0 or s // 10 > steps[i - 1] // 10]
    assert fired(ciclo.every(10), steps) == expected


def test_every_samples_crossing():
    # 32 samples per step, every 100 samples: 0, then the steps crossing 100, 200, ...
    assert fired(ciclo.every(samples=100), range(10), samples_per_step=32) == [0, 4, 7]


def test_every_time():
    times = [0.0, 0.4, 0.9, 1.1, 1.5, 2.3, 2.4]
    assert fired(ciclo.every(time=1.0), range(7), times=times) == [0, 3, 5]
    assert fired(ciclo.every(time=datetime.timedelta(seconds=1)), range(7), times=times) == [0, 3, 5]


def test_every_is_idempotent_for_the_same_elapsed():
    schedule = ciclo.every(3)
    elapsed = ciclo.types.Elapsed(3, 0, 0.0, 0.0)
    schedule(ciclo.types.Elapsed(2, 0, 0.0, 0.0))
    assert schedule(elapsed) and schedule(elapsed)


def test_every_restarts_with_a_new_run():
    schedule = ciclo.every(2)
    assert fired(schedule, range(5)) == [0, 2, 4]
    assert fired(schedule, range(5)) == [0, 2, 4]


def test_every_first_call_mid_run_needs_an_exact_hit():
    assert fired(ciclo.every(4), [5, 6, 7, 8]) == [8]


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (lambda: ciclo.every(0), "every\\(steps=0\\)"),
        (lambda: ciclo.every(-2), "-2"),
        (lambda: ciclo.every(samples=0), "samples=0"),
        (lambda: ciclo.every(time=0), "time=0"),
        (lambda: ciclo.every(), "steps=, samples= or time="),
        (lambda: ciclo.after(steps=2).every(0), "every\\(steps=0\\)"),
    ],
)
def test_every_rejects_bad_intervals(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()


def test_every_rejects_non_int_steps():
    with pytest.raises(TypeError, match="1.5"):
        ciclo.every(1.5)  # type: ignore[arg-type]


def test_combinators():
    assert fired(ciclo.every(2) & ciclo.every(3), range(13)) == [0, 6, 12]
    assert fired(ciclo.every(4) | ciclo.every(6), range(13)) == [0, 4, 6, 8, 12]
    assert fired(~ciclo.every(2), range(6)) == [1, 3, 5]
    assert fired(ciclo.every(2) & (lambda e: e.steps > 3), range(9)) == [4, 6, 8]
    assert fired((lambda e: e.steps < 3) | ciclo.never(), range(6)) == [0, 1, 2]
    assert fired((lambda e: e.steps == 5) & ciclo.always(), range(6)) == [5]


def test_combinators_keep_stateful_schedules_in_step():
    # Both sides are evaluated, so `every` sees every step even when the left side is False.
    schedule = ciclo.never() & ciclo.every(3)
    inner = schedule.parts[1]
    fired(schedule, range(7))
    assert inner(ciclo.types.Elapsed(6, 0, 0.0, 0.0))


def test_combinator_rejects_non_callable():
    with pytest.raises(TypeError, match="42"):
        ciclo.every(1) & 42  # type: ignore[operator]


def test_always_never():
    assert fired(ciclo.always(), range(3)) == [0, 1, 2]
    assert fired(ciclo.never(), range(3)) == []
    assert repr(ciclo.always()) == "always()"


def test_piecewise():
    schedule = ciclo.piecewise(ciclo.every(1), {ciclo.at(4): ciclo.every(3), 10: ciclo.never()})
    assert fired(schedule, range(14)) == [0, 1, 2, 3, 6, 9]


def test_piecewise_rejects_bad_keys():
    with pytest.raises(TypeError, match="piecewise key"):
        ciclo.piecewise(ciclo.every(1), {"soon": ciclo.every(2)})  # type: ignore[dict-item]


def test_reprs():
    assert "Every" in repr(ciclo.every(3))
    assert "After" in repr(ciclo.after(3))
    assert "Piecewise" in repr(ciclo.piecewise(ciclo.every(1), {3: ciclo.every(2)}))
