"""Llama 4 (``llama4``, ``llama4_text``): MoE layers with one shared expert, chunked attention on the
rotary layers, NoPE global layers, a weightless L2 QK-norm."""

from __future__ import annotations

from typing import Any

from nestplan.errors import brief
from nestplan.inputs import MISSING
from nestplan.model.families.common import (
    MAX_FFN,
    MAX_LAYERS,
    MAX_POSITIONS,
    ConfigFields,
    Family,
    expert_counts,
    rotary_decoder,
    rotary_fields,
)
from nestplan.model.facts import FactKeys, RouterKeys, RouterScore
from nestplan.model.spec import FFN, Block, ModelSpec, QKNorm


def _rope_layers(f: ConfigFields, num_layers: int) -> tuple[int, ...]:
    """Llama 4's ``no_rope_layers``: one 0/1 per layer, 1 where the layer has rotary positions (HF
    Llama4TextConfig); absent, null or empty (the class's default ``[]``, which it replaces by the computed
    list: "no_rope_layers == [] is invalid as we cannot have 0 layers"), every ``no_rope_layer_interval``-th
    layer (default 4) has none."""
    flags = f.raw("no_rope_layers", None)
    if flags is None or flags == []:
        interval = f.integer("no_rope_layer_interval", MAX_LAYERS, default=4)
        return tuple(i for i in range(num_layers) if (i + 1) % interval != 0)
    if (
        not isinstance(flags, list)
        or len(flags) < num_layers
        or any(v not in (0, 1) or isinstance(v, bool) for v in flags)
    ):
        raise f.error(
            f"field 'no_rope_layers' must be a list of at least {num_layers} 0s and 1s, got {brief(flags)}",
            "no_rope_layers",
            brief(flags),
            f"{num_layers} of 0, 1",
        )
    return tuple(i for i in range(num_layers) if flags[i] == 1)


def _chunked_layers(f: ConfigFields, num_layers: int, rope_layers: tuple[int, ...]) -> tuple[int, ...]:
    """Llama 4's chunked layers: those ``layer_types`` names "chunked_attention", else the rotary layers
    (HF Llama4TextConfig: layer_types "chunked_attention" where no_rope_layers is 1)."""
    kinds = f.raw("layer_types", None)
    if kinds is None:
        return rope_layers
    allowed = ("chunked_attention", "full_attention")
    if not isinstance(kinds, list) or len(kinds) != num_layers or any(k not in allowed for k in kinds):
        raise f.error(
            f"field 'layer_types' must be a list of {num_layers} of {', '.join(allowed)}, got {brief(kinds)}",
            "layer_types",
            brief(kinds),
            list(allowed),
        )
    return tuple(i for i, kind in enumerate(kinds) if kind == "chunked_attention")


def _llama4_blocks(
    num_layers: int,
    moe_layers: tuple[int, ...],
    rope_layers: tuple[int, ...],
    chunked_layers: tuple[int, ...],
    chunk: int | None,
    qk_norm: QKNorm,
) -> tuple[Block, ...]:
    """Llama 4's blocks: MoE in ``moe_layers``, chunks of ``chunk`` in ``chunked_layers``, rotary positions
    and ``qk_norm`` in ``rope_layers`` (its L2 norm applies to the rotary layers only)."""
    moe, rope, chunked = frozenset(moe_layers), frozenset(rope_layers), frozenset(chunked_layers)
    return tuple(
        Block(
            ffn=FFN.MOE if i in moe else FFN.DENSE,
            chunk=chunk if i in chunked else None,
            rope=i in rope,
            qk_norm=qk_norm if i in rope else QKNorm.NONE,
        )
        for i in range(num_layers)
    )


def _read_llama4(f: ConfigFields, name: str) -> ModelSpec:
    """Llama 4 (text; HF modeling_llama4): MoE blocks at ``moe_layers`` (default every
    ``interleave_moe_layer_step``-th layer from step - 1), each with ``num_local_experts`` routed experts
    and one shared expert, both of ``intermediate_size``; dense blocks of ``intermediate_size_mlp``;
    chunked local attention of ``attention_chunk_size`` (null: none) on the rotary layers, global
    attention without rotary positions on the others (``no_rope_layers``); QK-norm on the rotary
    layers: an L2 norm without weights (``use_qk_norm``). Read and harmless: attn_temperature_tuning,
    floor_scale, attn_scale (a per-position scale of the queries of the global layers)."""
    fields = rotary_decoder(f, name, head_dim_default=128) | {"linear_bias": f.flag("attention_bias", False)}
    num_layers = len(fields["blocks"])
    experts, top_k = expert_counts(f, "num_local_experts")
    step = f.integer("interleave_moe_layer_step", MAX_LAYERS, default=1)
    if f.has("moe_layers"):
        moe_layers = f.layer_indices("moe_layers", num_layers)
    else:
        moe_layers = tuple(range(step - 1, num_layers, step))
    expert_ffn = f.integer("intermediate_size", MAX_FFN)
    has_dense = len(moe_layers) < num_layers
    rope_layers = _rope_layers(f, num_layers)
    chunked = _chunked_layers(f, num_layers, rope_layers)
    if "attention_chunk_size" in f.data and f.data["attention_chunk_size"] is None:  # null: no chunking
        f.read.add("attention_chunk_size")
        chunk, chunked = None, ()
    else:
        chunk = f.integer("attention_chunk_size", MAX_POSITIONS, default=8192)
    for key in ("attn_temperature_tuning", "floor_scale", "attn_scale"):
        f.read.add(key)
    dense_ffn = f.integer("intermediate_size_mlp", MAX_FFN, default=MISSING if has_dense else expert_ffn)
    qk_norm = QKNorm.L2 if f.flag("use_qk_norm", True) else QKNorm.NONE
    blocks = _llama4_blocks(num_layers, moe_layers, rope_layers, chunked, chunk, qk_norm)
    return ModelSpec(
        ffn_hidden_size=dense_ffn,
        num_experts=experts,
        experts_per_token=top_k,
        moe_ffn_hidden_size=expert_ffn,
        num_shared_experts=1,
        shared_expert_ffn_hidden_size=expert_ffn,
        # HF Llama4TextMoe: sigmoid scores of every expert; the top-1's probability scales ``routed_in``
        router_scores_all_experts=True,
        moe_probs_on_input=True,
        **fields | {"blocks": blocks},
    )


def _llama4_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        **rotary_fields(spec),
        "intermediate_size": spec.moe_ffn_hidden_size,
        "intermediate_size_mlp": spec.ffn_hidden_size,
        "num_local_experts": spec.num_experts,
        "num_experts_per_tok": spec.experts_per_token,
        "moe_layers": list(spec.moe_layers),
        "no_rope_layers": [1 if block.rope else 0 for block in spec.blocks],
        "attention_chunk_size": spec.attention_chunk_size,
        "layer_types": ["chunked_attention" if block.chunk else "full_attention" for block in spec.blocks],
        "use_qk_norm": spec.qk_norm == "l2",
        "attention_bias": spec.linear_bias,
    }


# HF Llama4TextConfig: a sigmoid of the chosen experts' logits, not renormalised (Llama4TextMoe's router)
_FACTS = FactKeys(
    ("rms_norm_eps", 1e-5), rope_theta=500_000.0, router=RouterKeys((None, RouterScore.SIGMOID), (None, False))
)

FAMILIES = (
    Family("llama4", _read_llama4, _llama4_fields, 4096 * 32, facts=_FACTS),  # HF Llama4TextConfig
    Family("llama4_text", _read_llama4, _llama4_fields, 4096 * 32, facts=_FACTS),
)
