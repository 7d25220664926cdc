"""Today's model features reach the exports: Q/K/V biases, QK-norm, sliding windows (Megatron-LM flags,
Megatron-Bridge fields), or a note where the framework builds something else."""

from __future__ import annotations

import pytest

from nestplan import api
from nestplan.export import megatron, nemo, torchtitan
from nestplan.export.plan import ExportInput
from nestplan.job import Job
from nestplan.strategy.dims import ParallelDims


def _input(model: str) -> ExportInput:
    dims = ParallelDims(tp=2, sp=True, dp=8)
    return ExportInput(
        api.evaluate_full(model, "dgx-h100", dims, Job(global_batch_size=64, seq_len=4096), devices=16).plan, "test"
    )


@pytest.mark.parametrize(
    "model,flags,absent",
    [
        ("qwen3-8b", {"--qk-layernorm"}, {"--window-size", "--add-qkv-bias"}),
        ("phi3-mini", {"--window-size"}, {"--qk-layernorm"}),
        ("gemma2-9b", set(), {"--window-size"}),
        # the router as costed: a softmax over every expert before the top-k (DeepSeek-V2), sigmoid scores with a
        # per-expert bias (DeepSeek-V3), a softmax over the top-k logits (Mixtral, Megatron-core's default)
        ("deepseek-v2-lite", {"--moe-router-pre-softmax"}, {"--moe-router-score-function"}),
        (
            "deepseek-v3",
            {"--moe-router-score-function", "--moe-router-enable-expert-bias"},
            {"--moe-router-pre-softmax"},
        ),
        ("mixtral-8x7b", set(), {"--moe-router-pre-softmax", "--moe-router-score-function"}),
    ],
)
def test_megatron_flags_follow_the_model(model, flags, absent) -> None:
    emitted, notes = megatron.all_flags(_input(model))
    names = {f for f, _ in emitted}
    assert flags <= names and not absent & names
    if model == "phi3-mini":
        assert dict(emitted)["--window-size"] == "2046,0"  # a query sees itself and the 2046 keys before it
    if model == "gemma2-9b":
        assert any("mixes sliding-window and full-attention layers" in n for n in notes)


def test_megatron_bridge_fields_follow_the_model() -> None:
    fields = dict(nemo.model_fields(_input("phi3-mini").model, _input("phi3-mini").plan))
    assert fields["model.window_size"] == [2046, 0] and fields["model.qk_layernorm"] is False
    fields = dict(nemo.model_fields(_input("qwen3-8b").model, _input("qwen3-8b").plan))
    assert fields["model.window_size"] is None and fields["model.qk_layernorm"] is True


def test_torchtitan_names_what_its_model_builds_otherwise() -> None:
    differences = torchtitan.differences(_input("phi3-mini").model)
    assert differences == ["window (2047, 32): torchtitan builds (None, 0)"]
    qwen3 = _input("qwen3-8b").model
    assert torchtitan.run_model(qwen3) == qwen3  # Qwen3's own model: its query/key norms kept
