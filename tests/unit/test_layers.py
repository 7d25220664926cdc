"""Per-layer formulas against closed forms from the literature."""

from __future__ import annotations

import pytest

from nestplan.model import layers as L
from nestplan.model import load_model
from nestplan.strategy.enums import Recompute


def test_gpt_layer_params_are_12h2_plus_13h() -> None:
    """A GPT layer has 12h^2 + 13h parameters (Narayanan et al. SC'21, section 5.1)."""
    m = load_model("korthikanti-175b")
    h = m.hidden_size
    assert L.block_params(m, 0).total == 12 * h * h + 13 * h


def test_llama2_7b_total_params() -> None:
    """Llama 2 7B: 6,738,415,616 parameters (Hugging Face model card, safetensors metadata)."""
    assert L.total_params(load_model("llama2-7b")) == 6_738_415_616


def test_mixtral_active_vs_total() -> None:
    """Mixtral 8x7B: 46.7B total parameters (Jiang et al. 2024)."""
    m = load_model("mixtral-8x7b")
    assert L.total_params(m) == pytest.approx(46.7e9, rel=0.01)


def test_gpt_forward_flops_match_narayanan_eq3() -> None:
    """Forward FLOPs per layer: 24 b s h^2 + 4 b s^2 h (Narayanan et al. SC'21, eq. 3 / 3)."""
    m = load_model("korthikanti-175b")
    s, h = 2048, m.hidden_size
    assert L.block_model_flops(m, 0, s, s) == pytest.approx(24 * s * h * h + 4 * s * s * h, rel=1e-3)


def test_moe_flops_count_top_k_experts() -> None:
    m = load_model("mixtral-8x7b")
    s, h, f = 4096, m.hidden_size, m.moe_ffn_hidden_size
    dense_attn = 2 * s * h * (m.q_channels + 2 * m.kv_channels) + 2 * s * m.q_channels * h + 4 * s * s * m.q_channels
    experts = m.experts_per_token * 2 * s * 3 * h * f
    router = 2 * s * h * m.num_experts
    assert L.block_model_flops(m, 0, s, s) == pytest.approx(dense_attn + experts + router)


def test_tp_shards_gemm_flops_evenly() -> None:
    m = load_model("llama3-70b")
    one = sum(g.flops for g in L.block_gemms(m, 0, L.Shard(tp=1, seq_len=4096)))
    eight = sum(g.flops for g in L.block_gemms(m, 0, L.Shard(tp=8, seq_len=4096)))
    assert eight == pytest.approx(one / 8)


def test_ep_keeps_expert_flops_per_device() -> None:
    """With balanced routing every device processes top-k copies of its own tokens."""
    m = load_model("mixtral-8x7b")
    base = sum(g.flops for g in L.block_gemms(m, 0, L.Shard(ep=1, seq_len=4096)))
    ep8 = sum(g.flops for g in L.block_gemms(m, 0, L.Shard(ep=8, seq_len=4096)))
    assert ep8 == pytest.approx(base)


def test_flash_attention_drops_score_memory() -> None:
    m = load_model("llama2-7b")
    eager = L.block_activation_bytes(m, 0, L.Shard(seq_len=4096, flash=False), Recompute.NONE)
    flash = L.block_activation_bytes(m, 0, L.Shard(seq_len=4096, flash=True), Recompute.NONE)
    selective = L.block_activation_bytes(m, 0, L.Shard(seq_len=4096, flash=False), Recompute.SELECTIVE)
    assert flash == pytest.approx(selective)
    assert eager - flash == pytest.approx(2 * m.num_heads * 4096 * 4096)  # softmax output only: no dropout


def test_full_recompute_keeps_layer_input_only() -> None:
    m = load_model("llama3-8b")
    shard = L.Shard(tp=4, sp=True, seq_len=8192, micro_batch_size=2)
    assert L.block_activation_bytes(m, 0, shard, Recompute.FULL) == 2 * 2 * 8192 * m.hidden_size / 4


def test_cp_divides_activations() -> None:
    m = load_model("llama3-8b")
    one = L.block_activation_bytes(m, 0, L.Shard(seq_len=8192), Recompute.NONE)
    two = L.block_activation_bytes(m, 0, L.Shard(seq_len=8192, cp=2), Recompute.NONE)
    assert two == pytest.approx(one / 2)


def test_boundary_bytes_are_hidden_states_over_tp() -> None:
    m = load_model("gpt3-175b")
    assert L.boundary_bytes(m, L.Shard(tp=4, seq_len=2048, micro_batch_size=1)) == 2 * 2048 * m.hidden_size / 4


def test_per_device_params_split_over_tp_and_ep() -> None:
    m = load_model("mixtral-8x7b")
    full = L.block_params(m, 0)
    dev = L.block_params_per_device(m, 0, L.Shard(tp=2, ep=4))
    assert dev.expert == pytest.approx(full.expert / 8)
    # the two RMSNorms and the 8 x h router (Megatron-core's TopKRouter weight is not split) held whole
    assert dev.dense == pytest.approx((full.dense - 10 * m.hidden_size) / 2 + 10 * m.hidden_size)


def test_fp8_gemms_keep_fp8_copies_of_their_inputs() -> None:
    """Under FP8 Transformer Engine's linear layers keep the FP8 cast of their input for the weight
    gradient (TE v1.11 linear.py ``saved_inputmat``, layernorm_linear.py ``ln_out``): the QKV and the
    first MLP inputs (the fused norms' FP8 outputs) and the down-projection's input take 1 byte instead
    of 2; the output projection keeps an FP8 copy beside the fused attention's own bf16 output."""
    m = load_model("llama3-70b")
    t, T = 4, 8192
    bf16 = L.Shard(tp=t, sp=True, seq_len=T)
    fp8 = L.Shard(tp=t, sp=True, seq_len=T, fp8_gemms=True)
    h, f, out_in = m.hidden_size, m.ffn_hidden_size, m.num_heads * m.head_dim / t
    saved = 2 * (T * h / t) + T * f / t - T * out_in  # 1 byte fewer each, 1 byte more for the copy
    for rc in (Recompute.NONE, Recompute.SELECTIVE):
        assert L.block_activation_bytes(m, 0, bf16, rc) - L.block_activation_bytes(m, 0, fp8, rc) == pytest.approx(
            saved
        )
    assert L.block_activation_bytes(m, 0, fp8, Recompute.FULL) == L.block_activation_bytes(m, 0, bf16, Recompute.FULL)
