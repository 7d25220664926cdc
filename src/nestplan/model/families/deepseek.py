"""DeepSeek-V2/V3 (``_read_deepseek``): multi-head latent attention (``q_lora_rank``,
``kv_lora_rank``, ``head_dim`` = nope + rope, ``v_head_dim``), MoE from ``first_k_dense_replace`` on
with shared experts, node-limited routing (``routing_groups``), MTP modules (``mtp_layers``, counted
apart). Kimi K2's config.json (model_type "kimi_k2", architectures DeepseekV3ForCausalLM: its remote
code is DeepSeek-V3's) is read as deepseek_v3."""

from __future__ import annotations

from typing import Any

from nestplan.inputs import MISSING
from nestplan.model.families.common import (
    MAX_EXPERTS,
    MAX_FFN,
    MAX_HEAD_DIM,
    MAX_LAYERS,
    ConfigFields,
    Family,
    decoder_blocks,
    expert_counts,
    rotary_decoder,
    rotary_fields,
    routing_groups,
)
from nestplan.model.facts import FactKeys, RouterKeys, RouterScore
from nestplan.model.spec import Mixer, ModelSpec


def _optional_rank(f: ConfigFields, key: str, default: int) -> int:
    """A latent rank: ``default`` when absent, 0 (no latent) when null or 0."""
    if key in f.data and f.data[key] is None:
        f.read.add(key)
        return 0
    return f.integer(key, MAX_FFN, default=default, minimum=0)


def _mla_decoder(f: ConfigFields, name: str) -> tuple[dict[str, Any], int, int]:
    """The rotary decoder's fields with multi-head latent attention's head shape, and the nope and rope
    parts of each head: every head has its keys and values, and no attention bias is honoured."""
    rope = f.integer("qk_rope_head_dim", MAX_HEAD_DIM)
    nope = f.integer("qk_nope_head_dim", MAX_HEAD_DIM)
    fields = rotary_decoder(f, name, head_dim_default=nope + rope)
    if fields["num_kv_heads"] != fields["num_heads"]:
        raise f.error(
            "num_key_value_heads must equal num_attention_heads in multi-head latent attention "
            f"(its keys and values have every head), got {fields['num_kv_heads']}",
            "num_key_value_heads",
            fields["num_kv_heads"],
            fields["num_heads"],
        )
    if f.flag("attention_bias", False):
        raise f.error(
            "field 'attention_bias' true is not honoured with multi-head latent attention",
            "attention_bias",
            True,
            "false",
        )
    return fields, nope, rope


def _read_deepseek(f: ConfigFields, name: str) -> ModelSpec:
    """DeepSeek-V2 and V3 (Kimi-K2, DeepSeek-R1): multi-head latent attention (DeepSeek-V2, arXiv
    2405.04434 section 2.1; HF modeling_deepseek_v3): head_dim is qk_nope_head_dim + qk_rope_head_dim,
    values of v_head_dim, a query latent of q_lora_rank (null: a plain q projection; absent: HF's 1536)
    and a key/value latent of kv_lora_rank, each with an RMSNorm; rotary positions on the rope share of
    each head. MoE blocks from first_k_dense_replace on, every moe_layer_freq-th (DeepSeek's
    modeling_deepseek: i >= first_k_dense_replace and i % moe_layer_freq == 0), with n_shared_experts
    shared experts of moe_intermediate_size each; n_group / topk_group node-limited routing (V3 always,
    V2 with topk_method "group_limited_greedy"); V3's router adds a per-expert correction bias
    (e_score_correction_bias); num_nextn_predict_layers MTP modules (``mtp_layers``). Read and
    harmless (they change routing weights, not what is counted): topk_method, scoring_func,
    norm_topk_prob, routed_scaling_factor, aux_loss_alpha, seq_aux, ep_size."""
    fields, nope, rope = _mla_decoder(f, name)
    num_layers = len(fields["blocks"])
    experts, top_k = expert_counts(f, "n_routed_experts")
    first_dense = f.integer("first_k_dense_replace", MAX_LAYERS, default=0, minimum=0)
    freq = f.integer("moe_layer_freq", MAX_LAYERS, default=1)
    moe_layers = tuple(i for i in range(num_layers) if i >= first_dense and i % freq == 0)
    expert_ffn = f.integer("moe_intermediate_size", MAX_FFN)
    method = f.raw("topk_method", "noaux_tc" if f.family == "deepseek_v3" else "greedy")
    grouped = f.family == "deepseek_v3" or method == "group_limited_greedy"
    fields |= {
        "blocks": decoder_blocks(num_layers, moe=moe_layers, mixer=Mixer.MLA),
        "head_dim": nope + rope,
        "rotary_fraction": rope / (nope + rope),
        "q_lora_rank": _optional_rank(f, "q_lora_rank", 1536),
        "kv_lora_rank": f.integer("kv_lora_rank", MAX_FFN),
        "qk_rope_head_dim": rope,
        "v_head_dim": f.integer("v_head_dim", MAX_HEAD_DIM),
        "router_bias": f.family == "deepseek_v3",
        "router_scores_all_experts": True,  # DeepSeek-V2's softmax, DeepSeek-V3's sigmoid, over every expert
        "mtp_layers": f.integer("num_nextn_predict_layers", MAX_LAYERS, default=0, minimum=0),
        **routing_groups(f, experts, top_k, grouped),
    }
    shared = f.integer("n_shared_experts", MAX_EXPERTS, default=1 if f.family == "deepseek_v3" else 0, minimum=0)
    return ModelSpec(
        ffn_hidden_size=f.integer("intermediate_size", MAX_FFN, default=MISSING if first_dense else expert_ffn),
        num_experts=experts,
        experts_per_token=top_k,
        moe_ffn_hidden_size=expert_ffn,
        num_shared_experts=shared,
        shared_expert_ffn_hidden_size=expert_ffn if shared else 0,
        **fields,
    )


def _deepseek_fields(spec: ModelSpec) -> dict[str, Any]:
    moe = spec.moe_layers
    grouped = spec.routing_groups > 1 or spec.routing_groups_per_token > 1
    method = "noaux_tc" if spec.family == "deepseek_v3" else ("group_limited_greedy" if grouped else "greedy")
    return {
        **rotary_fields(spec),
        "intermediate_size": spec.ffn_hidden_size,
        "moe_intermediate_size": spec.moe_ffn_hidden_size,
        "n_routed_experts": spec.num_experts,
        "num_experts_per_tok": spec.experts_per_token,
        "n_shared_experts": spec.num_shared_experts,
        "first_k_dense_replace": moe[0] if moe else spec.num_layers,
        "moe_layer_freq": moe[1] - moe[0] if len(moe) > 1 else (moe[0] if moe else 0) or spec.num_layers,
        "q_lora_rank": spec.q_lora_rank or None,
        "kv_lora_rank": spec.kv_lora_rank,
        "qk_rope_head_dim": spec.qk_rope_head_dim,
        "qk_nope_head_dim": spec.head_dim - spec.qk_rope_head_dim,
        "v_head_dim": spec.v_head_dim,
        "topk_method": method,
        "n_group": spec.routing_groups,
        "topk_group": spec.routing_groups_per_token,
        "num_nextn_predict_layers": spec.mtp_layers,
    }


def _facts(score: str, renormalised: bool, scaling: float) -> FactKeys:
    """DeepSeek's router keys with HF DeepseekV2Config's / DeepseekV3Config's defaults."""
    keys = RouterKeys(
        ("scoring_func", RouterScore(score)), ("norm_topk_prob", renormalised), ("routed_scaling_factor", scaling)
    )
    return FactKeys(("rms_norm_eps", 1e-6), router=keys)


FAMILIES = (
    Family(
        "deepseek_v2", _read_deepseek, _deepseek_fields, 2048, facts=_facts("softmax", False, 1.0)
    ),  # HF DeepseekV2Config
    # Kimi K2's config.json (model_type "kimi_k2", architectures DeepseekV3ForCausalLM: its remote code is
    # DeepSeek-V3's) reads as deepseek_v3
    Family(
        "deepseek_v3", _read_deepseek, _deepseek_fields, 4096, aliases=("kimi_k2",), facts=_facts("sigmoid", True, 2.5)
    ),  # HF DeepseekV3Config
)
