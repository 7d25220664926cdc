"""Today's model features reach the exports: Q/K/V biases, QK-norm, sliding windows (Megatron-LM flags,
Megatron-Bridge fields), or a note where the framework builds something else."""

from __future__ import annotations

import pytest

from nestplan import api
from nestplan.export import megatron, nemo, torchtitan
from nestplan.export.plan import ExportInput
from nestplan.job import Job
from nestplan.model.stated import stated_facts
from nestplan.strategy.dims import ParallelDims


def _input(model: str, seq: int = 4096) -> ExportInput:
    dims = ParallelDims(tp=2, sp=True, dp=8)
    return ExportInput(
        api.evaluate_full(model, "dgx-h100", dims, Job(global_batch_size=64, seq_len=seq), devices=16).plan, "test"
    )


@pytest.mark.parametrize(
    "model,flags,absent",
    [
        ("qwen3-8b", {"--qk-layernorm"}, {"--window-size", "--add-qkv-bias"}),
        ("phi3-mini", {"--window-size"}, {"--qk-layernorm"}),
        ("gemma2-9b", {"--window-size", "--window-attn-skip-freq", "--quick-geglu"}, {"--swiglu"}),
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
    if model == "gemma2-9b":  # the window on every other layer (1: windowed), from the first
        assert dict(emitted)["--window-attn-skip-freq"] == "[" + ",".join(["1,0"] * 21) + "]"
        assert not any("mixes sliding-window and full-attention layers" in n for n in notes)
        assert any(n.startswith("activation: ") for n in notes)


@pytest.mark.parametrize(
    "model,expected,noted",
    [
        ("llama3-8b", {"--rotary-base": 500000, "--norm-epsilon": 1e-5, "--make-vocab-size-divisible-by": 128}, set()),
        ("llama3.1-8b", {"--use-rope-scaling": None, "--rope-scaling-factor": 8.0}, set()),
        (
            "gemma3-27b",
            {"--rotary-seq-len-interpolation-factor": 8, "--rotary-base": 1000000},
            {"local_rope_theta", "activation", "block_norms"},
        ),
        (
            "deepseek-v3",
            {"--moe-router-topk-scaling-factor": 2.5, "--rotary-scaling-factor": 40.0, "--mscale-all-dim": 1.0},
            set(),
        ),
        ("kimi-k2", {"--moe-router-topk-scaling-factor": 2.827, "--rotary-base": 50000}, {"rope_scaling"}),
        ("gpt3-175b", {"--make-vocab-size-divisible-by": 1}, {"vocab_size", "activation"}),
        ("nemotron4-15b", {"--squared-relu": None}, set()),
    ],
)
def test_megatron_flags_carry_the_models_facts(model, expected, noted) -> None:
    """RoPE base and scaling, norm epsilon, activation, router scaling and the vocabulary padding that pads
    nothing where tp divides the vocabulary (128256 / 2 = 64128 = 128 x 501); what Megatron-LM builds
    otherwise is noted by the fact's name."""
    emitted, notes = megatron.all_flags(_input(model, 2048 if model.startswith("gpt3") else 4096))
    assert {k: v for k, v in emitted if k in expected} == expected
    assert {n.split(":")[0] for n in notes if n.split(":")[0] in stated_names()} == noted


def stated_names() -> set[str]:
    return set(stated_facts(api.resolve_model("deepseek-v3"))) | {"local_rope_theta"}


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
