"""Pipeline schedule simulation (cost/schedules/periodic.py): closed forms where they are exact, the
fast-forward path against the full recording, and the operation order of every schedule."""

from __future__ import annotations

import numpy as np
import pytest

from nestplan.cost.pipeline import pipeline_time
from nestplan.cost.schedules.periodic import BACKWARD, FORWARD, simulate
from nestplan.strategy.enums import Schedule

SCHEDULES = [(Schedule.ONE_F_ONE_B, 1), (Schedule.GPIPE, 1), (Schedule.INTERLEAVED, 2), (Schedule.INTERLEAVED, 4)]


@pytest.mark.parametrize("p,m", [(1, 1), (1, 7), (2, 2), (4, 4), (4, 64), (8, 8), (8, 512)])
@pytest.mark.parametrize("schedule,v", SCHEDULES)
def test_equal_stages_give_the_closed_forms(p, m, schedule, v) -> None:
    """(m + p - 1) C for 1F1B and GPipe (Narayanan et al. 2021; Huang et al. 2019) and
    m C + (p - 1) C / v interleaved (Narayanan et al. SC'21, section 2.2.2)."""
    if schedule is Schedule.INTERLEAVED and m % p:
        pytest.skip("interleaving needs the microbatches in multiples of the stages")
    f, b = 0.3, 0.7
    total, _ = simulate([f] * p, [b] * p, m, schedule, v)
    expected = m * (f + b) + (p - 1) * (f + b) / v
    assert total == pytest.approx(expected, rel=1e-12)


def test_gpipe_is_all_forwards_then_all_backwards() -> None:
    """GPipe with unequal stages: the forwards flow at the slowest forward's pace, then the
    backwards at the slowest backward's: sum F + sum B + (m - 1)(max F + max B) when the slowest
    stage is the last for forwards and the first for backwards (no earlier stage paces them)."""
    fwd, bwd, m = [0.1, 0.2, 0.3, 0.4], [0.8, 0.6, 0.4, 0.2], 16
    total, _ = simulate(fwd, bwd, m, Schedule.GPIPE)
    assert total == pytest.approx(sum(fwd) + sum(bwd) + (m - 1) * (max(fwd) + max(bwd)), rel=1e-12)


def test_one_f_one_b_bounds() -> None:
    """Any 1F1B makespan lies between the busy time of a stage plus the fill before it and the
    drain after it, and (m - 1)(max F + max B) + sum C."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        p, m = int(rng.integers(2, 9)), int(rng.integers(1, 64))
        fwd, bwd = rng.uniform(0.1, 2.0, p), rng.uniform(0.1, 3.0, p)
        total, _ = simulate(fwd, bwd, m, Schedule.ONE_F_ONE_B)
        cyc = fwd + bwd
        lower = max(cyc[:s].sum() + m * cyc[s] for s in range(p))
        upper = (m - 1) * (fwd.max() + bwd.max()) + cyc.sum()
        assert lower * (1 - 1e-12) <= total <= upper * (1 + 1e-12)


@pytest.mark.parametrize("schedule,v", SCHEDULES)
def test_fast_forward_equals_full_recording(schedule, v) -> None:
    """The steady-state skip (max-plus periodicity) gives the makespan of running every operation."""
    rng = np.random.default_rng(11)
    for _ in range(25):
        p = int(rng.integers(1, 9))
        m = p * int(rng.integers(1, 40)) if schedule is Schedule.INTERLEAVED else int(rng.integers(1, 300))
        fwd, bwd = rng.uniform(0.1, 2.0, p), rng.uniform(0.1, 3.0, p)
        fast, none = simulate(fwd, bwd, m, schedule, v)
        full, timeline = simulate(fwd, bwd, m, schedule, v, record=True)
        assert none is None
        assert fast == pytest.approx(full, rel=1e-11)
        assert timeline.makespan_s == full


@pytest.mark.parametrize("schedule,v", SCHEDULES)
def test_timeline_is_a_valid_schedule(schedule, v) -> None:
    """Every (stage, chunk, microbatch) runs its forward and its backward exactly once, a device
    runs one operation at a time, and each starts as soon as its device is free and its input
    has arrived (an independent check of the simulation's recurrence)."""
    p, m = 4, 8
    rng = np.random.default_rng(3)
    fwd, bwd = rng.uniform(0.1, 1.0, p), rng.uniform(0.1, 2.0, p)
    _, t = simulate(fwd, bwd, m, schedule, v, record=True)
    assert len(t.stage) == 2 * p * m * v
    end = {}
    for s, k, c, j, a, e in zip(t.stage, t.kind, t.chunk, t.microbatch, t.start_s, t.end_s):
        key = (int(s), int(k), int(c), int(j))
        assert key not in end
        end[key] = (a, e)
    previous = {}
    for s in range(p):
        mine = np.flatnonzero(t.stage == s)
        order = mine[np.argsort(t.start_s[mine])]
        assert np.all(t.start_s[order[1:]] >= t.end_s[order[:-1]] - 1e-12)
        previous.update({int(b): float(t.end_s[a]) for a, b in zip(order[:-1], order[1:])})
    for n, ((s, k, c, j), (a, _)) in enumerate(end.items()):
        if k == FORWARD:
            dep = (s - 1, FORWARD, c, j) if s else ((p - 1, FORWARD, c - 1, j) if c else None)
        else:
            dep = (s + 1, BACKWARD, c, j) if s < p - 1 else ((0, BACKWARD, c + 1, j) if c < v - 1 else None)
            assert a >= end[(s, FORWARD, c, j)][1] - 1e-12
        if dep is not None:
            assert a >= end[dep][1] - 1e-12
        # as soon as possible: when the device is free and the input has arrived
        assert a == pytest.approx(max(previous.get(n, 0.0), end[dep][1] if dep else 0.0), abs=1e-12)


def test_pipeline_time_bubble_is_the_bottleneck_idle_time() -> None:
    total, bubble, slowest = pipeline_time([0.1, 0.5, 0.2], [0.2, 1.0, 0.4], 10)
    assert slowest == 1
    assert total == pytest.approx(10 * 1.5 + bubble, rel=1e-12)
    assert 0.0 < bubble < total


def test_bad_input_is_a_programmer_error() -> None:
    with pytest.raises(AssertionError):
        simulate([1.0, 1.0], [1.0], 4)
    with pytest.raises(AssertionError):
        simulate([1.0], [1.0], 0)


@pytest.mark.parametrize("schedule,v", SCHEDULES)
def test_billions_of_microbatches_take_bounded_memory(schedule, v) -> None:
    """A step of 2^32 microbatches (a global batch of 2^32 sequences) is simulated in memory that
    does not grow with the microbatches (a ring of recent periods; GPipe in closed form) and
    still gives the closed form of equal stages."""
    import tracemalloc

    p, m, f, b = 8, 2**32, 0.3, 0.7
    tracemalloc.start()
    total, _ = simulate([f] * p, [b] * p, m, schedule, v)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert total == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v, rel=1e-9)
    assert peak < 16 * 2**20


def test_recording_a_huge_timeline_is_refused_in_one_line() -> None:
    from nestplan.errors import ConfigError

    with pytest.raises(ConfigError, match="at most .* are recorded") as err:
        simulate([0.1] * 8, [0.2] * 8, 2**30, Schedule.ONE_F_ONE_B, record=True)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("schedule,v", SCHEDULES + [(Schedule.INTERLEAVED, 8)])
def test_floor_bounds_the_simulation_with_chunk_times(schedule, v) -> None:
    """pipeline_floor (the bottleneck's m C_s plus chunk 0's fill before it and drain after it) lies
    below the simulated makespan for random per-(stage, chunk) times, and equals it for equal stages."""
    from nestplan.cost.pipeline import pipeline_floor

    rng = np.random.default_rng(17 + v)
    for _ in range(40):
        p = int(rng.integers(2, 9))
        m = p * int(rng.integers(1, 6)) if schedule is Schedule.INTERLEAVED else int(rng.integers(1, 40))
        fwd, bwd = rng.uniform(0.1, 2.0, (p, v)), rng.uniform(0.1, 3.0, (p, v))
        total, _ = simulate(fwd, bwd, m, schedule, v)
        assert pipeline_floor(fwd, bwd, m, v) <= total
    equal, _ = simulate([0.3] * 4, [0.7] * 4, 8, schedule, v)
    assert pipeline_floor([0.3] * 4, [0.7] * 4, 8, v) == pytest.approx(equal, rel=1e-8)
