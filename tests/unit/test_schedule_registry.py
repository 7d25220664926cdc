"""The schedule registry (cost/schedules): one class per schedule, each the only place that states
its chunks, order, warm-up and variants; the fast paths (the period skip, GPipe's closed form, the
in-flight and live-peak rules) against the one walk over operation lists."""

from __future__ import annotations

import numpy as np
import pytest

from nestplan.cost.memory import in_flight_microbatches, live_activation_peak
from nestplan.cost.schedules import REGISTRY, family, layout_variants, named, stage_operations, variants
from nestplan.cost.schedules.operations import FORWARD
from nestplan.cost.schedules.periodic import simulate
from nestplan.cost.schedules.walk import SplitTimes, activation_peak, simulate_operations
from nestplan.errors import ConfigError
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Schedule

MEGATRON = [(Schedule.ONE_F_ONE_B, 1), (Schedule.GPIPE, 1), (Schedule.INTERLEAVED, 2), (Schedule.INTERLEAVED, 3)]


def test_every_schedule_has_one_class() -> None:
    assert tuple(REGISTRY) == tuple(Schedule)
    assert all(family(s).schedule is s for s in Schedule)
    assert [family(s).chunks for s in Schedule] == [1, 1, None, 1, 2, 2]


def test_one_f_one_b_with_virtual_stages_means_interleaved() -> None:
    """The stated rule the CLI's evaluate applies (--virtual-stages 2 without --schedule)."""
    assert named(Schedule.ONE_F_ONE_B, 2) is Schedule.INTERLEAVED
    assert named(Schedule.ONE_F_ONE_B, 1) is Schedule.ONE_F_ONE_B
    assert named(Schedule.GPIPE, 2) is Schedule.GPIPE  # no interleaved form: ParallelDims refuses it
    with pytest.raises(ConfigError, match="virtual stages 2 need the interleaved schedule, got gpipe"):
        ParallelDims(pp=2, schedule=named(Schedule.GPIPE, 2), virtual_stages=2)


def _times(p: int, v: int, rng) -> tuple[np.ndarray, np.ndarray]:
    return rng.uniform(0.1, 2.0, (p, v)), rng.uniform(0.1, 3.0, (p, v))


@pytest.mark.parametrize("schedule,v", MEGATRON)
def test_fast_paths_equal_the_walk_over_operations(schedule, v) -> None:
    """The period skip (1F1B, interleaved) and GPipe's closed form give the makespan of the general
    walk over the same operations, for random times per stage and chunk."""
    rng = np.random.default_rng(5 + v)
    for _ in range(12):
        p = int(rng.integers(1 if v == 1 else 2, 7))
        m = p * int(rng.integers(1, 12)) if schedule is Schedule.INTERLEAVED else int(rng.integers(1, 80))
        fwd, bwd = _times(p, v, rng)
        fast, _ = simulate(fwd, bwd, m, schedule, v)
        zeros = np.zeros((p, v))
        walked = simulate_operations(schedule, SplitTimes(fwd, bwd, zeros, zeros, zeros), m).makespan_s
        assert fast == pytest.approx(walked, rel=1e-11)


@pytest.mark.parametrize("schedule,v", MEGATRON)
def test_memory_rules_equal_the_walk_over_operations(schedule, v) -> None:
    """in_flight_microbatches and live_activation_peak (the fast paths the evaluator and the search
    use) give the walk's peak: equal chunks and unequal ones."""
    rng = np.random.default_rng(9 + v)
    for p in (1, 2, 3, 4, 8):
        if schedule is Schedule.INTERLEAVED and p == 1:
            continue
        for m in (p, 2 * p, 3 * p) if schedule is Schedule.INTERLEAVED else (1, 2, p, p + 3):
            chunk_bytes = rng.uniform(0.5, 2.0, v)
            for s in range(p):
                walked = activation_peak(schedule, s, p, m, chunk_bytes, np.zeros(v))
                assert live_activation_peak(schedule, s, p, m, chunk_bytes) == pytest.approx(walked, rel=1e-12)
                even = activation_peak(schedule, s, p, m, np.ones(v), np.zeros(v))
                assert in_flight_microbatches(schedule, s, p, m, v) * v == even


@pytest.mark.parametrize("schedule", list(Schedule))
def test_warmup_forwards_are_those_the_order_runs_first(schedule) -> None:
    """Each class's warm-up count w is read off its own operation order: w forwards, then one more
    before anything else (all m v where every forward runs first)."""
    v = family(schedule).chunks or 2
    p, m = 4, 8
    for s in range(p):
        ops = stage_operations(schedule, s, p, m, v)
        first_other = next(i for i, op in enumerate(ops) if op.kind != FORWARD)
        assert min(int(family(schedule).warmup_forwards(s, p, m, v)) + 1, m * v) == first_other


def test_variants_are_legal_and_in_registry_order() -> None:
    """From a 1F1B plan: interleaved on the plan's split (v = 2, 3, 4 where the stages divide), ZB-H1,
    then the V schedules on every split whose stages halve; none without a pipeline or when the
    batch forbids them."""
    dims = ParallelDims(pp=4, dp=2, layers_per_stage=(8, 8, 8, 8))
    splits = [(6, 10, 8, 8), (8, 8, 8, 8)]
    found = variants(Schedule, dims, 32, 2 * 16, splits)
    assert [(d.schedule.value, d.virtual_stages, d.layers_per_stage) for d in found] == [
        ("interleaved", 2, (8, 8, 8, 8)),
        ("interleaved", 4, (8, 8, 8, 8)),
        ("zb-h1", 1, (8, 8, 8, 8)),
        ("zbv", 2, (6, 10, 8, 8)),
        ("zbv", 2, (8, 8, 8, 8)),
        ("dualpipev", 2, (6, 10, 8, 8)),
        ("dualpipev", 2, (8, 8, 8, 8)),
    ]
    few = variants(Schedule, dims, 32, 2 * 6, splits)  # 6 microbatches: not a multiple of pp, under 2 pp
    assert [d.schedule for d in few] == [Schedule.ZB_H1]
    assert variants(Schedule, ParallelDims(dp=2), 32, 16, [(32,)]) == []
    assert variants([Schedule.ZBV], dims, 32, 32, splits)[0].schedule is Schedule.ZBV


def test_layout_variants_balance_the_ends() -> None:
    dims = ParallelDims(pp=4, dp=2)
    found = layout_variants(Schedule, dims, 30, 16)
    assert [(d.virtual_stages, d.layers_per_stage) for d in found] == [
        (2, (3, 4, 4, 4, 4, 4, 4, 3)),
        (4, (1,) + (2,) * 14 + (1,)),
        (8, (0,) + (1,) * 30 + (0,)),
    ]
    assert layout_variants([Schedule.ONE_F_ONE_B], dims, 30, 16) == []
