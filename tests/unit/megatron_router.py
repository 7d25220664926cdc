"""The router facts of a Megatron-core TransformerConfig (Megatron-LM's, or a Megatron-Bridge provider, which
is one), as ``stated_facts`` names them: shared by the two Megatron round-trip matrices."""

from __future__ import annotations

from nestplan.model.spec import ModelSpec
from nestplan.model.stated import DROPLESS


def router_facts(config, m: ModelSpec) -> dict[str, object]:
    """Megatron-core's router (moe_utils.topk_routing_with_score_function): a sigmoid scores every expert and
    renormalises more than one chosen weight; a softmax after the top-k renormalises, one before it
    (pre_softmax) scores every expert and does not. Shared experts are one MLP of their summed width
    (``m`` gives one's width)."""
    sigmoid = config.moe_router_score_function == "sigmoid"
    k = config.moe_router_topk
    shared = config.moe_shared_expert_intermediate_size or 0
    return {
        "router_score": config.moe_router_score_function,
        "router_top_k": k,
        "router_renormalised": k > 1 if sigmoid else not config.moe_router_pre_softmax,
        "router_scaling_factor": config.moe_router_topk_scaling_factor or 1.0,
        "router_scores_all_experts": sigmoid or config.moe_router_pre_softmax,
        "routing_groups": (config.moe_router_num_groups or 1, config.moe_router_group_topk or 1),
        "shared_experts": shared // m.shared_expert_ffn_hidden_size if shared else 0,
        "router_bias": config.moe_router_enable_expert_bias or config.add_bias_linear,
        "capacity": DROPLESS if config.moe_expert_capacity_factor is None else config.moe_expert_capacity_factor,
    }
