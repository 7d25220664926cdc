"""Nemotron-H (``nemotron_h``): one block per character of ``hybrid_override_pattern``: a Mamba-2
mixer (M, ``Mixer.MAMBA2``), attention (*) or an MLP (-, ``Mixer.NONE``); M and * blocks have no FFN
(``FFN.NONE``); one norm per block (``block_norms`` 1), no positional embedding (``rotary_fraction``
0); E blocks are MoE FFNs without a mixer (``Mixer.NONE`` and ``FFN.MOE``). Its attention has no positional embedding (HF NemotronHAttention.forward rotates
nothing; Megatron-LM --position-embedding-type none): the partial_rotary_factor its configs carry is
unused (harmless)."""

from __future__ import annotations

from typing import Any

from nestplan.errors import ConfigError, brief, printable
from nestplan.inputs import MISSING
from nestplan.model.families.common import (
    MAX_EXPERTS,
    MAX_FFN,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_POSITIONS,
    ConfigFields,
    Family,
    attention_shape,
    decoder_fields,
    dropout_fields,
    expert_counts,
    routing_groups,
)
from nestplan.model.facts import FactKeys, RouterKeys, RouterScore
from nestplan.model.spec import FFN, Block, Mixer, ModelSpec
from nestplan.model.ssm import Mamba2Shape

# Nemotron-H's hybrid_override_pattern: one character per layer (HF NemotronHConfig._pattern_to_list,
# Megatron-LM --hybrid-override-pattern): the block's mixer and its FFN (E: an MoE one)
_HYBRID_LAYERS = {
    "M": (Mixer.MAMBA2, FFN.NONE),
    "*": (Mixer.ATTENTION, FFN.NONE),
    "-": (Mixer.NONE, FFN.DENSE),
    "E": (Mixer.NONE, FFN.MOE),
}


# the MoE fields HF NemotronHConfig writes for every model, with or without E layers
_NEMOTRON_H_MOE_KEYS = (
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_shared_experts",
    "moe_shared_expert_intermediate_size",
    "n_group",
    "topk_group",
    "moe_latent_size",
)


# HF NemotronHConfig.__post_init__: older configs' names for the Mamba fields
_MAMBA_LEGACY_KEYS = {
    "n_groups": "mamba_n_groups",
    "conv_kernel": "mamba_d_conv",
    "chunk_size": "mamba_chunk_size",
    "use_conv_bias": "mamba_conv_bias",
}


def _mamba_key(f: ConfigFields, key: str) -> str:
    """``key``, or its older name where a config uses that instead (HF NemotronHConfig reads both)."""
    legacy = _MAMBA_LEGACY_KEYS.get(key)
    return legacy if legacy is not None and not f.has(key) and f.has(legacy) else key


# layers_block_type entries (the list newer HF NemotronHConfig versions store instead of the pattern;
# older names and the current ones, NemotronHConfig._pattern_to_list) as pattern characters
_BLOCK_TYPE_CHARS = {
    "mamba": "M",
    "linear_attention": "M",
    "attention": "*",
    "full_attention": "*",
    "mlp": "-",
    "moe": "E",
}


def _pattern_from_block_types(f: ConfigFields) -> str:
    """``layers_block_type`` as a ``hybrid_override_pattern``."""
    kinds = f.raw("layers_block_type")
    if not isinstance(kinds, list):
        raise f.error(
            f"field 'layers_block_type' must be a list of layer types, got {brief(kinds)}",
            "layers_block_type",
            brief(kinds),
            list(_BLOCK_TYPE_CHARS),
        )
    for kind in kinds:
        if not isinstance(kind, str) or kind not in _BLOCK_TYPE_CHARS:
            raise f.error(
                f"field 'layers_block_type' has {brief(kind)}, not a layer type nestplan honours; "
                f"allowed: {', '.join(_BLOCK_TYPE_CHARS)}",
                "layers_block_type",
                brief(kind),
                list(_BLOCK_TYPE_CHARS),
            )
    return "".join(_BLOCK_TYPE_CHARS[kind] for kind in kinds)


def _hybrid_pattern(f: ConfigFields) -> str:
    """``hybrid_override_pattern`` (or, where a config has only that, ``layers_block_type``), checked:
    M, *, - and E only, as many characters as ``num_hidden_layers`` where that is given."""
    if not f.has("hybrid_override_pattern") and f.has("layers_block_type"):
        return _checked_length(f, _pattern_from_block_types(f), "layers_block_type")
    pattern = f.raw("hybrid_override_pattern")
    if not isinstance(pattern, str) or not 1 <= len(pattern) <= MAX_LAYERS:
        raise f.error(
            f"field 'hybrid_override_pattern' must be a string of 1..{MAX_LAYERS} layer characters, "
            f"got {brief(pattern)}",
            "hybrid_override_pattern",
            brief(pattern),
            "M, *, -, E",
        )
    for char in pattern:
        if char not in _HYBRID_LAYERS:
            raise f.error(
                f"field 'hybrid_override_pattern' has {brief(char)}, not a layer type nestplan honours; "
                "allowed: M (Mamba-2), * (attention), - (MLP), E (MoE)",
                "hybrid_override_pattern",
                brief(char),
                list(_HYBRID_LAYERS),
            )
    return _checked_length(f, pattern, "hybrid_override_pattern")


def _checked_length(f: ConfigFields, pattern: str, key: str) -> str:
    """``pattern`` (from field ``key``): 1..MAX_LAYERS layers, as many as ``num_hidden_layers`` where given."""
    if not 1 <= len(pattern) <= MAX_LAYERS:
        raise f.error(
            f"field '{key}' must give 1..{MAX_LAYERS} layers, got {len(pattern)}", key, len(pattern), f"1..{MAX_LAYERS}"
        )
    layers = f.integer("num_hidden_layers", MAX_LAYERS, default=len(pattern))
    if layers != len(pattern):
        raise f.error(
            f"num_hidden_layers {layers} differs from the {len(pattern)} layers of '{key}'",
            "num_hidden_layers",
            layers,
            len(pattern),
        )
    return pattern


def _mamba_shape(f: ConfigFields) -> Mamba2Shape:
    """The Mamba-2 mixers' sizes, HF NemotronHConfig's defaults where absent (128 heads of 64, state
    128, 8 groups, conv kernel 4, chunks of 128, a conv bias); heads must split evenly into groups
    (Megatron-core MambaMixer asserts nheads % ngroups == 0)."""
    heads = f.integer("mamba_num_heads", MAX_HEADS, default=128)
    groups = f.integer(_mamba_key(f, "n_groups"), MAX_HEADS, default=8)
    if heads % groups:
        raise f.error(f"n_groups {groups} does not divide mamba_num_heads {heads}", "n_groups", groups, heads)
    return Mamba2Shape(
        num_heads=heads,
        head_dim=f.integer("mamba_head_dim", MAX_HEAD_DIM, default=64),
        state_size=f.integer("ssm_state_size", MAX_HEAD_DIM, default=128),
        groups=groups,
        conv_kernel=f.integer(_mamba_key(f, "conv_kernel"), MAX_HEAD_DIM, default=4),
        chunk_size=f.integer(_mamba_key(f, "chunk_size"), MAX_POSITIONS, default=128),
        conv_bias=f.flag(_mamba_key(f, "use_conv_bias"), True),
    )


def _nemotron_h_experts(f: ConfigFields, pattern: str) -> dict[str, Any]:
    """The MoE of the E layers (HF NemotronHMoE; Nemotron 3 Nano): ``n_routed_experts`` non-gated
    squared-ReLU experts of ``moe_intermediate_size``, ``num_experts_per_tok`` of them per token chosen
    by a sigmoid router with a correction bias per expert (``e_score_correction_bias``) within
    ``topk_group`` of ``n_group`` groups, and one shared expert of ``moe_shared_expert_intermediate_size``
    (NemotronHMoE builds exactly one: ``n_shared_experts`` other than 1 is refused). A latent expert
    projection (``moe_latent_size``, Nemotron 3 Super) is refused. Without E layers the MoE fields HF
    writes for every model are ignored."""
    if "E" not in pattern:
        for key in _NEMOTRON_H_MOE_KEYS:
            f.has(key)
        return {}
    if f.has("moe_latent_size"):
        raise f.error(
            "field 'moe_latent_size' (latent expert projections) changes the architecture and nestplan "
            "does not honour it; remove it or set it to null",
            "moe_latent_size",
            brief(f.raw("moe_latent_size")),
        )
    if f.integer("n_shared_experts", MAX_EXPERTS, default=1, minimum=0) != 1:
        raise f.error(
            "field 'n_shared_experts' must be 1 (HF NemotronHMoE builds one shared expert)",
            "n_shared_experts",
            f.raw("n_shared_experts"),
            1,
        )
    experts, top_k = expert_counts(f, "n_routed_experts")
    return {
        "num_experts": experts,
        "experts_per_token": top_k,
        "moe_ffn_hidden_size": f.integer("moe_intermediate_size", MAX_FFN),
        "num_shared_experts": 1,
        "shared_expert_ffn_hidden_size": f.integer("moe_shared_expert_intermediate_size", MAX_FFN),
        "router_bias": True,
        "router_scores_all_experts": True,
        **routing_groups(f, experts, top_k, grouped=True),
    }


def _read_nemotron_h(f: ConfigFields, name: str) -> ModelSpec:
    """Nemotron-H (HF modeling_nemotron_h; NVIDIA 2025, arXiv 2504.03624 section 2.1): one block per
    character of ``hybrid_override_pattern``, each a pre-RMSNorm and one of a Mamba-2 mixer (M), GQA
    attention without positional embeddings (*: Megatron-LM --position-embedding-type none) or a
    squared-ReLU MLP of two projections (-) or an MoE of such experts (E: ``_nemotron_h_experts``). No
    biases: ``use_bias`` (Mamba projections), ``mlp_bias`` and ``attention_bias`` set to true are
    refused. ``intermediate_size`` (the MLP's width) may be absent where no layer is an MLP."""
    pattern = _hybrid_pattern(f)
    shape = attention_shape(
        f, "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", head_dim_default=128
    )
    for key in ("use_bias", "mlp_bias", "attention_bias"):
        if f.flag(key, False):
            raise f.error(f"field '{key}' is true; nestplan counts Nemotron-H without biases", key, True, "false")
    moe = _nemotron_h_experts(f, pattern)
    mlp_default = moe["moe_ffn_hidden_size"] if moe and "-" not in pattern else MISSING
    blocks = tuple(Block(*_HYBRID_LAYERS[char]) for char in pattern)
    return ModelSpec(
        **decoder_fields(f, name, shape, blocks, ("intermediate_size", mlp_default)),
        gated_mlp=False,
        learned_position_embeddings=False,
        norm="rmsnorm",
        linear_bias=False,
        dropout=f.any_dropout({"attention_dropout": 0.0, "hidden_dropout": 0.0}),
        rotary_fraction=0.0,
        block_norms=1,
        mamba=_mamba_shape(f),
        **moe,
    )


def _nemotron_h_fields(spec: ModelSpec) -> dict[str, Any]:
    """Nemotron-H: the layers as ``hybrid_override_pattern`` (a block of attention and an MLP has no
    character: such a spec cannot be written), the Mamba-2 sizes and the E layers' experts."""
    chars = {kind: char for char, kind in _HYBRID_LAYERS.items()}
    kinds = [(block.mixer, block.ffn) for block in spec.blocks]
    unwritable = next((i for i, kind in enumerate(kinds) if kind not in chars), None)
    if unwritable is not None or spec.mamba is None:
        what = "no Mamba-2 sizes" if unwritable is None else f"layer {unwritable} with a mixer and an FFN"
        raise ConfigError(
            f"model {printable(spec.name)} cannot be written as a nemotron_h config.json: it has {what}",
            field="mamba" if unwritable is None else "blocks",
        )
    pattern, m = "".join(chars[kind] for kind in kinds), spec.mamba
    return {
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "hybrid_override_pattern": pattern,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.ffn_hidden_size,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": spec.tied_embeddings,
        "max_position_embeddings": spec.max_position_embeddings,
        "mamba_num_heads": m.num_heads,
        "mamba_head_dim": m.head_dim,
        "ssm_state_size": m.state_size,
        "n_groups": m.groups,
        "conv_kernel": m.conv_kernel,
        "chunk_size": m.chunk_size,
        "use_conv_bias": m.conv_bias,
        **dropout_fields(spec, "attention_dropout", "hidden_dropout"),
        **(_nemotron_h_expert_fields(spec) if spec.is_moe else {}),
    }


def _nemotron_h_expert_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        "n_routed_experts": spec.num_experts,
        "num_experts_per_tok": spec.experts_per_token,
        "moe_intermediate_size": spec.moe_ffn_hidden_size,
        "n_shared_experts": spec.num_shared_experts,
        "moe_shared_expert_intermediate_size": spec.shared_expert_ffn_hidden_size,
        "n_group": spec.routing_groups,
        "topk_group": spec.routing_groups_per_token,
    }


# HF NemotronHConfig: no rotary positions; its MoE router a sigmoid with a correction bias (DeepSeek-V3's)
_FACTS = FactKeys(
    ("layer_norm_epsilon", 1e-5),
    ("mlp_hidden_act", "relu2"),
    rope_theta=None,
    router=RouterKeys((None, RouterScore.SIGMOID), ("norm_topk_prob", True), ("routed_scaling_factor", 1.0)),
)

FAMILIES = (
    Family(
        "nemotron_h", _read_nemotron_h, _nemotron_h_fields, 4096, harmless_keys=("partial_rotary_factor",), facts=_FACTS
    ),
)
