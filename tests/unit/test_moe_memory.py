"""An MoE block's saved activations: the formula's terms (model/layers.py: the routed experts', the
router's, the token dispatcher's and the shared experts' keeps, as Megatron-Core's MoE layer keeps
them) one by one, and the whole block against the traced graph (model/trace.py, extra [trace]) for
Mixtral-8x22B, Qwen3-30B-A3B, Qwen1.5-MoE-A2.7B, DeepSeek-V2-Lite, gpt-oss-20b and Llama 4 Scout."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from nestplan import api
from nestplan.catalog import entry_path
from nestplan.model import layers as L
from nestplan.model.config import parse_config
from nestplan.model.layers import Shard
from nestplan.strategy.enums import Recompute

NO_EXTRA = "needs the [trace] extra (torch and transformers): pip install -e '.[trace]'"

# Hugging Face config.json of mistralai/Mixtral-8x22B-v0.1
MIXTRAL_8X22B = {
    "model_type": "mixtral",
    "hidden_size": 6144,
    "num_hidden_layers": 56,
    "num_attention_heads": 48,
    "num_key_value_heads": 8,
    "intermediate_size": 16384,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32768,
    "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1e6,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
}
# Hugging Face config.json of Qwen/Qwen3-30B-A3B
QWEN3_30B_A3B = {
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1e6,
    "tie_word_embeddings": False,
}
# Hugging Face config.json of Qwen/Qwen1.5-MoE-A2.7B
QWEN15_MOE_A27B = {
    "model_type": "qwen2_moe",
    "hidden_size": 2048,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "norm_topk_prob": False,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1e6,
    "tie_word_embeddings": False,
}


def _catalog(name: str) -> dict:
    return json.loads(entry_path("model", name).read_text())


CONFIGS = {
    "mixtral-8x22b": lambda: MIXTRAL_8X22B,
    "qwen3-30b-a3b": lambda: QWEN3_30B_A3B,
    "qwen1.5-moe-a2.7b": lambda: QWEN15_MOE_A27B,
    "deepseek-v2-lite": lambda: _catalog("deepseek-v2-lite"),
    "gpt-oss-20b": lambda: _catalog("gpt-oss-20b"),
    "llama4-scout": lambda: _catalog("llama4-scout"),
}


@pytest.fixture
def trace_extra() -> None:
    """Skips the test where the optional [trace] extra is not installed (CI installs it)."""
    pytest.importorskip("torch", reason=NO_EXTRA)
    pytest.importorskip("transformers", reason=NO_EXTRA)


def _spec(name: str):
    return parse_config(CONFIGS[name](), name)


# ---------------------------------------------------------------- the formula's terms
def test_routed_experts_keep_their_inputs_and_inner_tensors_only() -> None:
    """Mixtral-8x22B at tp 1: each of the T k copies keeps its input (h), the first GEMM's gate and up
    outputs (2 f) and the second GEMM's input (f); the probabilities are applied in the activation, so
    no hidden-sized output is kept to weight (HF's loop keeps one: T k h more)."""
    spec, shard = _spec("mixtral-8x22b"), Shard(seq_len=1024)
    T, k, h, f = 1024, 2, 6144, 16384
    assert L.routed_copies(spec, shard) == T * k
    assert L.routed_expert_activation_bytes(spec, shard) == 2 * T * k * (h + 3 * f)


def test_routed_copies_are_gathered_over_the_expert_tp_ranks() -> None:
    """Under tp 4 with sequence parallelism each rank routes T/4 tokens; the dispatcher all-gathers the
    copies over etp: all T k copies with the experts split four ways (etp = tp), T k / 4 with whole
    experts (etp 1), the FFN's inner bytes the same either way."""
    spec = _spec("mixtral-8x22b")
    T, k, h, f = 1024, 2, 6144, 16384
    split, whole = Shard(tp=4, sp=True, seq_len=T), Shard(tp=4, sp=True, seq_len=T, etp=1)
    assert L.routed_copies(spec, split) == T * k and L.routed_copies(spec, whole) == T * k / 4
    assert L.routed_expert_activation_bytes(spec, split) == 2 * T * k * h + 2 * T * k * 3 * f / 4
    assert L.routed_expert_activation_bytes(spec, whole) == 2 * T * k / 4 * h + 2 * T * k / 4 * 3 * f


def test_router_keeps_fp32_scores_and_int64_indices() -> None:
    """Mixtral (softmax of the top-k logits): the load-balancing loss's fp32 softmax over the E experts,
    the fp32 softmax over the k and the int64 top-k indices: (4 E + 4 k + 8 k) bytes per token."""
    spec, T = _spec("mixtral-8x22b"), 1024
    assert L.router_activation_bytes(spec, Shard(seq_len=T)) == T * (4 * 8 + 4 * 2 + 8 * 2)


def test_router_scoring_all_experts_before_the_top_k_keeps_two_softmaxes() -> None:
    """Qwen1.5-MoE keeps the top-k of a softmax over all 60 experts (norm_topk_prob false: Megatron-Core's
    moe_router_pre_softmax), beside the load-balancing loss's own: 2 x 4 E + 8 k bytes per token, split
    over tp by sequence parallelism."""
    spec, T = _spec("qwen1.5-moe-a2.7b"), 1024
    assert L.router_activation_bytes(spec, Shard(seq_len=T)) == T * (2 * 4 * 60 + 8 * 4)
    assert L.router_activation_bytes(spec, Shard(tp=4, sp=True, seq_len=T)) == T / 4 * (2 * 4 * 60 + 8 * 4)


def test_sigmoid_router_keeps_its_scores_over_all_experts() -> None:
    """DeepSeek-V3's sigmoid router: Megatron-Core takes the sigmoid of every logit before the top-k
    (score_function sigmoid), so it keeps E fp32 scores per token, as a pre-softmax router does."""
    spec, T = api.resolve_model("deepseek-v3"), 1024
    assert (spec.num_experts, spec.experts_per_token) == (256, 8)
    assert L.router_activation_bytes(spec, Shard(seq_len=T)) == T * (2 * 4 * 256 + 8 * 8)


def test_dispatcher_keeps_two_int64_maps_and_the_permuted_probabilities() -> None:
    """Per routed copy: the probabilities' and the tokens' int64 positions (moe_utils.permute; the
    second read again by unpermute) on the local copies, and the permuted bf16 probability the weighted
    activation keeps, gathered with the copies over etp."""
    spec, T, k = _spec("qwen3-30b-a3b"), 1024, 8
    assert L.dispatch_activation_bytes(spec, Shard(seq_len=T)) == T * k * (2 * 8 + 2)
    assert L.dispatch_activation_bytes(spec, Shard(tp=4, sp=True, seq_len=T)) == T * k / 4 * 2 * 8 + T * k * 2


def test_probabilities_on_the_input_keep_the_copies_twice() -> None:
    """Llama 4 (top-1, Megatron-Core moe_apply_probs_on_input): the probability-scaled copy is the first
    GEMM's input and the product keeps the unscaled copy besides; the activation keeps ones in place of
    the probabilities, the product the probabilities themselves."""
    spec, T = api.resolve_model("llama4-scout"), 1024
    h, f = spec.hidden_size, spec.moe_ffn_hidden_size
    assert (spec.experts_per_token, h, f) == (1, 5120, 8192)
    assert L.routed_expert_activation_bytes(spec, Shard(seq_len=T)) == 2 * T * (2 * h + 3 * f)
    assert L.dispatch_activation_bytes(spec, Shard(seq_len=T)) == T * (2 * 8 + 2 * 2)


def test_gated_shared_expert_keeps_its_output_and_the_gate() -> None:
    """Qwen1.5-MoE's sigmoid shared-expert gate multiplies the shared expert's output, so the product keeps
    that output (h) and the gate (1) per token besides the shared MLP's inner 3 x 5632; DeepSeek-V2-Lite's
    two ungated shared experts keep only their inner tensors."""
    T = 1024
    qwen = _spec("qwen1.5-moe-a2.7b")
    assert L.shared_expert_activation_bytes(qwen, Shard(seq_len=T)) == 2 * T * (3 * 5632 + 2048 + 1)
    deepseek = api.resolve_model("deepseek-v2-lite")
    assert deepseek.num_shared_experts == 2 and deepseek.shared_expert_ffn_hidden_size == 1408
    assert L.shared_expert_activation_bytes(deepseek, Shard(seq_len=T)) == 2 * T * 3 * 1408 * 2


# ---------------------------------------------------------------- permutation traffic
def test_permutation_traffic_is_megatron_cores_unfused_permute_and_unpermute() -> None:
    """Mixtral-8x22B, 4096 tokens: the routing map (8 experts a token) transposed, sorted (8 + 2 (1 + 8)
    bytes an entry) and its bf16 probabilities transposed; five int64 position accesses and a bf16
    probability gathered per copy; index_select reads and writes each copy; unpermute reads each copy
    and zeroes, reads and writes each output row (the probabilities already applied by the experts)."""
    from nestplan.cost.compute import moe_permutation_bytes

    spec, T, E, k, h = _spec("mixtral-8x22b"), 4096, 8, 2, 6144
    routing = T * E * (2 + 26 + 4)
    positions = T * k * (5 * 8 + 4)
    tokens = 2 * 2 * T * k * h + 2 * T * k * h + 3 * 2 * T * h
    assert moe_permutation_bytes(spec, Shard(seq_len=T)) == routing + positions + tokens
    # sequence parallelism: each tp rank permutes the copies of its own quarter of the tokens
    split = Shard(tp=4, sp=True, seq_len=T)
    assert moe_permutation_bytes(spec, split) == pytest.approx((routing + positions + tokens) / 4)
    # a capacity factor pads every expert's copies (drop_and_pad): the copies' traffic grows by it
    padded = moe_permutation_bytes(spec, Shard(seq_len=T, capacity=1.5))
    assert padded == pytest.approx(routing + 1.5 * positions + 1.5 * 3 * 2 * T * k * h + 3 * 2 * T * h)


def test_the_block_streams_the_permutation_traffic() -> None:
    """The MoE block's elementwise traffic carries the permutation's: top-4 instead of top-2 adds the
    permutation's growth and the activation's, nothing else (one expert a device: no regrouping)."""
    from nestplan.cost.compute import _elementwise_bytes, moe_permutation_bytes

    spec, shard = _spec("mixtral-8x22b"), Shard(seq_len=4096, ep=8)
    top4 = replace(spec, experts_per_token=4)
    activation = 3 * 2 * 4096 * 2 * spec.moe_ffn_hidden_size  # two more copies through the SwiGLU
    grown = _elementwise_bytes(top4, 0, shard) - _elementwise_bytes(spec, 0, shard)
    assert grown == pytest.approx(moe_permutation_bytes(top4, shard) - moe_permutation_bytes(spec, shard) + activation)


# ---------------------------------------------------------------- against the traced graph
TINY = {
    "model_type": "mixtral",
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 512,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}


def _traced_and_formula(config: dict, seq: int) -> tuple[float, float]:
    from nestplan.model.trace import trace_config

    spec = parse_config(config, "tiny")
    block = trace_config(config, seq_len=seq).blocks[0]
    return block.saved_bytes, L.block_activation_bytes(spec, 0, Shard(seq_len=seq), Recompute.NONE)


@pytest.mark.parametrize("change", [{"num_experts_per_tok": 4}, {"num_local_experts": 16}, {"intermediate_size": 1024}])
def test_each_moe_term_moves_the_trace_as_the_formula(change, trace_extra) -> None:
    """A tiny Mixtral with more copies per token, more experts or wider experts: the traced block's
    saved bytes move by what the formula's MoE terms move by (the attention is unchanged), within 1%:
    the load-balancing loss's per-expert token counts (E numbers a block) are left out."""
    base_traced, base_formula = _traced_and_formula(TINY, 256)
    traced, formula = _traced_and_formula({**TINY, **change}, 256)
    assert traced - base_traced == pytest.approx(formula - base_formula, rel=0.01)


def test_an_expanded_view_spans_its_source(trace_extra) -> None:
    """The unpermute's scatter-add keeps its token rows expanded over the hidden size (stride 0): the
    trace counts the int64 map's bytes, not one per element of the view."""
    import torch

    from nestplan.model.trace import _span

    rows = torch.zeros(64, dtype=torch.int64)
    assert _span(rows.unsqueeze(1).expand(-1, 1024)) == 64 * 8
    assert _span(torch.zeros(4, 8)[:, :2]) == (3 * 8 + 2) * 4


def _hf_deepseek_v2_gate_in_fp32() -> bool:
    """Whether the installed transformers' DeepSeek-V2 MoE computes its router on a float32 copy of the input
    (transformers 5.8 to 5.12, the releases Megatron-Bridge 0.6.2 allows and CI installs)."""
    import inspect

    from transformers.models.deepseek_v2 import modeling_deepseek_v2

    return "hidden_states.type(torch.float32)" in inspect.getsource(modeling_deepseek_v2.DeepseekV2Moe.forward)


@pytest.mark.parametrize(
    "name",
    [
        "mixtral-8x22b",
        pytest.param("qwen3-30b-a3b", marks=pytest.mark.slow),
        pytest.param("qwen1.5-moe-a2.7b", marks=pytest.mark.slow),
        "deepseek-v2-lite",
        pytest.param("gpt-oss-20b", marks=pytest.mark.slow),
        pytest.param("llama4-scout", marks=pytest.mark.slow),
    ],
)
def test_moe_block_saved_bytes_match_the_trace(name, trace_extra) -> None:
    """The formula's saved bytes of every traced MoE block within 5% of the trace (seq 512, tp 1).
    Qwen3-30B-A3B's 128 experts, Qwen1.5-MoE's 60, gpt-oss's and Llama 4's wide blocks take 6-10 s to
    trace: slow."""
    from nestplan.model.trace import trace_config

    if name == "deepseek-v2-lite" and _hf_deepseek_v2_gate_in_fp32():
        pytest.skip(
            "this transformers' DeepseekV2Moe runs its gate on a float32 copy of the input and keeps it for the "
            "backward (T x h x 4 bytes), which Megatron-Core's router, whose saved bytes the formula counts, does "
            "not keep (it routes in the input's dtype unless --moe-router-dtype fp32)"
        )
    spec, seq = _spec(name), 512
    moe = [b for b in trace_config(CONFIGS[name](), seq_len=seq).blocks if spec.is_moe_layer(b.index)]
    assert moe, name
    for block in moe:
        formula = L.block_activation_bytes(spec, block.index, Shard(seq_len=seq), Recompute.NONE)
        assert block.saved_bytes == pytest.approx(formula, rel=0.05), name


def test_fp8_experts_keep_fp8_inputs() -> None:
    """Under FP8 the grouped GEMMs keep FP8 copies of their inputs (TE v1.11 grouped_linear.py
    ``saved_inputmats``): each copy's input (h) and the second GEMM's input (f) take 1 byte, the gate
    and up outputs (2 f) stay in bf16 for the activation's backward."""
    spec = _spec("mixtral-8x22b")
    T, k, h, f = 1024, 2, 6144, 16384
    fp8 = Shard(seq_len=T, fp8_gemms=True)
    assert L.routed_expert_activation_bytes(spec, fp8) == T * k * (h + f) + 2 * T * k * 2 * f


@pytest.mark.parametrize(
    ("name", "all_experts", "on_input", "gate"),
    [
        ("mixtral-8x22b", False, False, False),
        ("qwen3-30b-a3b", False, False, False),
        ("qwen1.5-moe-a2.7b", True, False, True),
        ("deepseek-v2-lite", True, False, False),
        ("gpt-oss-20b", False, False, False),
        ("llama4-scout", True, True, False),
    ],
)
def test_routing_facts_are_read_with_the_family(name, all_experts, on_input, gate) -> None:
    """How each family's router scores, where its probabilities apply and whether a gate scales its shared
    experts are ModelSpec fields the config reader sets (HF modeling_<family>'s MoE block)."""
    spec = _spec(name)
    assert (spec.router_scores_all_experts, spec.moe_probs_on_input, spec.shared_expert_gate) == (
        all_experts,
        on_input,
        gate,
    )
