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
    full = replace(windowed, sliding_window=None, sliding_window_layers=())
    acc = load_accelerator("h100-sxm-80gb")
    shard, s, w = Shard(seq_len=32768, tp=4, sp=True), 32768, 2047
    precision = Precision("bf16", "bf16")
    narrow = block_time(acc, windowed, 0, shard, precision).attention_forward
    wide = block_time(acc, full, 0, shard, precision).attention_forward
    assert narrow / wide == pytest.approx((w * s - w * w / 2) / (s * s / 2), rel=0.05)


def test_windowed_model_steps_faster_at_long_sequences() -> None:
    windowed = load_model("phi3-mini")
    full = replace(windowed, sliding_window=None, sliding_window_layers=())
    dims = ParallelDims(tp=4, sp=True, dp=2)
    job = Job(global_batch_size=64, seq_len=32768)
    fast = api.evaluate_full(windowed, "dgx-h100", dims, job, devices=8).prediction
    slow = api.evaluate_full(full, "dgx-h100", dims, job, devices=8).prediction
    assert fast.step_time_s < 0.8 * slow.step_time_s
    assert fast.model_flops_per_step < slow.model_flops_per_step   # MFU counts the window too
