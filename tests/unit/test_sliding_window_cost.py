"""Sliding-window attention in the cost model: a flash kernel computes the causal part of each
layer's window (model/layers.py attended_fraction), not of the whole sequence."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nestplan import api
from nestplan.cost.compute import Precision, block_time
from nestplan.hardware import load_accelerator
from nestplan.job import Job
from nestplan.model import load_model
from nestplan.model.layers import Shard
from nestplan.strategy.dims import ParallelDims


def test_a_window_shortens_the_attention_core_by_the_keys_it_skips() -> None:
    """Phi-3-mini (window 2047 on every layer) at 32k tokens: the causal window computes
    w s - w^2 / 2 query-key pairs against s^2 / 2 for full causal attention."""
    windowed = load_model("phi3-mini")
    full = replace(windowed, blocks=tuple(replace(block, window=None) for block in windowed.blocks))
    acc = load_accelerator("h100-sxm-80gb")
    shard, s, w = Shard(seq_len=32768, tp=4, sp=True), 32768, 2047
    precision = Precision("bf16", "bf16")
    narrow = block_time(acc, windowed, 0, shard, precision).attention_forward
    wide = block_time(acc, full, 0, shard, precision).attention_forward
    assert narrow / wide == pytest.approx((w * s - w * w / 2) / (s * s / 2), rel=0.05)


def test_windowed_model_steps_faster_at_long_sequences() -> None:
    windowed = load_model("phi3-mini")
    full = replace(windowed, blocks=tuple(replace(block, window=None) for block in windowed.blocks))
    dims = ParallelDims(tp=4, sp=True, dp=2)
    job = Job(global_batch_size=64, seq_len=32768)
    fast = api.evaluate_full(windowed, "dgx-h100", dims, job, devices=8).prediction
    slow = api.evaluate_full(full, "dgx-h100", dims, job, devices=8).prediction
    assert fast.step_time_s < 0.8 * slow.step_time_s
    assert fast.model_flops_per_step < slow.model_flops_per_step  # MFU counts the window too


def test_local_and_global_layers_are_costed_each_as_they_are() -> None:
    """Gemma 2 9B alternates windowed (4,096) and global layers: at 32k tokens its predicted compute
    lies strictly between the same model with every layer global and with every layer windowed, and
    is their average (the blocks are half of each kind), whichever kind its last layer is."""
    mixed = load_model("gemma2-9b")
    assert 0 < len(mixed.layers_where(lambda block: block.window is not None)) < mixed.num_layers
    local = replace(mixed, blocks=tuple(replace(block, window=mixed.sliding_window) for block in mixed.blocks))
    full = replace(mixed, blocks=tuple(replace(block, window=None) for block in mixed.blocks))
    dims = ParallelDims(tp=8, sp=True, dp=1)
    job = Job(global_batch_size=8, seq_len=32768)

    def compute(spec) -> float:
        breakdown = api.evaluate_full(spec, "dgx-h100", dims, job, devices=8).prediction.breakdown_s
        return breakdown["forward_compute"] + breakdown["backward_compute"]

    low, middle, high = compute(local), compute(mixed), compute(full)
    assert low < middle < high
    assert middle == pytest.approx((low + high) / 2, rel=0.02)
