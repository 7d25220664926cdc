"""DeepSeek (multi-head latent attention, node-limited routing, MTP), Llama 4 (interleaved MoE with a
shared expert, chunked attention, L2 QK-norm), gpt-oss (attention sinks, biased experts, alternating
windows) and Falcon (parallel attention and MLP): parsing, published parameter counts, per-layer
FLOPs, activations, round trips, refusals, and the planner on each new catalog model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from nestplan import api
from nestplan.errors import ConfigError
from nestplan.export import megatron, nemo, torchtitan
from nestplan.export.plan import ExportInput
from nestplan.job import Job
from nestplan.model import load_model, parse_config
from nestplan.model import layers as L
from nestplan.model.config import config_dict
from nestplan.model.spec import FFN, Block, Mixer, QKNorm
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute
from tests.unit.cli_helpers import run_cli

NEW_CATALOG = [
    "deepseek-v2-lite",
    "deepseek-v3",
    "kimi-k2",
    "llama4-scout",
    "llama4-maverick",
    "gpt-oss-120b",
    "gpt-oss-20b",
    "falcon-40b",
    "falcon-180b",
]


def deepseek_like(**overrides) -> dict:
    """A small DeepSeek-V3-style config with ``overrides`` on top."""
    base = {
        "model_type": "deepseek_v3",
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 1000,
        "n_routed_experts": 16,
        "num_experts_per_tok": 4,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "q_lora_rank": 96,
        "kv_lora_rank": 32,
        "qk_rope_head_dim": 16,
        "qk_nope_head_dim": 32,
        "v_head_dim": 24,
        "n_group": 4,
        "topk_group": 2,
    }
    return base | overrides


# ---------------------------------------------------------------- published parameter counts


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("deepseek-v3", 671e9),  # DeepSeek-V3 report (arXiv 2412.19437) abstract: "671B total parameters"
        ("deepseek-v2-lite", 15.7e9),  # DeepSeek-V2 (arXiv 2405.04434) appendix B: "15.7B total parameters"
        ("llama4-maverick", 400e9),  # meta-llama/Llama-4-Maverick-17B-128E model card: 400B total
        ("gpt-oss-120b", 116.83e9),  # OpenAI gpt-oss model card (arXiv 2508.10925) Table 1: 116.83B total
        ("gpt-oss-20b", 20.91e9),  # same table: 20.91B total
    ],
)
def test_total_parameters_match_the_published_figure(name, published):
    assert L.total_params(load_model(name)) == pytest.approx(published, rel=0.005)


@pytest.mark.parametrize(("name", "published"), [("gpt-oss-120b", 5.13e9), ("gpt-oss-20b", 3.61e9)])
def test_gpt_oss_active_parameters(name, published):
    """OpenAI gpt-oss model card Table 1: 5.13B and 3.61B active parameters per token, which count the
    unembedding but not the embedding table: nestplan's convention (``active_params``)."""
    assert L.active_params(load_model(name)) == pytest.approx(published, rel=0.005)


def test_deepseek_v3_mtp_module_makes_the_published_checkpoint_size():
    """Hugging Face deepseek-ai/DeepSeek-V3 model card: 685B = 671B main model + 14B MTP module; the
    checkpoint stores the MTP module with its own embedding and head copies (DeepSeek-V3 report
    section 2.2 shares them with the main model in training)."""
    spec = load_model("deepseek-v3")
    assert spec.mtp_layers == 1
    with_copies = L.mtp_params(spec, own_embedding_and_head=True)
    assert L.total_params(spec) + with_copies == pytest.approx(685e9, rel=0.005)
    assert with_copies == pytest.approx(14e9, rel=0.05)  # "14B", two significant figures
    shared = L.mtp_params(spec, own_embedding_and_head=False)
    # the copies: embed_tokens and shared_head's vocabulary projection (shared_head.norm is the module's own)
    assert with_copies - shared == L.embedding_params(spec) + spec.vocab_size * spec.hidden_size
    assert shared == 2 * spec.hidden_size**2 + 3 * spec.hidden_size + L.block_params(spec, 60).total
    assert L.mtp_params(load_model("kimi-k2"), True) == 0


@pytest.mark.parametrize(
    ("name", "published", "unit"),
    [
        ("deepseek-v3", 37, 1e9),  # DeepSeek-V3 report abstract: "37B activated for each token"
        ("kimi-k2", 32, 1e9),  # moonshotai/Kimi-K2-Instruct model card: 32B activated parameters
        ("kimi-k2", None, 1e12),  # same card: 1T total parameters (see below)
    ],
)
def test_figures_published_to_two_digits_round_to_ours(name, published, unit):
    """Figures published rounded (37B, 32B, 1T) are met as rounded: 36.6B and 31.7B active without the
    input embedding, 1.026T total."""
    spec = load_model(name)
    if published is None:
        assert round(L.total_params(spec) / unit) == 1
    else:
        assert round(L.active_params(spec) / unit) == published


def test_deepseek_v2_lite_active_parameters():
    """DeepSeek-V2 (arXiv 2405.04434) appendix B: DeepSeek-V2-Lite has "2.4B activated parameters"; 2.45B
    counted without the input embedding (2.1% above the figure as printed; 2.66B, 11% above, with it)."""
    assert L.active_params(load_model("deepseek-v2-lite")) == pytest.approx(2.4e9, rel=0.025)


def test_llama4_active_and_text_parameters():
    """Llama 4 model cards: 17B active for Scout and Maverick (rounded), a figure that counts the input
    embedding (16.1B without it, nestplan's convention); Scout's 109B total includes the vision encoder,
    which nestplan does not count (the language model alone is 107.8B)."""
    for name in ("llama4-scout", "llama4-maverick"):
        spec = load_model(name)
        assert round(L.active_params(spec) / 1e9) == 16
        assert round((L.active_params(spec) + L.embedding_params(spec)) / 1e9) == 17
    assert 107e9 < L.total_params(load_model("llama4-scout")) < 109e9


@pytest.mark.parametrize(("name", "published"), [("falcon-40b", 41.8e9), ("falcon-180b", 180e9)])
def test_falcon_parameters_as_the_checkpoint_stores_them(name, published):
    """Hugging Face tiiuae/falcon-40b: 41.8B parameters, tiiuae/falcon-180B: 180B; the checkpoints store
    lm_head.weight beside the word embeddings it is tied to, so the figures count the vocabulary
    projection twice (total_params counts a tied projection once)."""
    spec = load_model(name)
    assert spec.tied_embeddings
    stored = L.total_params(spec) + spec.vocab_size * spec.hidden_size
    assert stored == pytest.approx(published, rel=0.005)


# ---------------------------------------------------------------- DeepSeek: MLA and routed experts


def test_deepseek_v3_reads_latent_attention_and_its_moe_layout():
    spec = load_model("deepseek-v3")
    assert spec.is_mla and (spec.q_lora_rank, spec.kv_lora_rank, spec.qk_rope_head_dim) == (1536, 512, 64)
    assert spec.head_dim == 192 and spec.value_head_dim == 128 and spec.num_kv_heads == 128
    assert spec.rotary_fraction == pytest.approx(64 / 192)
    assert spec.moe_layers == tuple(range(3, 61)) and spec.ffn_hidden_size == 18432
    assert (spec.num_experts, spec.experts_per_token, spec.num_shared_experts) == (256, 8, 1)
    assert spec.shared_expert_ffn_hidden_size == 2048
    assert (spec.routing_groups, spec.routing_groups_per_token) == (8, 4) and spec.router_bias
    lite = load_model("deepseek-v2-lite")
    assert lite.q_lora_rank == 0 and lite.moe_layers == tuple(range(1, 27)) and lite.num_shared_experts == 2
    assert (lite.routing_groups, lite.routing_groups_per_token) == (1, 1) and not lite.router_bias


def test_mla_parameters_by_hand():
    spec = parse_config(deepseek_like(), "d")
    h, a = 256, 4
    q = 256 * 96 + 96 + 96 * a * 48  # q_a_proj, q_a_layernorm, q_b_proj
    kv = h * (32 + 16) + 32 + 32 * a * (32 + 24)  # kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj
    attention = q + kv + a * 24 * h + h  # o_proj, input_layernorm
    assert L.attention_params(spec) == attention
    no_latent = parse_config(deepseek_like(q_lora_rank=None), "d")
    assert L.attention_params(no_latent) == h * a * 48 + kv + a * 24 * h + h
    moe = L.block_params(spec, 1)
    assert moe.expert == 16 * 3 * h * 64
    assert moe.dense == attention + h + (h + 1) * 16 + 3 * h * 64  # post-norm, router + correction bias, shared


def test_mla_gemms_per_device_under_tensor_and_sequence_parallelism():
    """Megatron-core MLASelfAttention: down-projections replicated over tp on each rank's own tokens,
    up-projections and o_proj split over the heads."""
    spec = load_model("deepseek-v3")
    shard = L.Shard(tp=8, sp=True, seq_len=4096)
    T = 4096
    gemms = L.block_gemms(spec, 0, shard)
    q_up, out, _, _, q_down, kv_down, kv_up = gemms
    assert (q_up.m, q_up.n, q_up.k, q_up.gathered) == (T, 16 * 192, 1536, L.COLUMN)
    assert (out.m, out.n, out.k, out.gathered) == (T, 7168, 16 * 128, L.ROW)
    assert (q_down.m, q_down.n, q_down.k, q_down.gathered) == (T / 8, 1536, 7168, "")
    assert (kv_down.m, kv_down.n, kv_down.k) == (T / 8, 576, 7168)
    assert (kv_up.m, kv_up.n, kv_up.k, kv_up.gathered) == (T, 16 * 256, 512, L.COLUMN)
    core = L.attention_core_gemms(spec, shard, 0)
    assert (core[0].k, core[1].n, core[0].count) == (192, 128, 16)


def test_deepseek_v3_moe_layer_flops_by_hand():
    spec = load_model("deepseek-v3")
    h, s, a = 7168, 4096, 128
    per_token = 2 * (h * 1536 + 1536 * a * 192 + h * 576 + 512 * a * 256 + a * 128 * h)  # MLA projections
    per_token += 2 * h * 256 + 9 * 2 * 3 * h * 2048  # router, 8 routed + 1 shared expert
    per_token += 2 * s * a * (192 + 128)  # Q K^T and scores x V over the s keys
    assert L.block_model_flops(spec, 3, s, s) == pytest.approx(s * per_token)


def test_mla_activations_by_hand():
    """Stored per token (no dropout, flash, no recomputation, tp 1): the norm inputs and the attention
    and MLP inputs (4 h), the latents twice (2 (q_lora + kv_lora)), Q, K, V and the output projection's
    input (a (2 d_qk + 2 d_v)), the MLP's up outputs and down input (3 ffn)."""
    spec = load_model("deepseek-v3")
    shard = L.Shard(seq_len=4096)
    h, a = 7168, 128
    per_token = 4 * h + 2 * (1536 + 512) + a * (2 * 192 + 2 * 128) + 3 * 18432
    assert L.block_activation_bytes(spec, 0, shard, Recompute.NONE) == 2 * 4096 * per_token
    sp = L.Shard(seq_len=4096, tp=8, sp=True)
    split = 4 * h / 8 + 2 * (1536 + 512) / 8 + a * (2 * 192 + 2 * 128) / 8 + 3 * 18432 / 8
    assert L.block_activation_bytes(spec, 0, sp, Recompute.NONE) == pytest.approx(2 * 4096 * split)


def test_deepseek_blocks_keep_dense_and_moe_kinds_apart():
    spec = load_model("deepseek-v3")
    assert {spec.block_kind(i) for i in range(61)} == {Block(Mixer.MLA, FFN.DENSE), Block(Mixer.MLA, FFN.MOE)}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"num_experts_per_tok": 17}, "num_experts_per_tok"),
        ({"topk_group": 5}, "topk_group"),
        ({"n_group": 3}, "n_group"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),  # 2 of 4 groups hold 8 experts
        ({"num_key_value_heads": 2}, "num_key_value_heads"),
        ({"attention_bias": True}, "attention_bias"),
        ({"kv_lora_rank": 0}, "kv_lora_rank"),
    ],
)
def test_inconsistent_deepseek_config_is_an_error_naming_the_field(overrides, field):
    with pytest.raises(ConfigError) as info:
        parse_config(deepseek_like(**overrides), "d")
    assert info.value.field == field and "\n" not in str(info.value)


def test_kimi_k2_config_reads_as_deepseek_v3():
    """moonshotai/Kimi-K2-Instruct's config.json names model_type "kimi_k2" with DeepseekV3ForCausalLM."""
    data = config_dict(load_model("kimi-k2")) | {"model_type": "kimi_k2"}
    assert parse_config(data, "kimi-k2") == load_model("kimi-k2")


def test_deepseek_v2_groups_apply_only_to_group_limited_routing():
    greedy = parse_config(deepseek_like(model_type="deepseek_v2"), "d")
    assert (greedy.routing_groups, greedy.routing_groups_per_token) == (1, 1) and greedy.num_shared_experts == 1
    limited = parse_config(deepseek_like(model_type="deepseek_v2", topk_method="group_limited_greedy"), "d")
    assert (limited.routing_groups, limited.routing_groups_per_token) == (4, 2)


# ---------------------------------------------------------------- Llama 4


def test_llama4_layout():
    scout, maverick = load_model("llama4-scout"), load_model("llama4-maverick")
    assert scout.family == "llama4_text" and scout.moe_layers == tuple(range(48))
    assert maverick.moe_layers == tuple(range(1, 48, 2)) and maverick.ffn_hidden_size == 16384
    for spec in (scout, maverick):
        assert spec.layers_where(lambda block: not block.rope) == tuple(range(3, 48, 4))
        assert spec.layers_where(lambda block: block.chunk is not None) == tuple(i for i in range(48) if (i + 1) % 4)
        assert spec.attention_chunk_size == 8192
        assert (spec.num_shared_experts, spec.shared_expert_ffn_hidden_size, spec.experts_per_token) == (1, 8192, 1)
    assert scout.qk_norm == "l2" and maverick.qk_norm == "none"
    assert scout.has_qk_norm(0) and not scout.has_qk_norm(3)


def test_llama4_l2_qk_norm_has_no_weights_and_stores_its_inputs_on_rotary_layers_only():
    scout = load_model("llama4-scout")
    plain = dataclasses.replace(
        scout, blocks=tuple(dataclasses.replace(block, qk_norm=QKNorm.NONE) for block in scout.blocks)
    )
    assert L.block_params(scout, 0).total == L.block_params(plain, 0).total
    shard = L.Shard(seq_len=8192)
    normed = L.block_activation_bytes(scout, 0, shard, Recompute.NONE)
    assert normed - L.block_activation_bytes(plain, 0, shard, Recompute.NONE) == 2 * 8192 * (5120 + 1024)
    assert L.block_activation_bytes(scout, 3, shard, Recompute.NONE) == L.block_activation_bytes(
        plain, 3, shard, Recompute.NONE
    )


def test_chunked_attention_flops():
    """A query sees the keys of its own chunk up to itself: c / 2 keys on average; a global (NoPE)
    layer sees the causal half of the whole sequence."""
    spec = load_model("llama4-scout")
    s, c = 32768, 8192
    assert L.attention_keys(spec, 0, s) == c and L.attention_keys(spec, 3, s) == s
    assert L.attended_fraction(spec, 0, s) == 0.5
    shard = L.Shard(seq_len=s)
    ratio = L.attention_core_flops(spec, shard, 0) / L.attention_core_flops(spec, shard, 3)
    assert ratio == pytest.approx(c / s)
    # a partial last chunk: 10000 = 8192 + 1808 tokens
    assert L.attended_fraction(spec, 0, 10000) == pytest.approx((8192**2 + 1808**2) / (2 * 10000 * 8192))
    # shorter than a chunk: the causal half of the sequence, as full attention
    assert L.attended_fraction(spec, 0, 4096) == 0.5 and L.attention_keys(spec, 0, 4096) == 4096
    assert {(spec.block_kind(i).chunk, spec.block_kind(i).rope) for i in range(48)} == {(8192, True), (None, False)}


def test_llama4_moe_layer_flops_by_hand():
    spec = load_model("llama4-maverick")
    h, s = 5120, 8192
    per_token = 2 * h * (40 * 128 + 2 * 8 * 128) + 2 * 40 * 128 * h  # QKV, output projection
    per_token += 2 * h * 128 + 2 * 2 * 3 * h * 8192  # router, 1 routed + 1 shared expert
    per_token += 4 * 8192 * 40 * 128  # its chunk of 8192 keys
    assert L.block_model_flops(spec, 1, s, s) == pytest.approx(s * per_token)


def test_llama4_bad_layer_types_and_chunk_null():
    base = {
        "model_type": "llama4_text",
        "hidden_size": 256,
        "intermediate_size": 128,
        "intermediate_size_mlp": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 2,
    }
    spec = parse_config(base | {"attention_chunk_size": None}, "l")
    assert spec.layers_where(lambda block: block.chunk is not None) == () and spec.attention_chunk_size is None
    assert spec.layers_where(lambda block: not block.rope) == (3,)
    assert parse_config(config_dict(spec), "l") == spec
    with pytest.raises(ConfigError) as info:
        parse_config(base | {"layer_types": ["sliding_attention"] * 4}, "l")
    assert info.value.field == "layer_types"
    with pytest.raises(ConfigError) as info:
        parse_config(base | {"num_experts_per_tok": 5}, "l")
    assert info.value.field == "num_experts_per_tok"


# ---------------------------------------------------------------- gpt-oss


def test_gpt_oss_sinks_biases_and_windows():
    spec = load_model("gpt-oss-120b")
    assert spec.attention_sinks and spec.router_bias and spec.linear_bias
    assert spec.sliding_window == 128 and spec.layers_where(lambda block: block.window) == tuple(range(0, 36, 2))
    h, f, e = 2880, 2880, 128
    no_sinks = dataclasses.replace(spec, attention_sinks=False)
    assert L.attention_params(spec) - L.attention_params(no_sinks) == 64
    block = L.block_params(spec, 0)
    assert block.expert == e * (3 * h * f + 2 * f + h)  # gate_up_proj, down_proj and their biases
    attention = h * (64 * 64 + 2 * 8 * 64) + (64 * 64 + 2 * 8 * 64) + 64 * 64 * h + h + 64 + h
    assert block.dense == attention + h + (h + 1) * e  # norms, router with its bias


def test_gpt_oss_layer_flops_by_hand():
    spec = load_model("gpt-oss-120b")
    h, s = 2880, 4096
    projections = 2 * h * (64 * 64 + 2 * 8 * 64) + 2 * 64 * 64 * h + 2 * h * 128 + 4 * 2 * 3 * h * 2880
    assert L.block_model_flops(spec, 0, s, s) == pytest.approx(s * (projections + 4 * 128 * 64 * 64))
    assert L.block_model_flops(spec, 1, s, s) == pytest.approx(s * (projections + 4 * s * 64 * 64))


def test_gpt_oss_without_attention_bias_is_refused():
    data = config_dict(load_model("gpt-oss-20b")) | {"attention_bias": False}
    with pytest.raises(ConfigError) as info:
        parse_config(data, "g")
    assert info.value.field == "attention_bias"


# ---------------------------------------------------------------- Falcon


def test_falcon_parallel_block():
    spec = load_model("falcon-40b")
    assert spec.parallel_block and spec.block_norms == 2 and spec.num_kv_heads == 8 and not spec.gated_mlp
    assert spec.ffn_hidden_size == 4 * 8192 and not spec.linear_bias and spec.norm == "layernorm"
    h, q, kv = 8192, 8192, 8 * 64
    assert L.block_params(spec, 0).total == h * (q + 2 * kv) + q * h + 2 * h * 4 * h + 2 * 2 * h
    s = 2048
    per_token = 2 * h * (q + 2 * kv) + 2 * q * h + 2 * 2 * h * 4 * h + 4 * s * q
    assert L.block_model_flops(spec, 0, s, s) == pytest.approx(s * per_token)


def test_falcon_parallel_block_stores_its_shared_input_once():
    spec = load_model("falcon-40b")
    shard = L.Shard(seq_len=2048)
    sequential = dataclasses.replace(spec, parallel_block=False)
    none = Recompute.NONE
    one_less = L.block_activation_bytes(sequential, 0, shard, none) - L.block_activation_bytes(spec, 0, shard, none)
    assert one_less == 2 * 2048 * 8192  # the block input, read by both norms
    old = {
        "model_type": "falcon",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": 1000,
        "num_kv_heads": 4,
    }  # saved by HF whatever the architecture
    falcon7b = parse_config(old, "f")  # multi-query, one LayerNorm for both branches (HF FalconConfig defaults)
    assert falcon7b.num_kv_heads == 1 and falcon7b.block_norms == 1 and falcon7b.parallel_block
    two = dataclasses.replace(falcon7b, block_norms=2)
    assert L.block_params(two, 0).total - L.block_params(falcon7b, 0).total == 2 * 256
    shard = L.Shard(seq_len=128)
    stored = L.block_activation_bytes(two, 0, shard, none) - L.block_activation_bytes(falcon7b, 0, shard, none)
    assert stored == 2 * 128 * 256  # one norm output fewer
    assert parse_config(config_dict(falcon7b), "f") == falcon7b


def test_falcon_alibi_is_refused():
    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "model_type": "falcon",
                "hidden_size": 256,
                "num_attention_heads": 4,
                "num_hidden_layers": 2,
                "vocab_size": 1000,
                "alibi": True,
            },
            "f",
        )
    assert info.value.field == "alibi"


# ---------------------------------------------------------------- keys other families do not read


@pytest.mark.parametrize(
    "key, value",
    [
        ("n_group", 8),
        ("topk_group", 4),
        ("use_qk_norm", True),
        ("intermediate_size_mlp", 1024),
        ("num_kv_heads", 2),
        ("alibi", True),
    ],
)
def test_new_architecture_keys_are_refused_elsewhere(key, value):
    data = {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "vocab_size": 1000,
        key: value,
    }
    with pytest.raises(ConfigError) as info:
        parse_config(data, "x")
    assert info.value.field == key


# ---------------------------------------------------------------- round trip and the planner


@pytest.mark.parametrize("name", NEW_CATALOG)
def test_round_trip_new_catalog_models(name):
    spec = load_model(name)
    assert parse_config(config_dict(spec), spec.name) == spec


def test_round_trip_group_limited_deepseek_v2():
    spec = parse_config(
        deepseek_like(
            model_type="deepseek_v2", topk_method="group_limited_greedy", moe_layer_freq=2, first_k_dense_replace=2
        ),
        "d",
    )
    assert spec.moe_layers == (2,)
    assert parse_config(config_dict(spec), "d") == spec


EVALUATE = {
    "deepseek-v2-lite": ["--devices", "16", "--ep", "8", "--dp", "2", "--global-batch-size", "128"],
    "deepseek-v3": [
        "--devices",
        "1024",
        "--tp",
        "2",
        "--sp",
        "--pp",
        "16",
        "--layers-per-stage",
        "4x13,3x3",
        "--ep",
        "32",
        "--zero",
        "1",
        "--recompute",
        "full",
        "--global-batch-size",
        "2048",
    ],
    "kimi-k2": [
        "--devices",
        "2048",
        "--tp",
        "2",
        "--sp",
        "--pp",
        "16",
        "--layers-per-stage",
        "4x13,3x3",
        "--ep",
        "64",
        "--zero",
        "1",
        "--recompute",
        "full",
        "--global-batch-size",
        "4096",
    ],
    "llama4-scout": [
        "--devices",
        "128",
        "--tp",
        "2",
        "--sp",
        "--pp",
        "4",
        "--ep",
        "16",
        "--zero",
        "1",
        "--global-batch-size",
        "512",
    ],
    "llama4-maverick": [
        "--devices",
        "512",
        "--tp",
        "2",
        "--sp",
        "--pp",
        "8",
        "--ep",
        "32",
        "--zero",
        "1",
        "--recompute",
        "full",
        "--global-batch-size",
        "1024",
    ],
    "gpt-oss-120b": ["--devices", "64", "--pp", "4", "--ep", "16", "--zero", "1", "--global-batch-size", "512"],
    "gpt-oss-20b": ["--devices", "16", "--ep", "8", "--dp", "2", "--zero", "1", "--global-batch-size", "256"],
    "falcon-40b": ["--devices", "128", "--tp", "4", "--sp", "--pp", "4", "--dp", "8", "--global-batch-size", "1024"],
    "falcon-180b": [
        "--devices",
        "512",
        "--tp",
        "8",
        "--sp",
        "--pp",
        "8",
        "--dp",
        "8",
        "--zero",
        "1",
        "--global-batch-size",
        "2048",
    ],
}


@pytest.mark.parametrize("name", NEW_CATALOG)
def test_evaluate_each_new_model(capsys, name):
    code, out, err = run_cli(
        capsys, ["evaluate", "--model", name, "--cluster", "dgx-h100", "--seq-len", "4096", *EVALUATE[name]]
    )
    assert code == 0, err
    assert "step time" in out


@pytest.mark.parametrize(
    ("name", "devices", "batch"),
    [("deepseek-v2-lite", "64", "512"), ("gpt-oss-20b", "16", "256"), ("falcon-40b", "128", "1024")],
)
def test_plan_small_new_models(capsys, name, devices, batch):
    code, out, err = run_cli(
        capsys,
        [
            "plan",
            "--model",
            name,
            "--cluster",
            "dgx-h100",
            "--devices",
            devices,
            "--global-batch-size",
            batch,
            "--seq-len",
            "4096",
            "--top",
            "1",
        ],
    )
    assert code == 0, err
    assert out.startswith(f"{name} on dgx-h100") and "fits in memory" in out.splitlines()[0]


# ---------------------------------------------------------------- exports


def _export_input(model, dims=None) -> ExportInput:
    dims = dims or ParallelDims(tp=2, sp=True, ep=2, dp=2)
    plan = api.evaluate_full(model, "dgx-h100", dims, Job(global_batch_size=64, seq_len=1024), devices=8).plan
    return ExportInput(plan, "test")


def _pinned(name: str) -> set[str]:
    lines = (Path(megatron.__file__).parent / name).read_text().splitlines()
    return {line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()}


def test_megatron_builds_latent_attention_and_node_limited_routing():
    spec = parse_config(deepseek_like(num_nextn_predict_layers=1), "d")
    flags, _ = megatron.all_flags(_export_input(spec))
    assert {f for f, _ in flags} <= _pinned("megatron_flags.txt")
    values = dict(flags)
    assert "--multi-latent-attention" in values and "--kv-channels" not in values and "--rotary-percent" not in values
    assert (
        values["--q-lora-rank"],
        values["--kv-lora-rank"],
        values["--qk-head-dim"],
        values["--qk-pos-emb-head-dim"],
        values["--v-head-dim"],
    ) == (96, 32, 32, 16, 24)
    assert (values["--moe-router-num-groups"], values["--moe-router-group-topk"]) == (4, 2)
    assert values["--moe-router-score-function"] == "sigmoid" and "--moe-router-enable-expert-bias" in values
    assert values["--moe-layer-freq"] == "[0,1,1,1]" and values["--mtp-num-layers"] == 1
    assert values["--moe-shared-expert-intermediate-size"] == 64
    lite = dict(
        megatron.all_flags(_export_input(parse_config(deepseek_like(q_lora_rank=None, n_group=1, topk_group=1), "d")))[
            0
        ]
    )
    assert "--q-lora-rank" not in lite and "--moe-router-num-groups" not in lite


def test_exports_of_sinks_l2_norm_and_nope_layers():
    oss = config_dict(load_model("gpt-oss-20b")) | {
        "num_hidden_layers": 4,
        "layer_types": None,
        "num_local_experts": 4,
        "hidden_size": 512,
    }
    biased_experts = ParallelDims(tp=2, sp=True, ep=2, etp=1, dp=2)  # Megatron-core: MoE biases need etp 1
    values = dict(megatron.all_flags(_export_input(parse_config(oss, "g"), biased_experts))[0])
    assert values["--softmax-type"] == "learnable" and "--disable-bias-linear" not in values  # biased router
    llama4 = {
        "model_type": "llama4_text",
        "hidden_size": 256,
        "intermediate_size": 128,
        "intermediate_size_mlp": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "attention_chunk_size": None,
    }
    inp = _export_input(parse_config(llama4, "l"))
    values = dict(megatron.all_flags(inp)[0])
    assert "--qk-l2-norm" in values and values["--no-rope-freq"] == "[0,0,0,1]"
    fields = dict(nemo.model_fields(inp.model, inp.plan))
    assert fields["model.qk_l2_norm"] is True and fields["model.no_rope_freq"] == [0, 0, 0, 1]
    assert set(fields) <= _pinned("megatron_bridge_keys.txt")


@pytest.mark.parametrize(
    ("model", "framework", "feature"),
    [
        ("falcon", "megatron", "in parallel"),
        ("falcon", "nemo", "in parallel"),
        ("llama4", "megatron", "chunked local attention"),
        ("llama4", "nemo", "chunked local attention"),
        ("llama4", "torchtitan", "chunked attention"),
    ],
)
def test_frameworks_refuse_what_they_cannot_build(model, framework, feature):
    small = {
        "falcon": {
            "model_type": "falcon",
            "hidden_size": 256,
            "num_attention_heads": 4,
            "num_hidden_layers": 4,
            "vocab_size": 1000,
            "new_decoder_architecture": True,
            "num_kv_heads": 2,
        },
        "llama4": {
            "model_type": "llama4_text",
            "hidden_size": 256,
            "intermediate_size": 128,
            "intermediate_size_mlp": 512,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 1000,
            "num_local_experts": 4,
            "num_experts_per_tok": 1,
        },
        "deepseek": deepseek_like(),
    }[model]
    spec = parse_config(small, model)
    inp = _export_input(spec, None if spec.is_moe else ParallelDims(tp=2, sp=True, dp=4))
    run = {
        "megatron": megatron.all_flags,
        "nemo": nemo.overrides,
        "torchtitan": lambda i: torchtitan.run_model(i.model),
    }[framework]
    with pytest.raises(ConfigError) as info:
        run(inp)
    assert feature in str(info.value) and "\n" not in str(info.value)
