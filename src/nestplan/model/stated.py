"""Every architecture fact a model's config states, by name (:func:`stated_facts`): what an export must
give the framework that builds the model, or refuse, or note by name (issue 27: 0 facts dropped
silently). The real-framework tests walk this table for every catalog model and every framework."""

from __future__ import annotations

from nestplan.model.spec import ModelSpec

DROPLESS = "dropless"  # nestplan costs every routed token (no capacity factor: Hugging Face's MoE models)


def attention_variant(m: ModelSpec) -> str:
    """ "mla", "mha" (a key/value head per query head), "mqa" (one) or "gqa"."""
    if m.is_mla:
        return "mla"
    return "mha" if m.num_kv_heads == m.num_heads else ("mqa" if m.num_kv_heads == 1 else "gqa")


def stated_facts(m: ModelSpec) -> dict[str, object]:
    """The facts of ``m`` by name: the shapes an export sets beside its sizes and ``m.facts``."""
    f = m.facts
    facts: dict[str, object] = {
        "norm": m.norm,
        "norm_eps": f.norm_eps,
        "activation": f.activation,
        "gated_mlp": m.gated_mlp,
        "vocab_size": m.vocab_size,
        "tied_embeddings": m.tied_embeddings,
        "attention_variant": attention_variant(m),
        "qk_norm": m.qk_norm.value,
        "window": (m.sliding_window, sum(1 for i in range(m.num_layers) if m.window_of(i) is not None)),
        "attention_chunk": m.attention_chunk_size,
        "rope_layers": sum(1 for block in m.blocks if block.rope),
        "rotary_fraction": m.rotary_fraction,
        "attention_sinks": m.attention_sinks,
        "parallel_block": m.parallel_block,
        "block_norms": m.block_norms,
        "rope_theta": f.rope_theta,
        "rope_scaling": f.rope_scaling.as_dict() if f.rope_scaling else None,
        "linear_bias": m.linear_bias,
        "qkv_bias": m.qkv_bias,
    }
    if f.glu_clamp is not None or f.glu_linear_offset:
        facts |= {"glu_clamp": f.glu_clamp, "glu_linear_offset": f.glu_linear_offset}
    if f.local_rope_theta is not None:
        facts["local_rope_theta"] = f.local_rope_theta
    if m.mtp_layers:  # DeepSeek-V3's multi-token-prediction modules (section 2.2), which nestplan costs
        facts["mtp_layers"] = m.mtp_layers
    if m.is_moe and f.router is not None:
        facts |= {
            "router_score": f.router.score.value,
            "router_top_k": m.experts_per_token,
            "router_renormalised": f.router.renormalised,
            "router_scaling_factor": f.router.scaling_factor,
            "router_scores_all_experts": m.router_scores_all_experts,
            "routing_groups": (m.routing_groups, m.routing_groups_per_token),
            "shared_experts": m.num_shared_experts,
            "router_bias": m.router_bias,
            "capacity": DROPLESS,
        }
    return facts
