"""Nemotron-H (Mamba-2 hybrid): parsing ``hybrid_override_pattern``, parameter counts, the Mamba-2
mixer's FLOPs, per-device shares under tensor parallelism, stored bytes, block kinds, the round trip
through config_dict and the refusals."""

from __future__ import annotations

import dataclasses

import pytest

from nestplan import api
from nestplan.cost.compute import Precision, _elementwise_bytes, _mixer_core, block_time
from nestplan.errors import ConfigError
from nestplan.hardware.accelerator import load_accelerator
from nestplan.model import load_model, parse_config
from nestplan.model import layers as L
from nestplan.model import ssm
from nestplan.model.config import config_dict
from nestplan.model.spec import FFN, Block, Mixer
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute

PATTERN_8B = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"


def small_hybrid(**overrides) -> dict:
    """A small Nemotron-H config: Mamba, MLP, attention, MLP."""
    base = {
        "model_type": "nemotron_h",
        "hidden_size": 256,
        "intermediate_size": 512,
        "hybrid_override_pattern": "M-*-",
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 1000,
        "mamba_num_heads": 8,
        "mamba_head_dim": 64,
        "ssm_state_size": 16,
        "n_groups": 2,
        "conv_kernel": 4,
        "chunk_size": 64,
    }
    return base | overrides


def mamba_hand_count(h: int, heads: int, head_dim: int, state: int, groups: int, kernel: int) -> int:
    """One Mamba-2 mixer counted by hand from HF NemotronHMamba2Mixer's modules."""
    d = heads * head_dim
    conv_channels = d + 2 * groups * state
    in_proj = h * (2 * d + 2 * groups * state + heads)  # z, x, B, C, dt
    conv1d = conv_channels * kernel + conv_channels  # depthwise weight + bias
    return in_proj + conv1d + heads + heads + heads + d + d * h  # A_log, D, dt_bias, gated norm, out_proj


# ---------------------------------------------------------------- parsing


def test_pattern_gives_each_layer_its_mixer_and_ffn():
    spec = load_model("nemotron-h-8b")
    assert spec.family == "nemotron_h" and spec.num_layers == 52 and spec.is_hybrid
    kinds = [(spec.mixer_of(i), spec.has_ffn(i)) for i in range(52)]
    assert kinds.count(("mamba", False)) == 24 and kinds.count(("none", True)) == 24
    assert kinds.count(("attention", False)) == 4
    assert [i for i, char in enumerate(PATTERN_8B) if char == "*"] == [
        i for i in range(52) if kinds[i][0] == "attention"
    ]
    assert spec.mamba == ssm.Mamba2Shape(
        num_heads=128, head_dim=64, state_size=128, groups=8, conv_kernel=4, chunk_size=128, conv_bias=True
    )
    # one pre-norm per layer, squared-ReLU MLP of two projections, no positional embedding, RMSNorm
    assert spec.block_norms == 1 and not spec.gated_mlp and spec.rotary_fraction == 0.0 and spec.norm == "rmsnorm"


def test_block_kinds_keep_the_three_layer_types_apart_and_leave_other_families_alone():
    spec = load_model("nemotron-h-8b")
    assert len({spec.block_kind(i) for i in range(spec.num_layers)}) == 3
    llama = load_model("llama3-8b")
    assert not llama.is_hybrid and llama.block_kind(0) == Block(Mixer.ATTENTION, FFN.DENSE)
    assert llama.mixer_of(0) == "attention" and llama.has_ffn(0)


def test_layers_block_type_stands_for_the_pattern():
    """Newer HF NemotronHConfig versions store layers_block_type (older names mamba/attention/mlp/moe,
    current linear_attention/full_attention) instead of hybrid_override_pattern."""
    data = small_hybrid()
    del data["hybrid_override_pattern"]
    for names in (["mamba", "mlp", "attention", "mlp"], ["linear_attention", "mlp", "full_attention", "mlp"]):
        assert parse_config(data | {"layers_block_type": names}, "x") == parse_config(small_hybrid(), "x")
    with pytest.raises(ConfigError) as info:
        parse_config(data | {"layers_block_type": ["mamba", "gdn", "mlp", "mlp"]}, "x")
    assert info.value.field == "layers_block_type" and "'gdn'" in str(info.value)


def test_legacy_mamba_keys_are_read():
    """HF NemotronHConfig.__post_init__ accepts mamba_n_groups, mamba_d_conv, mamba_chunk_size."""
    data = small_hybrid()
    for key in ("n_groups", "conv_kernel", "chunk_size"):
        del data[key]
    spec = parse_config(data | {"mamba_n_groups": 4, "mamba_d_conv": 3, "mamba_chunk_size": 32}, "x")
    assert (spec.mamba.groups, spec.mamba.conv_kernel, spec.mamba.chunk_size) == (4, 3, 32)


# ---------------------------------------------------------------- parameters


def test_nemotron_h_8b_parameters_counted_by_hand():
    """NVIDIA 2025 (arXiv 2504.03624) section 2.1, Nemotron-H-8B: 24 Mamba-2, 24 MLP and 4 attention
    layers at hidden 4096; the published size is "8B" (model card nvidia/Nemotron-H-8B-Base-8K: "This
    model has 8B ... parameters"), which the 8.10 B counted here rounds to. The count is checked
    against one made by hand from the HF modules."""
    spec = load_model("nemotron-h-8b")
    h, v = 4096, 131072
    norm = h
    mamba = mamba_hand_count(h, heads=128, head_dim=64, state=128, groups=8, kernel=4) + norm
    mlp = 2 * h * 21504 + norm
    attention = h * 4096 + 2 * h * 8 * 128 + 4096 * h + norm
    expected = 24 * mamba + 24 * mlp + 4 * attention + 2 * v * h + norm  # untied embedding and head, final norm
    assert L.total_params(spec) == expected == 8_100_852_736
    assert round(L.total_params(spec) / 1e9) == 8
    assert L.active_params(spec) == L.total_params(spec) - v * h  # all but the input embedding


def test_nemotron_h_56b_parameters_counted_by_hand():
    """Nemotron-H-56B (arXiv 2504.03624 section 2.1): 54 Mamba-2, 54 MLP and 10 attention layers at
    hidden 8192. Published "56B" (model card nvidia/Nemotron-H-56B-Base-8K: "This model has 56B model
    parameters"): the 56.32 B counted from the architecture round to it (0.58% above 56 B exactly, the
    rounding of the published figure)."""
    spec = load_model("nemotron-h-56b")
    h, v = 8192, 131072
    mamba = mamba_hand_count(h, heads=256, head_dim=64, state=256, groups=8, kernel=4) + h
    mlp = 2 * h * 32768 + h
    attention = h * 8192 + 2 * h * 8 * 128 + 8192 * h + h
    assert L.total_params(spec) == 54 * mamba + 54 * mlp + 10 * attention + 2 * v * h + h
    assert round(L.total_params(spec) / 1e9) == 56


def test_per_device_parameters_under_tp2():
    """Megatron-core MambaMixer splits every Mamba parameter over tp (heads and groups); only the
    block's pre-norm is replicated."""
    spec = parse_config(small_hybrid(), "x")
    full = L.block_params(spec, 0)
    mixer = ssm.mamba_params(spec.mamba, spec.hidden_size)
    assert full.total == mixer + spec.hidden_size and full.expert == 0
    assert L.block_params_per_device(spec, 0, L.Shard(tp=2)).total == mixer / 2 + spec.hidden_size
    mlp_layer = L.block_params(spec, 1).total  # up and down projections and one norm
    assert mlp_layer == 2 * 256 * 512 + 256
    assert L.block_params(spec, 2).total == 256 * 256 + 2 * 256 * 64 + 256 * 256 + 256  # attention + norm


# ---------------------------------------------------------------- FLOPs


def test_mamba_layer_flops_against_a_hand_count():
    """A Mamba block's model FLOPs: in_proj and out_proj, 2 x h x (2d + 2GN + H) + 2 x d x h per token,
    plus the SSD scan by chunks of Q (Dao & Gu 2024 section 6): C B^T per group (2 Q N G), the
    diagonal blocks (2 Q P per head), the chunk states and the states' contribution (2 N P each)."""
    spec = load_model("nemotron-h-8b")
    h, d, G, N, H, P, Q = 4096, 8192, 8, 128, 128, 64, 128
    projections = 2 * h * (2 * d + 2 * G * N + H) + 2 * d * h
    scan = 2 * Q * N * G + H * (2 * Q * P + 2 * N * P + 2 * N * P)
    s = 8192
    assert ssm.scan_flops(spec.mamba, 1) == scan
    assert L.block_model_flops(spec, 0, s, s) == pytest.approx(s * (projections + scan), rel=1e-12)
    # an MLP-only layer has no mixer core, an attention-only layer no MLP
    assert L.block_model_flops(spec, 1, s, s) == pytest.approx(s * 2 * 2 * h * 21504, rel=1e-12)
    attention = 2 * h * (4096 + 2 * 1024) + 2 * 4096 * h + 4 * s * 4096
    assert L.block_model_flops(spec, 7, s, s) == pytest.approx(s * attention, rel=1e-12)


def test_gemms_and_scan_per_device_under_tp2():
    spec = load_model("nemotron-h-8b")
    one, two = L.Shard(tp=1, seq_len=4096), L.Shard(tp=2, seq_len=4096)
    flops = [sum(g.flops for g in L.block_gemms(spec, 0, shard)) for shard in (one, two)]
    assert len(L.block_gemms(spec, 0, one)) == 2 and flops[1] == pytest.approx(flops[0] / 2)
    assert ssm.scan_flops(spec.mamba, 4096, tp=2) == pytest.approx(ssm.scan_flops(spec.mamba, 4096) / 2)
    assert [g.gathered for g in L.block_gemms(spec, 0, two)] == [L.COLUMN, L.ROW]


# ---------------------------------------------------------------- time and stored bytes


def test_mamba_block_time_charges_the_scan_and_no_attention():
    spec = load_model("nemotron-h-8b")
    acc = load_accelerator("h100-sxm-80gb")
    shard = L.Shard(tp=2, sp=True, seq_len=8192)
    mamba, mlp = (block_time(acc, spec, i, shard, Precision("bf16", "bf16")) for i in (0, 1))
    # selective recomputation redoes attention only: nothing in a Mamba or an MLP layer
    assert mamba.attention_forward == 0.0 and mlp.attention_forward == 0.0
    scan_forward, scan_backward = _mixer_core(acc, spec, 0, shard, "bf16")
    assert 0.0 < scan_forward < scan_backward and _mixer_core(acc, spec, 1, shard, "bf16") == (0.0, 0.0)
    gemms = sum(f for f, _ in mamba.gemms)
    assert mamba.forward > gemms + scan_forward
    attention = block_time(acc, spec, 7, shard, Precision("bf16", "bf16"))
    assert attention.attention_forward > 0.0


def test_mamba_stored_bytes():
    """Per token per device: the norm's and in_proj's inputs (2 B h / sp), the in_proj output, the scan
    output and out_proj's input (B (2d + 2GN + H + 2d) / t) and the gated norm's fp32 rstd (4 G / t)."""
    spec = load_model("nemotron-h-8b")
    shard = L.Shard(tp=2, sp=True, seq_len=4096)
    T, B, h, d, G, N, H = 4096, 2, 4096, 8192, 8, 128, 128
    expected = 2 * B * T * h / 2 + B * T * (2 * d + 2 * G * N + H + 2 * d) / 2 + 4 * T * G / 2
    assert L.block_activation_bytes(spec, 0, shard, Recompute.NONE) == pytest.approx(expected)
    assert L.block_activation_bytes(spec, 0, shard, Recompute.SELECTIVE) == pytest.approx(expected)
    assert L.block_activation_bytes(spec, 0, shard, Recompute.FULL) == B * T * h / 2
    # an MLP-only block stores its norm's and MLP's inputs and the up-projection's output and down's input
    mlp = 2 * B * T * h / 2 + B * T * 2 * 21504 / 2
    assert L.block_activation_bytes(spec, 1, shard, Recompute.NONE) == pytest.approx(mlp)


# ---------------------------------------------------------------- round trip and refusals


@pytest.mark.parametrize(("name", "counts"), [("nemotron-h-8b", (24, 24, 4)), ("nemotron-h-56b", (54, 54, 10))])
def test_round_trip(name, counts):
    spec = load_model(name)
    config = config_dict(spec)
    pattern = config["hybrid_override_pattern"]
    assert (pattern.count("M"), pattern.count("-"), pattern.count("*")) == counts
    assert name != "nemotron-h-8b" or pattern == PATTERN_8B
    assert parse_config(config, spec.name) == spec


def test_a_block_of_attention_and_mlp_cannot_be_written():
    spec = parse_config(small_hybrid(), "x")
    spec = dataclasses.replace(spec, blocks=tuple(dataclasses.replace(b, ffn=FFN.DENSE) for b in spec.blocks))
    with pytest.raises(ConfigError) as info:
        config_dict(spec)
    assert info.value.field == "blocks" and "with a mixer and an FFN" in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"hybrid_override_pattern": "M-X-"}, "hybrid_override_pattern"),
        (
            {
                "hybrid_override_pattern": "MEM*",
                "n_routed_experts": 8,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 64,
                "moe_shared_expert_intermediate_size": 64,
                "moe_latent_size": 32,
            },
            "moe_latent_size",
        ),
        (
            {
                "hybrid_override_pattern": "MEM*",
                "n_routed_experts": 8,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 64,
                "moe_shared_expert_intermediate_size": 64,
                "n_shared_experts": 2,
            },
            "n_shared_experts",
        ),
        (
            {
                "hybrid_override_pattern": "MEM*",
                "n_routed_experts": 8,
                "num_experts_per_tok": 9,
                "moe_intermediate_size": 64,
                "moe_shared_expert_intermediate_size": 64,
            },
            "num_experts_per_tok",
        ),
        ({"hybrid_override_pattern": ["M", "-"]}, "hybrid_override_pattern"),
        ({"hybrid_override_pattern": ""}, "hybrid_override_pattern"),
        ({"num_hidden_layers": 5}, "num_hidden_layers"),
        ({"n_groups": 3}, "n_groups"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"use_bias": True}, "use_bias"),
        ({"mamba_d_state": 16}, "mamba_d_state"),  # Jamba's key: not a Nemotron-H one
        ({"sliding_window": 1024}, "sliding_window"),  # HF NemotronHAttention applies no window
    ],
)
def test_refusals_name_the_field(overrides, field):
    with pytest.raises(ConfigError) as info:
        parse_config(small_hybrid(**overrides), "x")
    assert info.value.field == field and "\n" not in str(info.value)


def test_unknown_pattern_character_is_named():
    with pytest.raises(ConfigError) as info:
        parse_config(small_hybrid(hybrid_override_pattern="M-X-"), "x")
    assert "'X'" in str(info.value) and "M (Mamba-2)" in str(info.value) and "E (MoE)" in str(info.value)


def test_moe_fields_without_moe_layers_and_the_unused_rotary_factor_are_accepted():
    """HF NemotronHConfig writes its MoE defaults and partial_rotary_factor into every config, the
    dense Nemotron-H models' included; without E layers they change nothing, and no layer rotates."""
    moe_defaults = {
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 7688,
        "n_shared_experts": 1,
        "moe_shared_expert_intermediate_size": 7688,
        "n_group": 1,
        "topk_group": 1,
    }
    spec = parse_config(small_hybrid(**moe_defaults, partial_rotary_factor=1.0), "x")
    assert spec == parse_config(small_hybrid(), "x") and not spec.is_moe


def test_a_llama_config_with_a_hybrid_pattern_is_refused():
    data = {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "vocab_size": 1000,
        "hybrid_override_pattern": "M-*-",
    }
    with pytest.raises(ConfigError) as info:
        parse_config(data, "x")
    assert info.value.field == "hybrid_override_pattern"


# ---------------------------------------------------------------- MoE layers (E)


def test_nemotron_3_nano_moe_layers():
    spec = load_model("nemotron-3-nano-30b-a3b")
    assert len(spec.mamba_layers) == 23 and len(spec.moe_layers) == 23 and spec.num_layers == 52
    assert all(spec.blocks[i].mixer is Mixer.NONE for i in spec.moe_layers) and spec.blocks[1].ffn is not FFN.NONE
    assert (spec.num_experts, spec.experts_per_token, spec.moe_ffn_hidden_size) == (128, 6, 1856)
    assert (spec.num_shared_experts, spec.shared_expert_ffn_hidden_size, spec.router_bias) == (1, 3712, True)
    assert len({spec.block_kind(i) for i in range(spec.num_layers)}) == 3  # Mamba, MoE, attention


def test_nemotron_3_nano_parameters():
    """Nemotron 3 Nano (NVIDIA, December 2025; model card nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16):
    31.6B total parameters, 3.2B active per token, 3.6B with the embeddings. Counted by hand: 23 Mamba-2
    layers, 23 MoE layers (router with a correction bias per expert, 128 non-gated experts, one shared
    expert), 6 attention layers, untied embedding and head."""
    spec = load_model("nemotron-3-nano-30b-a3b")
    h, v, experts = 2688, 131072, 128
    mamba = mamba_hand_count(h, heads=64, head_dim=64, state=128, groups=8, kernel=4) + h
    routed = experts * 2 * h * 1856
    moe_dense = (h + 1) * experts + 2 * h * 3712 + h
    attention = h * 32 * 128 + 2 * h * 2 * 128 + 32 * 128 * h + h
    total = 23 * mamba + 23 * (moe_dense + routed) + 6 * attention + 2 * v * h + h
    assert L.total_params(spec) == total
    assert L.total_params(spec) == pytest.approx(31.6e9, rel=0.005)
    active = total - 23 * routed * (1 - 6 / experts) - v * h  # the input embedding is not active
    assert L.active_params(spec) == pytest.approx(active)
    assert round(L.active_params(spec) / 1e8) == 32  # "3.2B active"
    assert round((L.active_params(spec) + L.embedding_params(spec)) / 1e8) == 36  # "3.6B with the embeddings"


def test_an_moe_layer_has_no_mixer():
    spec = load_model("nemotron-3-nano-30b-a3b")
    shard = L.Shard(tp=2, seq_len=4096)
    gemms = L.block_gemms(spec, 1, shard)
    assert gemms[0].n == spec.num_experts and gemms[0].gathered == ""  # the router comes first: no mixer
    assert L.block_model_flops(spec, 1, 1, 4096) == pytest.approx(
        sum(g.flops for g in L.block_gemms(spec, 1, L.Shard(seq_len=4096))) / 4096
    )
    acc = load_accelerator("h100-sxm-80gb")
    assert _mixer_core(acc, spec, 1, shard, "bf16") == (0.0, 0.0)


def test_round_trip_with_moe_layers():
    spec = load_model("nemotron-3-nano-30b-a3b")
    config = config_dict(spec)
    assert config["hybrid_override_pattern"] == "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
    assert parse_config(config, spec.name) == spec


def test_elementwise_traffic_per_sub_block():
    """A hybrid block has one residual add (its one sub-block); a Mamba block adds its conv1d and gated
    norm, an MLP block its activation; an attention block of Nemotron-H rotates nothing."""
    spec = load_model("nemotron-h-8b")
    shard = L.Shard(tp=2, seq_len=4096)
    B, T, h = 2, 4096, 4096
    norm, residual = 2 * B * T * h, 3 * B * T * h
    conv, gate = 2 * (8192 + 2 * 8 * 128), 3 * 8192
    assert _elementwise_bytes(spec, 0, shard) == pytest.approx(norm + residual + B * T * (conv + gate) / 2)
    assert _elementwise_bytes(spec, 1, shard) == pytest.approx(norm + residual + 2 * B * T * 21504 / 2)
    assert _elementwise_bytes(spec, 7, shard) == pytest.approx(norm + residual)


# ---------------------------------------------------------------- end to end


def test_evaluate_a_hybrid_plan():
    """A plan of Nemotron-H-8B on one DGX H100 evaluates and fits; its model FLOPs are 3x the forward
    count of each layer of its kind (Mamba, MLP, attention: its causal half) and the head's."""
    spec = load_model("nemotron-h-8b")
    cluster = api.resolve_cluster("dgx-h100", devices=8)
    seq, batch = 4096, 16
    prediction = api.evaluate(spec, cluster, ParallelDims(tp=2, sp=True, dp=4), api.job_for(spec, cluster, batch, seq))
    forward = sum(
        L.block_model_flops(spec, i, seq, seq, attended=True) for i in range(spec.num_layers)
    ) + L.head_model_flops(spec, seq)
    assert prediction.model_flops_per_step == pytest.approx(3 * batch * forward)
    assert prediction.fits and prediction.step_time_s > 0


# ---------------------------------------------------------------- Jamba (Mamba-1 mixers)


def test_jamba_layers():
    spec = load_model("jamba-1.5-mini")
    attention = [i for i in range(32) if spec.mixer_of(i) == "attention"]
    assert attention == [4, 12, 20, 28] and len(spec.mamba_layers) == 28 and spec.has_ffn(0)
    assert all(block.ffn is not FFN.NONE for block in spec.blocks)
    assert spec.moe_layers == tuple(range(1, 32, 2)) and spec.block_norms == 2 and spec.gated_mlp
    assert spec.mamba == ssm.Mamba1Shape(inner=8192, state_size=16, conv_kernel=4, dt_rank=256, conv_bias=True)
    assert spec.rotary_fraction == 0.0 and len({spec.block_kind(i) for i in range(32)}) == 3


def test_jamba_parameters_counted_by_hand():
    """Jamba-1.5 (arXiv 2408.12570) section 2: Jamba-1.5-Mini has "12B active parameters" and "52B
    total"; the architecture counted by hand (HF JambaMambaMixer's modules) gives 51.57 B and 12.11 B,
    which round to them."""
    spec = load_model("jamba-1.5-mini")
    h, d, N, R, K = 4096, 8192, 16, 256, 4
    mamba = h * 2 * d + d * K + d + d * (R + 2 * N) + R * d + d + d * N + d + d * h + (R + 2 * N)
    assert ssm.mamba_params(spec.mamba, h) == mamba
    attention, mlp = 2 * h * h + 2 * h * 8 * 128, 3 * h * 14336
    total = 28 * mamba + 4 * attention + 16 * mlp + 16 * (h * 16 + 16 * mlp) + 32 * 2 * h + 2 * 65536 * h + h
    assert L.total_params(spec) == total
    assert L.active_params(spec) == pytest.approx(total - 16 * 14 * mlp - 65536 * h)  # no input embedding
    assert (round(L.total_params(spec) / 1e9), round(L.active_params(spec) / 1e9)) == (52, 12)


def test_mamba1_layer_flops_and_tp_split():
    """A Jamba Mamba block: in_proj (2 h 2d), x_proj (2 d (R + 2N)), dt_proj (2 R d), out_proj (2 d h)
    per token, the selective scan's 7 d N (Megatron-LM's count), an MLP; under tp 2 in_proj and
    dt_proj split their outputs, x_proj and out_proj their inputs (vLLM's MambaMixer)."""
    spec = load_model("jamba-1.5-mini")
    h, d, N, R = 4096, 8192, 16, 256
    projections = 2 * h * 2 * d + 2 * d * (R + 2 * N) + 2 * R * d + 2 * d * h
    s = 4096
    assert L.block_model_flops(spec, 0, s, s) == pytest.approx(s * (projections + 7 * d * N + 2 * 3 * h * 14336))
    one, two = L.Shard(tp=1, seq_len=s), L.Shard(tp=2, seq_len=s)
    mixer_one, mixer_two = L.block_gemms(spec, 0, one)[:4], L.block_gemms(spec, 0, two)[:4]
    assert [g.gathered for g in mixer_two] == [L.COLUMN, L.ROW, "", ""]
    assert sum(g.flops for g in mixer_two) == pytest.approx(sum(g.flops for g in mixer_one) / 2)
    assert ssm.scan_flops(spec.mamba, s, tp=2) == pytest.approx(7 * s * d * N / 2)


def test_mamba1_stored_bytes_and_scan_time():
    spec = load_model("jamba-1.5-mini")
    shard = L.Shard(tp=2, sp=True, seq_len=4096)
    T, B, h, d, N, R = 4096, 2, 4096, 8192, 16, 256
    mixer = 2 * B * T * h / 2 + T * (B * (5 * d / 2 + 2 * (R + 2 * N)) + 4 * 3)
    mlp = 2 * B * T * h / 2 + B * T * 3 * 14336 / 2
    assert L.block_activation_bytes(spec, 0, shard, Recompute.NONE) == pytest.approx(mixer + mlp)
    acc = load_accelerator("h100-sxm-80gb")
    forward, backward = _mixer_core(acc, spec, 0, shard, "bf16")
    assert 0.0 < forward and backward == pytest.approx(2 * forward)
    assert block_time(acc, spec, 0, shard, Precision("bf16", "bf16")).attention_forward == 0.0


def test_jamba_round_trip_and_refusals():
    spec = load_model("jamba-1.5-mini")
    assert parse_config(config_dict(spec), spec.name) == spec
    base = config_dict(spec)
    for overrides, field in (
        ({"mamba_proj_bias": True}, "mamba_proj_bias"),
        ({"attn_layer_offset": 8}, "attn_layer_offset"),
        ({"num_experts_per_tok": 17}, "num_experts_per_tok"),
        ({"sliding_window": 4096}, "sliding_window"),
    ):
        with pytest.raises(ConfigError) as info:
            parse_config(base | overrides, "x")
        assert info.value.field == field


def test_jamba_with_one_expert_is_dense():
    spec = load_model("jamba-1.5-mini")
    dense = parse_config(config_dict(spec) | {"num_experts": 1}, "x")
    assert not dense.is_moe and L.block_params(dense, 1).total == L.block_params(spec, 0).total
