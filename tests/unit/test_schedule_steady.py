"""The split-backward schedules' closed form over many microbatches (cost/schedules/steady.py) against the
simulation of every operation, at sizes both reach; and the per-stage counts read off a shorter order."""

import time

import numpy as np
import pytest

from nestplan.cost.schedules import family, steady, warmup_forwards
from nestplan.cost.schedules.operations import probe_microbatches
from nestplan.cost.schedules.steady import split_makespan_busy
from nestplan.cost.schedules.walk import SplitTimes, activation_peak, simulate_operations
from nestplan.strategy.enums import Schedule

SPLIT = [Schedule.ZB_H1, Schedule.ZBV, Schedule.DUALPIPEV]


def _times(schedule: Schedule, p: int, seed: int) -> SplitTimes:
    """Unequal stages and chunks, the overlappable communication a part of each operation."""
    rng = np.random.default_rng(seed)
    v = schedule.chunks
    f = rng.uniform(1.0, 2.0, (p, v))
    b = f * rng.uniform(1.5, 2.5, (p, v))
    return SplitTimes.of_backward(f, b, b * 0.4, f * 0.2, b * 0.1)


@pytest.mark.parametrize("schedule", SPLIT)
@pytest.mark.parametrize("p", [2, 3, 4])
def test_closed_form_is_the_simulation(monkeypatch, schedule, p):
    """Forced onto the fast path (no direct runs), the makespan and busy seconds equal every operation's run."""
    monkeypatch.setattr(steady, "DIRECT_STAGE_MICROBATCHES", 0)
    for seed, m in enumerate([probe_microbatches(p) + 1, 3 * probe_microbatches(p) + 5]):
        times = _times(schedule, p, seed)
        run = simulate_operations(schedule, times, m)
        makespan, busy = split_makespan_busy(schedule, times, m)
        assert makespan == pytest.approx(run.makespan_s, rel=1e-12)
        direct = [float((e - s).sum()) for s, e in zip(run.start_s, run.end_s)]
        assert busy.tolist() == pytest.approx(direct, rel=1e-12)


@pytest.mark.parametrize("schedule", SPLIT)
def test_counts_read_off_the_probe_are_m_s_own(schedule):
    """Warm-up forwards and the activation peak past the probe equal those of m's own order."""
    p, m = 4, 3 * probe_microbatches(4) + 1
    v = schedule.chunks
    for s in range(p):
        kinds = [op.kind for op in schedule_ops(schedule, s, p, m)]
        leading = next(i for i, k in enumerate(kinds) if k != 0)
        assert int(warmup_forwards(schedule, s, p, m, v)) == leading - 1
        acts, kept = np.arange(1.0, v + 1), np.full(v, 0.25)
        walked = _peak_of_order(schedule_ops(schedule, s, p, m), acts, kept)
        assert activation_peak(schedule, s, p, m, acts, kept) == pytest.approx(walked)


def schedule_ops(schedule, s, p, m):
    return family(schedule).operations(s, p, m, schedule.chunks)


def _peak_of_order(ops, acts, kept) -> float:
    """The most bytes held at once, walked operation by operation (F stores, B keeps W's part, W and BW free)."""
    live = peak = 0.0
    for op in ops:
        if op.kind in (0, 4):
            live += acts[op.chunk]
            peak = max(peak, live)
        live -= {1: acts[op.chunk] - kept[op.chunk], 2: kept[op.chunk], 3: acts[op.chunk]}.get(op.kind, 0.0)
        if op.kind == 4:
            live -= acts[op.chunk2]
    return peak


def test_a_million_sequences_evaluate_quickly():
    """The brief's case: zb-h1 over 131,072 microbatches on 2 stages, in well under a second of simulation."""
    times = _times(Schedule.ZB_H1, 2, 7)
    start = time.perf_counter()
    makespan, _ = split_makespan_busy(Schedule.ZB_H1, times, 131_072)
    assert time.perf_counter() - start < 1.0
    probe = probe_microbatches(2)
    short = simulate_operations(Schedule.ZB_H1, times, probe).makespan_s
    longer = simulate_operations(Schedule.ZB_H1, times, probe + 1).makespan_s
    assert makespan == pytest.approx(short + (131_072 - probe) * (longer - short), rel=1e-9)
