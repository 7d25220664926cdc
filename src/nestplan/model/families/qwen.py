"""Qwen2, Qwen3 and their MoE variants.

* Qwen2 and Qwen2-MoE have biases on the Q, K and V projections only: ``qkv_bias``
  (``linear_bias=False``); Qwen3 and Qwen3-MoE read ``attention_bias``.
* Qwen MoE families fill ``ffn_hidden_size`` from ``intermediate_size`` (used by the layers listed
  in ``mlp_only_layers`` or skipped by ``decoder_sparse_step``); when every layer is MoE the field
  may be absent and then equals the expert width.
* ``moe_layers``: the layers ``i`` with ``i not in mlp_only_layers`` and ``(i + 1) %
  decoder_sparse_step == 0`` (as in ``transformers``' Qwen2MoE/Qwen3MoE decoder layers).
* Qwen2-MoE has one shared expert of ``shared_expert_intermediate_size`` (``num_shared_experts`` =
  1, or 0 when that size is 0).
* Sliding windows where ``use_sliding_window``, from ``max_window_layers`` on.
"""

from __future__ import annotations

from typing import Any

from nestplan.inputs import MISSING
from nestplan.errors import brief
from nestplan.model.families.common import (
    MAX_FFN,
    MAX_LAYERS,
    ConfigFields,
    Family,
    decoder_blocks,
    expert_counts,
    layer_types,
    rotary_decoder,
    rotary_fields,
)
from nestplan.model.facts import FactKeys, RouterKeys, RouterScore
from nestplan.model.spec import Block, ModelSpec, QKNorm


def _qwen_blocks(
    f: ConfigFields, num_layers: int, moe: tuple[int, ...] = (), qk_norm: QKNorm = QKNorm.NONE
) -> tuple[Block, ...]:
    """Qwen2/Qwen3 (dense and MoE): ``sliding_window`` (default 4096) only where ``use_sliding_window``
    (default false), in the layers from ``max_window_layers`` (default 28) on, or those ``layer_types``
    names (HF Qwen2Config: layer_types "sliding_attention" where i >= max_window_layers)."""
    window = f.window(4096)
    first = f.integer("max_window_layers", MAX_LAYERS, default=28, minimum=0)
    layers = f.sliding_layers(num_layers, lambda i: i >= first)
    window = window if f.flag("use_sliding_window", False) else None
    return decoder_blocks(num_layers, window, layers, moe, qk_norm)


def _read_qwen2(f: ConfigFields, name: str) -> ModelSpec:
    """Qwen2: biases on the Q, K and V projections, none elsewhere (HF modeling_qwen2, Qwen2Attention)."""
    fields = rotary_decoder(f, name) | {"qkv_bias": True}
    return ModelSpec(
        ffn_hidden_size=f.integer("intermediate_size", MAX_FFN),
        **fields | {"blocks": _qwen_blocks(f, len(fields["blocks"]))},
    )


def _read_qwen3(f: ConfigFields, name: str) -> ModelSpec:
    """Qwen3 dense: the Llama block with QK-norm, an RMSNorm of head_dim on each query and key head
    before RoPE (HF modeling_qwen3, Qwen3Attention q_norm/k_norm), ``head_dim`` explicit (default 128);
    ``attention_bias`` puts biases on the attention projections (recorded as linear_bias, as for Llama)."""
    fields = rotary_decoder(f, name, head_dim_default=128) | {"linear_bias": f.flag("attention_bias", False)}
    return ModelSpec(
        ffn_hidden_size=f.integer("intermediate_size", MAX_FFN),
        **fields | {"blocks": _qwen_blocks(f, len(fields["blocks"]), qk_norm=QKNorm.HEAD)},
    )


def _experts_key(f: ConfigFields) -> str:
    """Where the expert count is: num_experts, or num_local_experts as transformers 5 writes Qwen3-MoE's
    (Qwen3MoeConfig.attribute_map); both, disagreeing, is refused."""
    if f.family != "qwen3_moe" or not f.has("num_local_experts"):
        return "num_experts"
    if f.has("num_experts") and f.raw("num_experts") != f.raw("num_local_experts"):
        raise f.error(
            "num_local_experts and num_experts disagree (transformers 5 reads num_local_experts)",
            "num_local_experts",
            brief(f.raw("num_local_experts")),
        )
    return "num_local_experts"


def _read_qwen_moe(f: ConfigFields, name: str) -> ModelSpec:
    """qwen2_moe (one shared expert, Q/K/V biases) and qwen3_moe (no shared expert, QK-norm)."""
    fields = rotary_decoder(f, name)
    num_layers = len(fields["blocks"])
    experts, top_k = expert_counts(f, _experts_key(f))
    expert_ffn = f.integer("moe_intermediate_size", MAX_FFN)
    step = f.integer("decoder_sparse_step", MAX_LAYERS, default=1)
    dense_only = f.layer_indices("mlp_only_layers", num_layers)
    moe_layers = tuple(i for i in range(num_layers) if i not in dense_only and (i + 1) % step == 0)
    has_dense = len(moe_layers) < num_layers
    dense_ffn = f.integer("intermediate_size", MAX_FFN, default=MISSING if has_dense else expert_ffn)
    shared_ffn = 0
    # Qwen3-MoE: QK-norm as dense Qwen3 (HF modeling_qwen3_moe, Qwen3MoeAttention q_norm/k_norm)
    qk_norm = QKNorm.HEAD if f.family == "qwen3_moe" else QKNorm.NONE
    fields["blocks"] = _qwen_blocks(f, num_layers, moe_layers, qk_norm)
    if f.family == "qwen2_moe":
        shared_ffn = f.integer("shared_expert_intermediate_size", MAX_FFN, minimum=0)
        fields["qkv_bias"] = True  # HF modeling_qwen2_moe, Qwen2MoeAttention: q, k, v biased
        # HF Qwen2MoeSparseMoeBlock: a softmax over every expert before the top-k; shared_expert_gate
        fields |= {"router_scores_all_experts": True, "shared_expert_gate": shared_ffn > 0}
    else:  # Qwen3-MoE: attention biases as dense Qwen3
        fields["linear_bias"] = f.flag("attention_bias", False)
    return ModelSpec(
        ffn_hidden_size=dense_ffn,
        num_experts=experts,
        experts_per_token=top_k,
        moe_ffn_hidden_size=expert_ffn,
        num_shared_experts=1 if shared_ffn > 0 else 0,
        shared_expert_ffn_hidden_size=shared_ffn,
        **fields,
    )


def _qwen_window_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        "use_sliding_window": spec.sliding_window is not None,
        "sliding_window": spec.sliding_window,
        "layer_types": layer_types(spec),
    }


def _qwen_dense_fields(spec: ModelSpec) -> dict[str, Any]:
    out = {**rotary_fields(spec), "intermediate_size": spec.ffn_hidden_size, **_qwen_window_fields(spec)}
    if spec.family == "qwen3":
        out["attention_bias"] = spec.linear_bias
    return out


def _qwen_moe_fields(spec: ModelSpec) -> dict[str, Any]:
    out = {
        **rotary_fields(spec),
        "intermediate_size": spec.ffn_hidden_size,
        "num_experts": spec.num_experts,
        "num_experts_per_tok": spec.experts_per_token,
        "moe_intermediate_size": spec.moe_ffn_hidden_size,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [i for i in range(spec.num_layers) if not spec.is_moe_layer(i)],
        **_qwen_window_fields(spec),
    }
    if spec.family == "qwen2_moe":
        out["shared_expert_intermediate_size"] = spec.shared_expert_ffn_hidden_size
    else:
        out["attention_bias"] = spec.linear_bias
    return out


# HF Qwen2/Qwen3 configs; their MoE routers softmax over every expert, renormalising where norm_topk_prob
_DENSE = FactKeys(("rms_norm_eps", 1e-6))
_MOE = FactKeys(("rms_norm_eps", 1e-6), router=RouterKeys((None, RouterScore.SOFTMAX), ("norm_topk_prob", False)))

FAMILIES = (
    Family("qwen2", _read_qwen2, _qwen_dense_fields, 32768, facts=_DENSE),
    Family("qwen2_moe", _read_qwen_moe, _qwen_moe_fields, 32768, facts=_MOE),
    Family("qwen3", _read_qwen3, _qwen_dense_fields, 32768, facts=_DENSE),
    Family("qwen3_moe", _read_qwen_moe, _qwen_moe_fields, 32768, facts=_MOE),
)
