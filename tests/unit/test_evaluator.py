"""The evaluator's invariants: breakdown sums to the step, physical trends hold."""

from __future__ import annotations

import math

import pytest

from nestplan import api
from nestplan.errors import ConfigError
from nestplan.job import Job
from nestplan.strategy.dims import ParallelDims


def _eval(model="llama2-7b", cluster="h100-spine-leaf", devices=None, gbs=256, seq=4096, **dims):
    d = ParallelDims(**dims)
    return api.evaluate(model, cluster, d, Job(global_batch_size=gbs, seq_len=seq), devices=devices)


def test_breakdown_sums_to_step_time() -> None:
    p = _eval(tp=2, pp=4, dp=4, sp=True, recompute="selective")
    assert math.isclose(sum(p.breakdown_s.values()), p.step_time_s, rel_tol=1e-9)
    assert p.tokens_per_s == pytest.approx(256 * 4096 / p.step_time_s)


def test_more_microbatches_shrink_bubble_share() -> None:
    few = _eval(pp=4, dp=1, gbs=8)
    many = _eval(pp=4, dp=1, gbs=256)
    assert few.breakdown_s["pipeline_bubble"] / few.step_time_s > many.breakdown_s["pipeline_bubble"] / many.step_time_s


def test_recompute_trades_time_for_memory() -> None:
    none = _eval(tp=2, pp=2, dp=2, recompute="none")
    full = _eval(tp=2, pp=2, dp=2, recompute="full")
    assert full.step_time_s > none.step_time_s
    assert full.peak_memory_bytes_per_device < none.peak_memory_bytes_per_device


def test_zero_shards_optimizer_state() -> None:
    z0 = _eval(dp=8, zero=0)
    z1 = _eval(dp=8, zero=1)
    z3 = _eval(dp=8, zero=3)
    m0, m1, m3 = (p.stages[0].memory_bytes for p in (z0, z1, z3))
    assert m1["optimizer"] == pytest.approx(m0["optimizer"] / 8)
    assert m3["weights"] == pytest.approx(m0["weights"] / 8)
    assert z3.breakdown_s["zero_comm"] >= 0.0


def test_oversubscribed_dp_is_slower() -> None:
    """The same plan on a cluster whose leaf level is oversubscribed syncs gradients slower."""
    from dataclasses import replace

    cluster = api.resolve_cluster("h100-spine-leaf", 256)
    levels = list(cluster.topology.levels)
    levels[1] = replace(levels[1], oversubscription=8.0)
    slow = replace(cluster, topology=replace(cluster.topology, levels=tuple(levels)))
    dims = ParallelDims(tp=8, dp=32)
    job = Job(global_batch_size=256, seq_len=4096)
    fast_p = api.evaluate("llama2-7b", cluster, dims, job)
    slow_p = api.evaluate("llama2-7b", slow, dims, job)
    assert slow_p.breakdown_s["dp_sync"] > fast_p.breakdown_s["dp_sync"]


def test_gpipe_holds_all_microbatches() -> None:
    one = _eval(pp=4, dp=1, gbs=32, schedule="1f1b")
    gpipe = _eval(pp=4, dp=1, gbs=32, schedule="gpipe")
    one_f_one_b = one.stages[0].memory_bytes["activations"]
    assert gpipe.stages[0].memory_bytes["activations"] == pytest.approx(one_f_one_b * 32 / 4)
    assert one.stages[0].memory_bytes["activations"] > one.stages[-1].memory_bytes["activations"]


def test_interleaving_reduces_bubble() -> None:
    plain = _eval(pp=4, dp=1, gbs=16)
    inter = _eval(pp=4, dp=1, gbs=16, schedule="interleaved", virtual_stages=2)
    assert inter.breakdown_s["pipeline_bubble"] < plain.breakdown_s["pipeline_bubble"]


def test_moe_expert_parallel_all_to_all() -> None:
    p = _eval(model="mixtral-8x7b", tp=1, pp=8, dp=4, ep=4, recompute="full", gbs=1024)
    assert p.breakdown_s["ep_comm"] > 0
    assert p.devices_used == 128


def test_context_parallel_runs() -> None:
    p = _eval(model="llama3-8b", tp=2, cp=4, dp=2, sp=True, seq=16384, gbs=32)
    assert p.step_time_s > 0 and p.breakdown_s["tp_comm"] > 0


def test_plan_that_does_not_fit_is_flagged_not_refused() -> None:
    p = _eval(model="llama3-70b", devices=8, tp=8, gbs=8)
    assert not p.fits
    assert p.memory_excess_bytes == pytest.approx(p.peak_memory_bytes_per_device - p.memory_capacity_bytes)


def test_devices_must_match_the_plan() -> None:
    with pytest.raises(ConfigError, match="multiply to .* = 16, not the 64 devices"):
        _eval(devices=64, tp=4, dp=4)


def test_mfu_is_a_fraction() -> None:
    p = _eval(tp=2, pp=2, dp=4)
    assert 0.05 < p.mfu < 0.8
    assert p.hardware_tflops_per_device >= p.model_tflops_per_device


def test_traced_scales_scale_block_compute_and_activations() -> None:
    """A model calibrated by a trace (api.calibrate) scales block compute and activation memory."""
    from dataclasses import replace

    from nestplan import api
    from nestplan.job import Job
    from nestplan.strategy.dims import ParallelDims

    model = api.resolve_model("llama2-7b")
    dims, job = ParallelDims(tp=2, pp=2, dp=2, sp=True), Job(global_batch_size=16, seq_len=2048)
    base = api.evaluate(model, "dgx-a100", dims, job)
    rows = [{"traced_flops": 2.0, "closed_flops": 1.0, "traced_saved_bytes": 3.0, "closed_saved_bytes": 2.0}]
    scaled = api.evaluate(api.calibrate(model, rows), "dgx-a100", dims, job)
    assert api.calibrate(model, rows) == replace(model, traced_flops_scale=2.0, traced_activation_scale=1.5)
    for a, b in zip(base.stages, scaled.stages):
        assert b.memory_bytes["activations"] > 1.4 * a.memory_bytes["activations"]
        assert b.components_s["forward_compute"] > 1.9 * a.components_s["forward_compute"]
