"""gpt-oss: attention sinks, biased experts and router, alternating windows."""

from __future__ import annotations

from typing import Any

from nestplan.model.families.common import (
    MAX_FFN,
    ConfigFields,
    Family,
    expert_counts,
    decoder_blocks,
    layer_types,
    rotary_decoder,
    rotary_fields,
)
from nestplan.model.facts import FactKeys, RouterKeys, RouterScore
from nestplan.model.spec import ModelSpec


def _read_gpt_oss(f: ConfigFields, name: str) -> ModelSpec:
    """gpt-oss (HF modeling_gpt_oss; OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card", 2025): every block
    MoE with ``num_local_experts`` experts of ``intermediate_size`` whose gate/up and down projections
    have biases, a router with a bias, biased attention projections, one learned sink logit per head,
    ``sliding_window`` (default 128) on the layers ``layer_types`` names (default every other layer
    from the first). Its experts' GLU (``swiglu_limit``, a clamp) is a fact (model.facts: glu_clamp)."""
    fields = rotary_decoder(f, name, head_dim_default=64)
    num_layers = len(fields["blocks"])
    experts, top_k = expert_counts(f, "num_local_experts")
    if not f.flag("attention_bias", True):
        raise f.error(
            "field 'attention_bias' false is not honoured in a gpt_oss model (nestplan counts its "
            "attention and expert biases together)",
            "attention_bias",
            False,
            "true",
        )
    expert_ffn = f.integer("intermediate_size", MAX_FFN)
    layers = f.sliding_layers(num_layers, lambda i: (i + 1) % 2 != 0)
    blocks = decoder_blocks(num_layers, f.window(128), layers, moe=range(num_layers))
    return ModelSpec(
        ffn_hidden_size=expert_ffn,
        num_experts=experts,
        experts_per_token=top_k,
        moe_ffn_hidden_size=expert_ffn,
        router_bias=True,
        attention_sinks=True,
        **fields | {"linear_bias": True, "blocks": blocks},
    )


def _gpt_oss_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        **rotary_fields(spec),
        "intermediate_size": spec.moe_ffn_hidden_size,
        "num_local_experts": spec.num_experts,
        "num_experts_per_tok": spec.experts_per_token,
        "sliding_window": spec.sliding_window,
        "layer_types": layer_types(spec),
        "attention_bias": True,
    }


FAMILIES = (
    Family(
        "gpt_oss",
        _read_gpt_oss,
        _gpt_oss_fields,
        131072,
        facts=FactKeys(
            ("rms_norm_eps", 1e-5),
            (None, "quick_gelu"),  # HF GptOssExperts: gate * sigmoid(1.702 gate), whatever hidden_act says
            rope_theta=150000.0,
            router=RouterKeys((None, RouterScore.SOFTMAX), (None, True)),
            glu=("swiglu_limit", 7.0, 1.0),  # both halves clamped at swiglu_limit, the linear half plus 1
        ),
    ),
)  # HF GptOssConfig
