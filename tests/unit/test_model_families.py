"""Today's dense families (qwen3, phi3, olmo2, gemma2, gemma3), sliding-window attention, QKV bias,
QK-norm, multimodal ``text_config`` wrappers, refused architecture keys and parameter counts."""

from __future__ import annotations

import dataclasses

import pytest

from nestplan.errors import ConfigError
from nestplan.model import load_model, parse_config
from nestplan.model import layers as L
from nestplan.model.config import config_dict
from nestplan.model.spec import FFN, Block, Mixer, QKNorm
from nestplan.strategy.enums import Recompute

NEW_CATALOG = ["qwen3-8b", "qwen3-32b", "phi3-mini", "phi3-medium", "olmo2-7b", "gemma2-9b", "gemma2-27b", "gemma3-27b"]


def llama_like(**overrides) -> dict:
    """A small Llama-style config of ``model_type`` llama, with ``overrides`` on top."""
    base = {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
    }
    return base | overrides


# ---------------------------------------------------------------- published parameter counts


# Published totals, from the model cards' "Number of Parameters" and the reports' tables.
@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("qwen3-8b", 8.2e9),  # Qwen/Qwen3-8B model card: "Number of Parameters: 8.2B"
        ("qwen3-32b", 32.8e9),  # Qwen/Qwen3-32B model card: "Number of Parameters: 32.8B"
        ("phi3-medium", 14e9),  # Abdin et al. 2024: "phi-3-medium (14B)"
        ("olmo2-7b", 7.3e9),  # allenai/OLMo-2-1124-7B model card: 7B model, "Parameters 7.3B"
        ("gemma2-9b", 9.24e9),  # Gemma Team 2024 (arXiv 2408.00118) Table 2: 8,324M non-embedding + 918M embedding
        ("gemma2-27b", 27.2e9),  # Gemma Team 2024 Table 2: 26,047M non-embedding + 1,180M embedding
        (
            "gemma3-27b",
            27.016e9,
        ),  # Gemma Team 2025 (arXiv 2503.19786) Table 1: 25,600M non-embedding + 1,416M embedding
    ],
)
def test_parameter_count_matches_the_published_total(name, published):
    spec = load_model(name)
    assert L.total_params(spec) == pytest.approx(published, rel=0.005)
    # dense: every parameter but the input embedding (a tied one counted once, as the head)
    head = spec.vocab_size * spec.hidden_size if spec.tied_embeddings else 0
    assert L.active_params(spec) == L.total_params(spec) - L.embedding_params(spec) + head


def test_phi3_mini_rounds_to_its_published_size():
    """microsoft/Phi-3-mini-4k-instruct model card: "a 3.8B parameters ... model", a figure rounded to
    0.1B (3.821B counted here, 0.55% above 3.8B exactly)."""
    assert round(L.total_params(load_model("phi3-mini")) / 1e8) == 38


@pytest.mark.parametrize(("name", "published"), [("gemma2-9b", 8_324_201_984), ("gemma2-27b", 26_047_480_320)])
def test_gemma2_non_embedding_parameters_exactly(name, published):
    """Gemma Team 2024 (arXiv 2408.00118) Table 2: non-embedding parameters of Gemma 2 9B and 27B
    (the blocks and the final norm)."""
    spec = load_model(name)
    assert L.total_params(spec) - L.embedding_params(spec) == published


def test_active_parameters_of_an_moe_model_count_the_top_k_experts():
    spec = load_model("mixtral-8x7b")
    # Jiang et al. 2024 (arXiv 2401.04088) section 1: 47B parameters, 13B active per token
    # (HF model card and the Mistral announcement: 46.7B total, 12.9B active, a figure that counts the input
    # embedding, which nestplan's active count, as the gpt-oss and DeepSeek cards, leaves out)
    assert L.total_params(spec) == pytest.approx(46.7e9, rel=0.005)
    assert L.active_params(spec) + L.embedding_params(spec) == pytest.approx(12.9e9, rel=0.005)
    experts = sum(L.block_params(spec, i).expert for i in range(spec.num_layers))
    inactive = L.total_params(spec) - L.active_params(spec) - L.embedding_params(spec)
    assert inactive == pytest.approx(experts * 6 / 8)


def test_qkv_bias_is_counted_for_qwen2():
    qwen2 = parse_config(llama_like(model_type="qwen2"), "q")
    llama = parse_config(llama_like(), "l")
    assert qwen2.qkv_bias and not qwen2.linear_bias and not llama.qkv_bias
    per_layer = qwen2.q_channels + 2 * qwen2.kv_channels  # q_proj, k_proj, v_proj biases; o_proj has none
    assert L.total_params(qwen2) - L.total_params(llama) == 4 * per_layer
    # column-parallel biases are split over tp like their weights
    shard = L.Shard(tp=2)
    split = L.block_params_per_device(qwen2, 0, shard).dense - L.block_params_per_device(llama, 0, shard).dense
    assert split == per_layer / 2


@pytest.mark.parametrize(
    ("family", "extra"), [("qwen3", 2 * 32), ("qwen3_moe", 2 * 32), ("olmo2", 256 + 2 * 32), ("gemma3", 2 * 32)]
)
def test_qk_norm_weights(family, extra):
    """Qwen3 (dense and MoE) and Gemma 3 norm each query and key head over head_dim; OLMo 2 over the full
    q and k widths."""
    moe = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128} if family == "qwen3_moe" else {}
    spec = parse_config(llama_like(model_type=family, head_dim=32, **moe), "m")
    plain = dataclasses.replace(
        spec, blocks=tuple(dataclasses.replace(block, qk_norm=QKNorm.NONE) for block in spec.blocks)
    )
    assert L.block_params(spec, 0).total - L.block_params(plain, 0).total == extra
    assert L.block_params_per_device(spec, 0, L.Shard(tp=1)).total == L.block_params(spec, 0).total


def test_gemma_blocks_have_four_norms_and_tied_embeddings():
    spec = load_model("gemma2-9b")
    assert spec.block_norms == 4 and spec.tied_embeddings and spec.gated_mlp and spec.head_dim == 256
    two = dataclasses.replace(spec, block_norms=2)
    assert L.block_params(spec, 0).total - L.block_params(two, 0).total == 2 * spec.hidden_size
    assert L.block_params_per_device(spec, 0, L.Shard(tp=1)).total == L.block_params(spec, 0).total


# ---------------------------------------------------------------- sliding windows


def test_mistral_window_default_null_and_value():
    # HF MistralConfig: sliding_window defaults to 4096; null means full attention
    assert parse_config(llama_like(model_type="mistral"), "m").sliding_window == 4096
    assert parse_config(llama_like(model_type="mistral", sliding_window=None), "m").sliding_window is None
    spec = parse_config(llama_like(model_type="mistral", sliding_window=128), "m")
    assert spec.sliding_window == 128 and spec.layers_where(lambda block: block.window is not None) == (0, 1, 2, 3)


def test_qwen2_window_only_with_use_sliding_window_from_max_window_layers_on():
    assert parse_config(llama_like(model_type="qwen2", sliding_window=64), "q").sliding_window is None
    spec = parse_config(
        llama_like(model_type="qwen2", use_sliding_window=True, sliding_window=64, max_window_layers=2), "q"
    )
    assert spec.sliding_window == 64 and spec.layers_where(lambda block: block.window is not None) == (2, 3)
    assert [spec.window_of(i) for i in range(4)] == [None, None, 64, 64]


def test_gemma_local_global_patterns():
    gemma2 = load_model("gemma2-9b")
    assert gemma2.layers_where(lambda block: block.window is not None) == tuple(range(0, 42, 2))  # local, global, ...
    gemma3 = load_model("gemma3-27b")
    assert gemma3.sliding_window == 1024
    assert [i for i in range(62) if gemma3.window_of(i) is None] == list(range(5, 62, 6))  # 5 local : 1 global
    types = ["sliding_attention", "full_attention", "full_attention", "sliding_attention"]
    spec = parse_config(llama_like(model_type="gemma2", layer_types=types), "g")
    assert spec.layers_where(lambda block: block.window is not None) == (0, 3)


def test_sliding_window_flops_at_long_sequences():
    """Mistral 7B's 4096-token window at 32k tokens: the kernel computes w s - w^2 / 2 of the s^2 / 2
    causal pairs, 0.234 of full attention; model FLOPs count the s x w rectangle, 1/8 of s x s."""
    windowed = load_model("phi3-mini")  # every layer windowed (2047 keys)
    w, s = 2047, 32768
    full = dataclasses.replace(windowed, blocks=tuple(dataclasses.replace(b, window=None) for b in windowed.blocks))
    shard = L.Shard(seq_len=s)
    ratio = L.attention_core_flops(windowed, shard, 0) / L.attention_core_flops(full, shard, 0)
    assert ratio == pytest.approx((w * s - w * w / 2) / (s * s / 2))
    assert ratio < 0.13
    gemms = L.attention_core_gemms(windowed, shard, 0)
    assert gemms[0].n == w and gemms[1].k == w
    core = L.block_model_flops(windowed, 0, s, s) - L.block_model_flops(full, 0, s, s)
    assert core == pytest.approx(-4.0 * s * (s - w) * windowed.q_channels)


def test_window_longer_than_the_sequence_is_full_causal_attention():
    spec = load_model("phi3-mini")
    full = dataclasses.replace(spec, blocks=tuple(dataclasses.replace(b, window=None) for b in spec.blocks))
    shard = L.Shard(seq_len=1024)
    assert L.attention_core_flops(spec, shard, 0) == L.attention_core_flops(full, shard, 0)
    assert L.attended_fraction(full, 0, 1024) == 0.5  # the causal half (cost/compute.py's causal factor)


def test_block_kinds_separate_local_and_global_layers():
    gemma3 = load_model("gemma3-27b")
    local, global_ = Block(window=1024, qk_norm=QKNorm.HEAD), Block(qk_norm=QKNorm.HEAD)
    assert {gemma3.block_kind(i) for i in range(gemma3.num_layers)} == {local, global_}
    mixtral = load_model("mixtral-8x7b")
    assert {mixtral.block_kind(i) for i in range(mixtral.num_layers)} == {Block(Mixer.ATTENTION, FFN.MOE)}


def test_gemma2_global_and_local_layers_differ():
    spec = load_model("gemma2-9b")
    shard = L.Shard(seq_len=8192)
    local, global_ = L.attention_core_flops(spec, shard, 0), L.attention_core_flops(spec, shard, 1)
    assert local / global_ == pytest.approx((4096 * 8192 - 4096**2 / 2) / (8192**2 / 2))  # 0.75
    # flash attention stores no score tensor, and unfused attention stores all s x s scores: windows change nothing
    for recompute in Recompute:
        stored = [
            L.block_activation_bytes(spec, i, dataclasses.replace(shard, flash=f), recompute)
            for i in (0, 1)
            for f in (True, False)
        ]
        assert stored[0] == stored[2] and stored[1] == stored[3]


# ---------------------------------------------------------------- text_config and refused keys


def test_text_config_is_unwrapped():
    spec = load_model("gemma3-27b")
    assert spec.family == "gemma3_text" and spec.hidden_size == 5376 and spec.qk_norm == "head"
    wrapped = {
        "model_type": "llava",
        "vision_config": {"hidden_size": 1024, "num_hidden_layers": 24},
        "text_config": llama_like(),
    }
    assert parse_config(wrapped, "x") == parse_config(llama_like(), "x")


@pytest.mark.parametrize(
    ("data", "key"),
    [
        (llama_like(num_local_experts=8), "num_local_experts"),
        (llama_like(num_experts=8, num_experts_per_tok=2), "num_experts"),
        (llama_like(sliding_window=4096), "sliding_window"),
        (llama_like(model_type="qwen3", q_lora_rank=1536), "q_lora_rank"),
        (llama_like(model_type="olmo2", sliding_window=512), "sliding_window"),
        (llama_like(model_type="mistral", layer_types=["full_attention"] * 4), "layer_types"),
        (llama_like(model_type="gemma2", layer_types=["sliding_attention", "chunked_attention"] * 2), "layer_types"),
        (llama_like(attn_logit_softcapping=50.0), "attn_logit_softcapping"),
    ],
)
def test_architecture_key_not_honoured_is_an_error(data, key):
    with pytest.raises(ConfigError) as info:
        parse_config(data, "x")
    assert info.value.field == key and key in str(info.value) and "\n" not in str(info.value)


def test_harmless_and_unset_architecture_keys_are_accepted():
    parse_config(llama_like(num_experts=0, sliding_window=None, q_lora_rank=None), "x")
    parse_config(llama_like(model_type="gemma2", attn_logit_softcapping=50.0, final_logit_softcapping=30.0), "g")


# ---------------------------------------------------------------- round trip


@pytest.mark.parametrize("name", NEW_CATALOG)
def test_round_trip_new_catalog_models(name):
    spec = load_model(name)
    assert parse_config(config_dict(spec), spec.name) == spec


def test_round_trip_qwen_windows_and_bias():
    for family in ("qwen2", "qwen3"):
        spec = parse_config(
            llama_like(model_type=family, use_sliding_window=True, sliding_window=64, max_window_layers=1), "q"
        )
        assert parse_config(config_dict(spec), "q") == spec


def test_mistral_cannot_write_a_window_on_some_layers_only():
    spec = parse_config(llama_like(model_type="mistral"), "m")
    spec = dataclasses.replace(spec, blocks=(Block(),) + spec.blocks[1:2] + (Block(),) * (spec.num_layers - 2))
    with pytest.raises(ConfigError) as info:
        config_dict(spec)
    assert info.value.field == "blocks" and "its block 0 Block(mixer=attention, ffn=dense) is not" in str(info.value)


def test_blocks_hold_what_differs_between_layers_and_their_mixers_need_their_sizes():
    llama = load_model("llama3-8b")
    assert llama.blocks == (Block(),) * 32 and llama.num_layers == 32 and not llama.is_hybrid
    with pytest.raises(ValueError, match="MLA blocks"):
        dataclasses.replace(llama, blocks=(Block(Mixer.MLA),) * 32)
    with pytest.raises(ValueError, match="mamba2 blocks"):
        dataclasses.replace(llama, blocks=(Block(Mixer.MAMBA2, FFN.NONE),) * 32)
