"""The run's failure and checkpoint terms (cost/reliability.py) against their closed forms, the plan's
memory model and a small event simulation of failures, checkpoints and restarts."""

from __future__ import annotations

import math
import random

import pytest

from nestplan import api
from nestplan.cost.reliability import (
    StateBytes,
    checkpoint_costs,
    daly_interval,
    goodput,
    job_failure_rate,
    spare_wait_s,
    spares_needed,
    young_interval,
)
from nestplan.cost.run import prediction_state
from nestplan.hardware.facility import DEFAULT_FACILITY, facility_from_dict
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import ZeroStage


def test_rates_add_per_component() -> None:
    f = facility_from_dict({"device_failures_per_day": 1e-3, "host_failures_per_day": 2e-3, "link_failures_per_day": 0})
    assert job_failure_rate(16, 2, f) == pytest.approx((16 * 1e-3 + 2 * 2e-3) / 86400)


def test_default_rates_are_kokolis_mean_split_by_llama3_shares() -> None:
    per_node_day = job_failure_rate(8, 1, DEFAULT_FACILITY) * 86400
    assert per_node_day == pytest.approx((6.50 + 2.34) / 2 / 1000)


def test_young_and_daly_closed_forms() -> None:
    delta, m = 30.0, 3 * 3600.0
    assert young_interval(delta, m) == pytest.approx(math.sqrt(2 * delta * m))
    r = delta / (2 * m)
    assert daly_interval(delta, m) == pytest.approx(math.sqrt(2 * delta * m) * (1 + math.sqrt(r) / 3 + r / 9) - delta)
    assert daly_interval(3 * m, m) == m  # delta >= 2M: checkpoint every M


def test_daly_interval_nearly_maximises_goodput() -> None:
    delta, restart, m = 60.0, 600.0, 2 * 3600.0
    best = daly_interval(delta, m)
    taus = [best * x for x in (0.5, 0.8, 1.25, 2.0)]
    at_best = goodput(best, delta, restart, 1 / m)
    assert all(goodput(t, delta, restart, 1 / m) <= at_best + 1e-4 for t in taus)


def _simulate(interval: float, delta: float, restart: float, mtbi: float, work: float, seed: int) -> float:
    """Wall-clock time to finish ``work`` seconds: segments of interval + delta, exponential failures
    (also during restarts), each failure losing the segment in progress."""
    rng = random.Random(seed)
    clock, done = 0.0, 0.0
    next_failure = rng.expovariate(1 / mtbi)
    while done < work:
        segment = interval + delta
        if clock + segment <= next_failure:
            clock += segment
            done += interval
            continue
        clock = next_failure
        while True:  # restart until one completes without a failure
            next_failure = clock + rng.expovariate(1 / mtbi)
            if clock + restart <= next_failure:
                clock += restart
                break
            clock = next_failure
    return clock


def test_goodput_matches_an_event_simulation_within_two_percent() -> None:
    interval, delta, restart, mtbi = 1800.0, 20.0, 600.0, 3 * 3600.0
    work = 4000 * interval
    simulated = work / _simulate(interval, delta, restart, mtbi, work, seed=7)
    assert simulated == pytest.approx(goodput(interval, delta, restart, 1 / mtbi), rel=0.02)


def test_checkpoint_bytes_are_the_plans_persistent_memory_per_rank() -> None:
    dims = ParallelDims(tp=2, pp=2, dp=2, zero=ZeroStage.OPTIMIZER)
    model, cluster = api.resolve_model("llama3-8b"), api.resolve_cluster("dgx-h100")
    pred = api.evaluate(model, cluster, dims, api.job_for(model, cluster, 16, 2048))
    state = prediction_state(pred)
    ckpt = checkpoint_costs(state, 8, DEFAULT_FACILITY)
    held = max(s.memory_bytes["weights"] + s.memory_bytes["optimizer"] for s in pred.stages)
    assert ckpt.held_bytes_per_rank == pytest.approx(held)
    written = max(s.memory_bytes["weights"] / 2 + s.memory_bytes["optimizer"] for s in pred.stages)
    assert ckpt.written_bytes_per_rank == pytest.approx(written)
    job = sum(s.memory_bytes["weights"] / 2 + s.memory_bytes["optimizer"] for s in pred.stages) * 2 * 2
    assert ckpt.job_bytes == pytest.approx(job)


def test_write_time_is_the_slower_of_host_and_aggregate_storage() -> None:
    state = StateBytes(weights=(8e9,), optimizer=(4e9,), weight_replicas=1, stage_ranks=1024)
    slow_host = facility_from_dict({"storage_write_GBps": 1, "storage_aggregate_write_GBps": 1e6})
    assert checkpoint_costs(state, 8, slow_host).write_s == pytest.approx(8 * 12e9 / 1e9)
    slow_total = facility_from_dict({"storage_write_GBps": 1e6, "storage_aggregate_write_GBps": 100})
    assert checkpoint_costs(state, 8, slow_total).write_s == pytest.approx(1024 * 12e9 / 100e9)
    sync = facility_from_dict({"checkpoint_async": False})
    assert checkpoint_costs(state, 8, sync).blocking_s == checkpoint_costs(state, 8, sync).write_s
    assert checkpoint_costs(state, 8, DEFAULT_FACILITY).blocking_s == pytest.approx(12e9 / 25e9)


def test_spares_cover_repairs_at_the_risk_asked() -> None:
    rate, repair = 10 / 86400, 86400.0  # ten failures a day, a day each in repair: ten hosts out on average
    spares = spares_needed(rate, repair, risk=0.01)
    assert spare_wait_s(rate, repair, spares) <= 0.01 * repair < spare_wait_s(rate, repair, spares - 1)
    assert spare_wait_s(rate, repair, 0) == repair
