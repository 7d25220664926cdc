"""Read a Hugging Face style ``config.json`` into a :class:`ModelSpec` (:func:`parse_config`), and
write a ModelSpec back as one (:func:`config_dict`, its inverse).

The dict is read directly (no ``transformers`` import, no download), with each
family's own field names. A field that is absent (or ``null``) takes the
default the family's ``transformers`` configuration class gives it, except
for the sizes that define a model (hidden size, layers, heads, FFN width,
vocabulary, expert counts), which are required.

Choices other modules rely on:

* ``num_key_value_heads`` defaults to the number of attention heads for every
  family (MHA), and ``head_dim`` (rotary families only) to hidden / heads.
* ``ffn_hidden_size`` is the dense MLP width. Mixtral has no dense MLP: its
  ``intermediate_size`` is the expert width and fills both ``ffn_hidden_size``
  and ``moe_ffn_hidden_size``. Qwen MoE families fill ``ffn_hidden_size`` from
  ``intermediate_size`` (used by the layers listed in ``mlp_only_layers`` or
  skipped by ``decoder_sparse_step``); when every layer is MoE the field may be
  absent and then equals the expert width.
* ``moe_layers``: every layer for Mixtral; for Qwen MoE families the layers
  ``i`` with ``i not in mlp_only_layers`` and ``(i + 1) % decoder_sparse_step
  == 0`` (as in ``transformers``' Qwen2MoE/Qwen3MoE decoder layers).
* Qwen2-MoE has one shared expert of ``shared_expert_intermediate_size``
  (``num_shared_experts`` = 1, or 0 when that size is 0).
* ``linear_bias``: GPT-2, GPT-NeoX and BERT have biases everywhere; Llama
  reads ``attention_bias`` or ``mlp_bias``; Qwen3, Qwen3-MoE and OLMo 2 read
  ``attention_bias``. Qwen2 and Qwen2-MoE have biases on the Q, K and V
  projections only: ``qkv_bias`` (``linear_bias=False``).
* Sliding windows (``sliding_window``, ``sliding_window_layers``): Mistral,
  Mixtral and Phi-3 apply ``sliding_window`` to every layer; the Qwen families
  where ``use_sliding_window`` from ``max_window_layers`` on; Gemma 2 and 3 on
  their local layers; ``layer_types`` ("full_attention", "sliding_attention")
  names them where the family has it. null means full attention.
* A config whose ``text_config`` is an object (multimodal wrappers) is read from it.
* A key of ``_ARCHITECTURE_KEYS`` that the family's reader does not read, set to
  anything but null/false/0/[], is refused (``_HARMLESS_KEYS`` exempts a few).
* ``dropout`` is True when any of the family's dropout probabilities is > 0
  (GPT-2 and BERT default to 0.1, the others to 0.0).
* Nemotron (``NemotronForCausalLM``) is a rotary decoder with a non-gated MLP of two
  projections (up, down: squared ReLU, ``hidden_act`` "relu2", whatever the activation),
  LayerNorm (its layernorm1p stores weight - 1: the same 2 h parameters) and rotary
  positions on ``partial_rotary_factor`` (default 0.5) of each head, ``rotary_fraction``;
  biases as Llama.
* Nemotron-H (``nemotron_h``) has one block per character of ``hybrid_override_pattern``: a Mamba-2
  mixer (M, ``mamba_layers``), attention (*) or an MLP (-, ``mixerless_layers``); M and * blocks are
  ``ffn_free_layers``; one norm per block (``block_norms`` 1), no positional embedding (``rotary_fraction``
  0); E blocks are MoE FFNs without a mixer (``mixerless_layers`` and ``moe_layers``).
* Jamba (``jamba``): attention every ``attn_layer_period``-th layer from ``attn_layer_offset``, Mamba-1
  mixers (``model.ssm.Mamba1Shape``) in the others (``mamba_layers``), MoE every
  ``expert_layer_period``-th layer from ``expert_layer_offset``; no positional embedding.
* DeepSeek-V2/V3 (``_read_deepseek``): multi-head latent attention (``q_lora_rank``, ``kv_lora_rank``,
  ``head_dim`` = nope + rope, ``v_head_dim``), MoE from ``first_k_dense_replace`` on with shared
  experts, node-limited routing (``routing_groups``), MTP modules (``mtp_layers``, counted apart).
  Llama 4 (``llama4``, ``llama4_text``): MoE layers with one shared expert, chunked attention on the
  rotary layers, NoPE global layers, a weightless L2 QK-norm. gpt-oss: attention sinks, biased experts
  and router, alternating windows. Falcon: the parallel attention + MLP block (``parallel_block``).
  Inconsistent expert counts (top-k above the experts, topk_group above n_group, n_group not dividing
  the experts) are refused naming the field.
* Every size is a JSON integer (not ``2.0``, not ``true``) between 1 and a bound
  (``MAX_LAYERS`` ...): far beyond any published model, but finite, so the planner's
  work stays bounded and no count overflows.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from nestplan import catalog
from nestplan.errors import ConfigError, brief, printable
from nestplan.inputs import check_string, load_object
from nestplan.model.spec import SUPPORTED_FAMILIES, ModelSpec
from nestplan.model.ssm import Mamba1Shape, Mamba2Shape

_MISSING: Any = object()

# Bounds on a config's sizes: generous, but finite, so that the planner's work stays bounded and
# parameter bytes at every bound at once (1024 x 4096 experts x 3 x 2^16 x 2^18 x 16 B) stay below 2^63.
MAX_LAYERS = 1024  # the deepest published transformer (DeepNet, Wang et al. 2022) has 1,000; planning is ~ layers^2
MAX_HIDDEN = 2**16  # 65,536: the widest published model (Megatron 1T, Korthikanti et al. 2022) has 25,600
MAX_HEADS = 2**12  # 4,096 attention or key/value heads: published models have at most 160
MAX_HEAD_DIM = 2**12  # an explicit head_dim: published models use 64 to 256
MAX_FFN = 2**18  # 262,144 = 4 x MAX_HIDDEN (GPT-2's default n_inner): the widest published MLP is 102,400
MAX_VOCAB = 2**24  # 16.8 M tokens: published vocabularies have at most ~262,000
MAX_POSITIONS = 2**24  # 16.8 M positions: the longest published context is 10 M tokens (Llama 4 Scout)
MAX_EXPERTS = 2**12  # 4,096 experts: Switch-C (Fedus et al. 2022) has 2,048
MAX_NAME_CHARS = 200  # a model's name labels plans, tables and exported files

# transformers' default max_position_embeddings (n_positions for gpt2) per family
_DEFAULT_MAX_POSITIONS = {
    "llama": 2048,
    "mistral": 4096 * 32,
    "mixtral": 4096 * 32,
    "qwen2": 32768,
    "qwen2_moe": 32768,
    "qwen3": 32768,
    "qwen3_moe": 32768,
    "phi3": 4096,
    "olmo2": 2048,
    "gemma2": 8192,
    "gemma3": 131072,
    "gemma3_text": 131072,
    "nemotron": 4096,
    "nemotron_h": 4096,
    "jamba": 262144,
    "gpt2": 1024,
    "gpt_neox": 2048,
    "bert": 512,
    "deepseek_v2": 2048,  # HF DeepseekV2Config
    "deepseek_v3": 4096,  # HF DeepseekV3Config
    "llama4": 4096 * 32,  # HF Llama4TextConfig
    "llama4_text": 4096 * 32,
    "gpt_oss": 131072,  # HF GptOssConfig
    "falcon": 2048,  # HF FalconConfig
}


# Keys that change the architecture in some family's configuration (the families nestplan reads and
# those it does not yet: DeepSeek's latent attention and routed experts, Llama 4's chunked attention and
# interleaved MoE, Falcon's parallel block, ...). A reader that does not read one of them cannot honour
# it: a config that sets it (to anything but null, false, 0 or an empty list) is refused, naming it.
_ARCHITECTURE_KEYS = (
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_shared_experts",
    "shared_expert_intermediate_size",
    "decoder_sparse_step",
    "mlp_only_layers",
    "first_k_dense_replace",
    "moe_layer_freq",
    "interleave_moe_layer_step",
    "num_nextn_predict_layers",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "sliding_window_pattern",
    "attention_chunk_size",
    "no_rope_layers",
    "head_dim",
    "partial_rotary_factor",
    "rotary_pct",
    "parallel_attn",
    "parallel_attention",
    "new_decoder_architecture",
    "use_parallel_residual",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "use_qk_norm",
    "qk_layernorm",
    "mamba_d_state",
    "ssm_state_size",
    "hybrid_override_pattern",
    "attn_layer_period",
    "expert_layer_period",
    "n_group",
    "topk_group",
    "moe_layers",
    "intermediate_size_mlp",
    "use_qk_norm",
    "alibi",
    "multi_query",
    "num_kv_heads",
    "num_ln_in_parallel_attn",
)
# Keys among those above that a family's transformers model applies without changing any parameter,
# FLOP or stored byte nestplan counts (logit soft-capping: a tanh on the scores and logits, Gemma 2
# report, Gemma Team 2024, arXiv 2408.00118 section 2; with flash attention it runs inside the kernel)
_HARMLESS_KEYS = {
    "gemma2": ("attn_logit_softcapping", "final_logit_softcapping"),
    "gemma3": ("attn_logit_softcapping", "final_logit_softcapping"),
    "gemma3_text": ("attn_logit_softcapping", "final_logit_softcapping"),
    # GPT-NeoX's parallel residual (x + attn(ln1(x)) + mlp(ln2(x))) has the sequential block's GEMMs
    # and norms; rotary_pct changes only which channels RoPE rotates
    "gpt_neox": ("use_parallel_residual", "rotary_pct"),
    # Nemotron-H's attention has no positional embedding (HF NemotronHAttention.forward rotates nothing;
    # Megatron-LM --position-embedding-type none): the partial_rotary_factor its configs carry is unused
    "nemotron_h": ("partial_rotary_factor",),
}

# model_type values of configs whose model is a supported family's (read as that family): Kimi K2's
# config.json (model_type "kimi_k2", architectures DeepseekV3ForCausalLM: its remote code is DeepSeek-V3's)
_SAME_ARCHITECTURE = {"kimi_k2": "deepseek_v3"}

# layer_types entries (transformers >= 4.53) and whether the layer attends to a sliding window
_LAYER_TYPES = {"full_attention": False, "sliding_attention": True}


class _Fields:
    """Typed access to one config dict; every error names the family and the field. It records the
    keys the reader looks at (:meth:`check_unread`)."""

    def __init__(self, data: dict, family: str) -> None:
        self.data = data
        self.family = family
        self.read: set[str] = set()

    def check_unread(self) -> None:
        """Refuse an architecture key that is set but that the family's reader did not read."""
        harmless = _HARMLESS_KEYS.get(self.family, ())
        for key in _ARCHITECTURE_KEYS:
            value = self.data.get(key)
            if key not in self.read and key not in harmless and value not in (None, False, 0, []):
                raise self.error(
                    f"field '{key}' changes the architecture and nestplan does not honour it in "
                    f"a {self.family} model; remove it or use a family that reads it",
                    key,
                    brief(value),
                )

    def error(self, message: str, key: str | None = None, value: Any = None, limit: Any = None) -> ConfigError:
        return ConfigError(f"config.json ({self.family}): {message}", field=key, value=value, limit=limit)

    def has(self, key: str) -> bool:
        self.read.add(key)
        return self.data.get(key) is not None

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        self.read.add(key)
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                raise self.error(f"missing field '{key}'", key)
            return default
        return value

    def integer(self, key: str, maximum: int, default: Any = _MISSING, minimum: int = 1) -> int:
        """A JSON integer (not a bool, not ``2.0``) in ``minimum..maximum``."""
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise self.error(
                f"field '{key}' must be an integer in {minimum}..{maximum}, got {brief(value)}",
                key,
                brief(value),
                f"{minimum}..{maximum}",
            )
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.error(
                f"field '{key}' must be true or false, got {brief(value)}", key, brief(value), "true, false"
            )
        return value

    def probability(self, key: str, default: float) -> float:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            raise self.error(
                f"field '{key}' must be a probability in [0, 1], got {brief(value)}", key, brief(value), "[0, 1]"
            )
        return float(value)

    def fraction(self, key: str, default: float) -> float:
        """A number in (0, 1] (not a bool)."""
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
            raise self.error(
                f"field '{key}' must be a number in (0, 1], got {brief(value)}", key, brief(value), "(0, 1]"
            )
        return float(value)

    def any_dropout(self, defaults: dict[str, float]) -> bool:
        return any(self.probability(key, default) > 0.0 for key, default in defaults.items())

    def layer_indices(self, key: str, num_layers: int) -> tuple[int, ...]:
        value = self.raw(key, [])
        if not isinstance(value, list):
            raise self.error(
                f"field '{key}' must be a list of layer indices, got {brief(value)}",
                key,
                brief(value),
                "a list of layer indices",
            )
        for index in value:
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < num_layers:
                raise self.error(
                    f"field '{key}' has layer index {brief(index)}; allowed: integers 0..{num_layers - 1}",
                    key,
                    brief(index),
                    f"0..{num_layers - 1}",
                )
        return tuple(sorted(set(value)))

    def window(self, default: int | None) -> int | None:
        """``sliding_window`` in keys: ``default`` when absent, None (full attention) when null."""
        self.read.add("sliding_window")
        if "sliding_window" in self.data and self.data["sliding_window"] is None:
            return None
        if default is None and not self.has("sliding_window"):
            return None
        return self.integer("sliding_window", MAX_POSITIONS, default=default)

    def sliding_layers(self, num_layers: int, default: Callable[[int], bool]) -> tuple[int, ...]:
        """Indices of the windowed layers: from ``layer_types`` where given, else ``default(index)``."""
        kinds = self.raw("layer_types", None)
        if kinds is None:
            return tuple(i for i in range(num_layers) if default(i))
        if not isinstance(kinds, list) or len(kinds) != num_layers:
            raise self.error(
                f"field 'layer_types' must be a list of {num_layers} layer types, got {brief(kinds)}",
                "layer_types",
                brief(kinds),
                f"{num_layers} of {', '.join(_LAYER_TYPES)}",
            )
        for kind in kinds:
            if not isinstance(kind, str) or kind not in _LAYER_TYPES:
                raise self.error(
                    f"field 'layer_types' has layer type {brief(kind)}, which nestplan does not "
                    f"honour; allowed: {', '.join(_LAYER_TYPES)}",
                    "layer_types",
                    brief(kind),
                    list(_LAYER_TYPES),
                )
        return tuple(i for i, kind in enumerate(kinds) if _LAYER_TYPES[kind])


def _windows(window: int | None, layers: tuple[int, ...]) -> dict[str, Any]:
    """The spec's sliding-window fields, canonical: no window without windowed layers, and back."""
    if window is None or not layers:
        return {"sliding_window": None, "sliding_window_layers": ()}
    return {"sliding_window": window, "sliding_window_layers": layers}


def _attention_shape(
    f: _Fields,
    hidden_key: str,
    heads_key: str,
    kv_key: str | None,
    head_dim_key: str | None,
    head_dim_default: int | None = None,
) -> tuple[int, int, int, int]:
    """(hidden, heads, kv heads, head dim), with the divisibility checks; the head dim is
    ``head_dim_key``'s value, else ``head_dim_default`` where the family has one, else hidden / heads."""
    hidden = f.integer(hidden_key, MAX_HIDDEN)
    heads = f.integer(heads_key, MAX_HEADS)
    kv_heads = f.integer(kv_key, MAX_HEADS, default=heads) if kv_key else heads
    if head_dim_key and f.has(head_dim_key):
        head_dim = f.integer(head_dim_key, MAX_HEAD_DIM)
    elif head_dim_default is not None:
        head_dim = head_dim_default
    elif hidden % heads:
        raise f.error(
            f"{heads_key} {heads} does not divide {hidden_key} {hidden}"
            + (f" (give '{head_dim_key}' explicitly)" if head_dim_key else ""),
            heads_key,
            heads,
            hidden,
        )
    else:
        head_dim = hidden // heads
    if kv_key and heads % kv_heads:
        raise f.error(f"{kv_key} {kv_heads} does not divide {heads_key} {heads}", kv_key, kv_heads, heads)
    return hidden, heads, kv_heads, head_dim


def _rotary_decoder(f: _Fields, name: str, head_dim_default: int | None = None) -> dict[str, Any]:
    """Fields shared by the Llama-style families (RMSNorm, RoPE, gated SiLU MLP, GQA)."""
    hidden, heads, kv_heads, head_dim = _attention_shape(
        f, "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", head_dim_default
    )
    return dict(
        name=name,
        family=f.family,
        hidden_size=hidden,
        num_layers=f.integer("num_hidden_layers", MAX_LAYERS),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        gated_mlp=True,
        vocab_size=f.integer("vocab_size", MAX_VOCAB),
        tied_embeddings=f.flag("tie_word_embeddings", False),
        max_position_embeddings=f.integer(
            "max_position_embeddings", MAX_POSITIONS, default=_DEFAULT_MAX_POSITIONS[f.family]
        ),
        learned_position_embeddings=False,
        norm="rmsnorm",
        linear_bias=False,
        dropout=f.any_dropout({"attention_dropout": 0.0}),
    )


def _experts(f: _Fields, experts_key: str) -> tuple[int, int]:
    experts = f.integer(experts_key, MAX_EXPERTS)
    top_k = f.integer("num_experts_per_tok", MAX_EXPERTS)
    if top_k > experts:
        raise f.error(
            f"num_experts_per_tok {top_k} exceeds {experts_key} {experts}", "num_experts_per_tok", top_k, experts
        )
    return experts, top_k


def _read_llama(f: _Fields, name: str) -> ModelSpec:
    bias = f.flag("attention_bias", False) or f.flag("mlp_bias", False)
    fields = _rotary_decoder(f, name) | {"linear_bias": bias}
    return ModelSpec(ffn_hidden_size=f.integer("intermediate_size", MAX_FFN), **fields)


def _read_nemotron(f: _Fields, name: str) -> ModelSpec:
    """Nemotron: the rotary decoder's attention with a squared-ReLU MLP of two projections, LayerNorm
    and partial rotary positions (HF NemotronConfig: partial_rotary_factor 0.5, no biases by default)."""
    fields = _rotary_decoder(f, name) | {
        "gated_mlp": False,
        "norm": "layernorm",
        "linear_bias": f.flag("attention_bias", False) or f.flag("mlp_bias", False),
        "rotary_fraction": f.fraction("partial_rotary_factor", 0.5),
    }
    return ModelSpec(ffn_hidden_size=f.integer("intermediate_size", MAX_FFN), **fields)


# Nemotron-H's hybrid_override_pattern: one character per layer (HF NemotronHConfig._pattern_to_list,
# Megatron-LM --hybrid-override-pattern): the block's mixer and whether it has an FFN (E: an MoE one)
_HYBRID_LAYERS = {"M": ("mamba", False), "*": ("attention", False), "-": ("none", True), "E": ("none", True)}
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


def _mamba_key(f: _Fields, key: str) -> str:
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


def _pattern_from_block_types(f: _Fields) -> str:
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


def _hybrid_pattern(f: _Fields) -> str:
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


def _checked_length(f: _Fields, pattern: str, key: str) -> str:
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


def _mamba_shape(f: _Fields) -> Mamba2Shape:
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


def _nemotron_h_experts(f: _Fields, pattern: str) -> dict[str, Any]:
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
    experts, top_k = _experts(f, "n_routed_experts")
    return {
        "num_experts": experts,
        "experts_per_token": top_k,
        "moe_ffn_hidden_size": f.integer("moe_intermediate_size", MAX_FFN),
        "num_shared_experts": 1,
        "shared_expert_ffn_hidden_size": f.integer("moe_shared_expert_intermediate_size", MAX_FFN),
        "moe_layers": tuple(i for i, char in enumerate(pattern) if char == "E"),
        "router_bias": True,
        "router_scores_all_experts": True,
        **_routing_groups(f, experts, top_k, grouped=True),
    }


def _read_nemotron_h(f: _Fields, name: str) -> ModelSpec:
    """Nemotron-H (HF modeling_nemotron_h; NVIDIA 2025, arXiv 2504.03624 section 2.1): one block per
    character of ``hybrid_override_pattern``, each a pre-RMSNorm and one of a Mamba-2 mixer (M), GQA
    attention without positional embeddings (*: Megatron-LM --position-embedding-type none) or a
    squared-ReLU MLP of two projections (-) or an MoE of such experts (E: ``_nemotron_h_experts``). No
    biases: ``use_bias`` (Mamba projections), ``mlp_bias`` and ``attention_bias`` set to true are
    refused. ``intermediate_size`` (the MLP's width) may be absent where no layer is an MLP."""
    pattern = _hybrid_pattern(f)
    hidden, heads, kv_heads, head_dim = _attention_shape(
        f, "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", head_dim_default=128
    )
    for key in ("use_bias", "mlp_bias", "attention_bias"):
        if f.flag(key, False):
            raise f.error(f"field '{key}' is true; nestplan counts Nemotron-H without biases", key, True, "false")
    kinds = [_HYBRID_LAYERS[char] for char in pattern]
    moe = _nemotron_h_experts(f, pattern)
    mlp_default = moe["moe_ffn_hidden_size"] if moe and "-" not in pattern else _MISSING
    return ModelSpec(
        name=name,
        family=f.family,
        hidden_size=hidden,
        num_layers=len(pattern),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        ffn_hidden_size=f.integer("intermediate_size", MAX_FFN, default=mlp_default),
        gated_mlp=False,
        vocab_size=f.integer("vocab_size", MAX_VOCAB),
        tied_embeddings=f.flag("tie_word_embeddings", False),
        max_position_embeddings=f.integer(
            "max_position_embeddings", MAX_POSITIONS, default=_DEFAULT_MAX_POSITIONS[f.family]
        ),
        learned_position_embeddings=False,
        norm="rmsnorm",
        linear_bias=False,
        dropout=f.any_dropout({"attention_dropout": 0.0, "hidden_dropout": 0.0}),
        rotary_fraction=0.0,
        block_norms=1,
        mamba=_mamba_shape(f),
        mamba_layers=tuple(i for i, (mixer, _) in enumerate(kinds) if mixer == "mamba"),
        mixerless_layers=tuple(i for i, (mixer, _) in enumerate(kinds) if mixer == "none"),
        ffn_free_layers=tuple(i for i, (_, mlp) in enumerate(kinds) if not mlp),
        **moe,
    )


def _periodic_layers(
    f: _Fields, num_layers: int, period_key: str, offset_key: str, period: int, offset: int
) -> tuple[int, ...]:
    """The layers ``i`` with ``i % period == offset`` (Jamba's attention and expert layers)."""
    every = f.integer(period_key, MAX_LAYERS, default=period)
    first = f.integer(offset_key, MAX_LAYERS, default=offset, minimum=0)
    if first >= every:
        raise f.error(f"{offset_key} {first} must be below {period_key} {every}", offset_key, first, f"0..{every - 1}")
    return tuple(i for i in range(num_layers) if i % every == first)


def _mamba1_shape(f: _Fields, hidden: int) -> Mamba1Shape:
    """Jamba's selective-SSM mixers (HF JambaConfig defaults: state 16, conv 4, expand 2, dt rank
    "auto" = ceil(hidden / 16), a conv bias); ``mamba_proj_bias`` set to true is refused."""
    if f.flag("mamba_proj_bias", False):
        raise f.error(
            "field 'mamba_proj_bias' is true; nestplan counts Jamba's Mamba projections without biases",
            "mamba_proj_bias",
            True,
            "false",
        )
    rank = f.raw("mamba_dt_rank", "auto")
    dt_rank = -(-hidden // 16) if rank == "auto" else f.integer("mamba_dt_rank", MAX_HIDDEN)
    return Mamba1Shape(
        inner=f.integer("mamba_expand", 64, default=2) * hidden,
        state_size=f.integer("mamba_d_state", MAX_HEAD_DIM, default=16),
        conv_kernel=f.integer("mamba_d_conv", MAX_HEAD_DIM, default=4),
        dt_rank=dt_rank,
        conv_bias=f.flag("mamba_conv_bias", True),
    )


def _read_jamba(f: _Fields, name: str) -> ModelSpec:
    """Jamba (HF modeling_jamba; Lieber et al. 2024, arXiv 2403.19887, section 2; Jamba-1.5, arXiv
    2408.12570): every layer a mixer and an FFN, each with its RMSNorm; attention (GQA, no positional
    embedding) in the layers ``i % attn_layer_period == attn_layer_offset`` (default 8, 4), a Mamba-1
    mixer (``_mamba1_shape``) in the others; a top-k MoE of ``num_experts`` SwiGLU experts of
    ``intermediate_size`` in the layers ``i % expert_layer_period == expert_layer_offset`` (default 2,
    1), a dense SwiGLU MLP of the same width in the others (every layer where num_experts is 1)."""
    fields = _rotary_decoder(f, name)
    layers = fields["num_layers"]
    attention = _periodic_layers(f, layers, "attn_layer_period", "attn_layer_offset", 8, 4)
    expert_layers = _periodic_layers(f, layers, "expert_layer_period", "expert_layer_offset", 2, 1)
    ffn = f.integer("intermediate_size", MAX_FFN)
    moe: dict[str, Any] = {}
    if f.integer("num_experts", MAX_EXPERTS) > 1:
        experts, top_k = _experts(f, "num_experts")
        moe = {
            "num_experts": experts,
            "experts_per_token": top_k,
            "moe_ffn_hidden_size": ffn,
            "moe_layers": expert_layers,
        }
    else:
        f.has("num_experts_per_tok")
    return ModelSpec(
        ffn_hidden_size=ffn,
        rotary_fraction=0.0,
        mamba=_mamba1_shape(f, fields["hidden_size"]),
        mamba_layers=tuple(i for i in range(layers) if i not in attention),
        **fields,
        **moe,
    )


def _every_layer(f: _Fields, num_layers: int, default_window: int | None) -> dict[str, Any]:
    """A ``sliding_window`` that applies to every layer (Mistral, Mixtral, Phi-3: HF MistralConfig
    defaults it to 4096, MixtralConfig and Phi3Config to None; null means full attention)."""
    return _windows(f.window(default_window), tuple(range(num_layers)))


def _qwen_windows(f: _Fields, num_layers: int) -> dict[str, Any]:
    """Qwen2/Qwen3 (dense and MoE): ``sliding_window`` (default 4096) only where ``use_sliding_window``
    (default false), in the layers from ``max_window_layers`` (default 28) on, or those ``layer_types``
    names (HF Qwen2Config: layer_types "sliding_attention" where i >= max_window_layers)."""
    window = f.window(4096)
    first = f.integer("max_window_layers", MAX_LAYERS, default=28, minimum=0)
    layers = f.sliding_layers(num_layers, lambda i: i >= first)
    return _windows(window if f.flag("use_sliding_window", False) else None, layers)


def _read_mistral(f: _Fields, name: str) -> ModelSpec:
    fields = _rotary_decoder(f, name)
    return ModelSpec(
        ffn_hidden_size=f.integer("intermediate_size", MAX_FFN), **fields | _every_layer(f, fields["num_layers"], 4096)
    )


def _read_qwen2(f: _Fields, name: str) -> ModelSpec:
    """Qwen2: biases on the Q, K and V projections, none elsewhere (HF modeling_qwen2, Qwen2Attention)."""
    fields = _rotary_decoder(f, name) | {"qkv_bias": True}
    return ModelSpec(
        ffn_hidden_size=f.integer("intermediate_size", MAX_FFN), **fields | _qwen_windows(f, fields["num_layers"])
    )


def _read_qwen3(f: _Fields, name: str) -> ModelSpec:
    """Qwen3 dense: the Llama block with QK-norm, an RMSNorm of head_dim on each query and key head
    before RoPE (HF modeling_qwen3, Qwen3Attention q_norm/k_norm), ``head_dim`` explicit (default 128);
    ``attention_bias`` puts biases on the attention projections (recorded as linear_bias, as for Llama)."""
    fields = _rotary_decoder(f, name, head_dim_default=128) | {
        "qk_norm": "head",
        "linear_bias": f.flag("attention_bias", False),
    }
    return ModelSpec(
        ffn_hidden_size=f.integer("intermediate_size", MAX_FFN), **fields | _qwen_windows(f, fields["num_layers"])
    )


def _read_phi3(f: _Fields, name: str) -> ModelSpec:
    """Phi-3: the Llama block with fused qkv_proj and gate_up_proj (the same weights and FLOPs as the
    separate projections, HF modeling_phi3), a ``sliding_window`` on every layer where set, rotary
    positions on ``partial_rotary_factor`` (default 1) of each head."""
    fields = _rotary_decoder(f, name) | {
        "rotary_fraction": f.fraction("partial_rotary_factor", 1.0),
        "dropout": f.any_dropout({"attention_dropout": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0}),
    }
    return ModelSpec(
        ffn_hidden_size=f.integer("intermediate_size", MAX_FFN), **fields | _every_layer(f, fields["num_layers"], None)
    )


def _read_olmo2(f: _Fields, name: str) -> ModelSpec:
    """OLMo 2: the Llama block with its two norms after attention and after the MLP instead of before
    (the same parameters) and QK-norm over the full query and key widths (HF modeling_olmo2; OLMo
    Team 2024, "2 OLMo 2 Furious", arXiv 2501.00656 section 3)."""
    fields = _rotary_decoder(f, name) | {"qk_norm": "full", "linear_bias": f.flag("attention_bias", False)}
    return ModelSpec(ffn_hidden_size=f.integer("intermediate_size", MAX_FFN), **fields)


def _read_gemma(f: _Fields, name: str) -> ModelSpec:
    """Gemma 2 and Gemma 3 (text): four RMSNorms per block (before and after attention and the MLP),
    a gated GeLU MLP, tied embeddings, ``head_dim`` explicit (default 256), local sliding-window layers
    between global ones: Gemma 2 every other layer from the first (HF Gemma2Config layer_types:
    sliding where (i + 1) % 2), Gemma 3 all but every ``sliding_window_pattern``-th (default 6: 5 local
    to 1 global, Gemma 3 report arXiv 2503.19786 section 2.2), window default 4096; Gemma 3 adds QK-norm
    of head_dim (HF modeling_gemma3 q_norm/k_norm). The embedding scale by sqrt(hidden) and soft-capping
    add no parameters and no FLOPs worth counting."""
    fields = _rotary_decoder(f, name, head_dim_default=256) | {
        "tied_embeddings": f.flag("tie_word_embeddings", True),
        "block_norms": 4,
    }
    window = f.window(4096)
    if f.family == "gemma2":
        layers = f.sliding_layers(fields["num_layers"], lambda i: (i + 1) % 2 != 0)
    else:
        pattern = f.integer("sliding_window_pattern", MAX_LAYERS, default=6)
        layers = f.sliding_layers(fields["num_layers"], lambda i: (i + 1) % pattern != 0)
        fields["qk_norm"] = "head"
    return ModelSpec(ffn_hidden_size=f.integer("intermediate_size", MAX_FFN), **fields | _windows(window, layers))


def _read_mixtral(f: _Fields, name: str) -> ModelSpec:
    fields = _rotary_decoder(f, name)
    fields |= _every_layer(f, fields["num_layers"], None)
    experts, top_k = _experts(f, "num_local_experts")
    expert_ffn = f.integer("intermediate_size", MAX_FFN)
    return ModelSpec(
        ffn_hidden_size=expert_ffn,
        num_experts=experts,
        experts_per_token=top_k,
        moe_ffn_hidden_size=expert_ffn,
        moe_layers=tuple(range(fields["num_layers"])),
        **fields,
    )


def _read_qwen_moe(f: _Fields, name: str) -> ModelSpec:
    """qwen2_moe (one shared expert, Q/K/V biases) and qwen3_moe (no shared expert, QK-norm)."""
    fields = _rotary_decoder(f, name)
    num_layers = fields["num_layers"]
    experts, top_k = _experts(f, "num_experts")
    expert_ffn = f.integer("moe_intermediate_size", MAX_FFN)
    step = f.integer("decoder_sparse_step", MAX_LAYERS, default=1)
    dense_only = f.layer_indices("mlp_only_layers", num_layers)
    moe_layers = tuple(i for i in range(num_layers) if i not in dense_only and (i + 1) % step == 0)
    has_dense = len(moe_layers) < num_layers
    dense_ffn = f.integer("intermediate_size", MAX_FFN, default=_MISSING if has_dense else expert_ffn)
    shared_ffn = 0
    fields |= _qwen_windows(f, num_layers)
    if f.family == "qwen2_moe":
        shared_ffn = f.integer("shared_expert_intermediate_size", MAX_FFN, minimum=0)
        fields["qkv_bias"] = True  # HF modeling_qwen2_moe, Qwen2MoeAttention: q, k, v biased
        # HF Qwen2MoeSparseMoeBlock: a softmax over every expert before the top-k; shared_expert_gate
        fields |= {"router_scores_all_experts": True, "shared_expert_gate": shared_ffn > 0}
    else:  # Qwen3-MoE: QK-norm as dense Qwen3 (HF modeling_qwen3_moe, Qwen3MoeAttention q_norm/k_norm)
        fields |= {"linear_bias": f.flag("attention_bias", False), "qk_norm": "head"}
    return ModelSpec(
        ffn_hidden_size=dense_ffn,
        num_experts=experts,
        experts_per_token=top_k,
        moe_ffn_hidden_size=expert_ffn,
        num_shared_experts=1 if shared_ffn > 0 else 0,
        shared_expert_ffn_hidden_size=shared_ffn,
        moe_layers=moe_layers,
        **fields,
    )


def _read_gpt2(f: _Fields, name: str) -> ModelSpec:
    hidden, heads, _, head_dim = _attention_shape(f, "n_embd", "n_head", None, None)
    return ModelSpec(
        name=name,
        family=f.family,
        hidden_size=hidden,
        num_layers=f.integer("n_layer", MAX_LAYERS),
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=head_dim,
        ffn_hidden_size=f.integer("n_inner", MAX_FFN, default=4 * hidden),
        gated_mlp=False,
        vocab_size=f.integer("vocab_size", MAX_VOCAB),
        tied_embeddings=f.flag("tie_word_embeddings", True),
        max_position_embeddings=f.integer("n_positions", MAX_POSITIONS, default=_DEFAULT_MAX_POSITIONS["gpt2"]),
        learned_position_embeddings=True,
        norm="layernorm",
        linear_bias=True,
        dropout=f.any_dropout({"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}),
    )


def _read_encoder_style(
    f: _Fields,
    name: str,
    *,
    tied: bool,
    learned_positions: bool,
    dropouts: dict[str, float],
    causal: bool = True,
    token_types: bool = False,
) -> ModelSpec:
    """gpt_neox and bert: LayerNorm, GeLU MLP of ``intermediate_size``, biases, MHA."""
    hidden, heads, _, head_dim = _attention_shape(f, "hidden_size", "num_attention_heads", None, None)
    return ModelSpec(
        name=name,
        family=f.family,
        hidden_size=hidden,
        num_layers=f.integer("num_hidden_layers", MAX_LAYERS),
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=head_dim,
        ffn_hidden_size=f.integer("intermediate_size", MAX_FFN),
        gated_mlp=False,
        vocab_size=f.integer("vocab_size", MAX_VOCAB),
        tied_embeddings=f.flag("tie_word_embeddings", tied),
        max_position_embeddings=f.integer(
            "max_position_embeddings", MAX_POSITIONS, default=_DEFAULT_MAX_POSITIONS[f.family]
        ),
        learned_position_embeddings=learned_positions,
        norm="layernorm",
        linear_bias=True,
        dropout=f.any_dropout(dropouts),
        causal=causal,
        type_vocab_size=f.integer("type_vocab_size", MAX_VOCAB, default=2, minimum=0) if token_types else 0,
    )


def _read_gpt_neox(f: _Fields, name: str) -> ModelSpec:
    return _read_encoder_style(
        f, name, tied=False, learned_positions=False, dropouts={"attention_dropout": 0.0, "hidden_dropout": 0.0}
    )


def _read_bert(f: _Fields, name: str) -> ModelSpec:
    return _read_encoder_style(
        f,
        name,
        tied=True,
        learned_positions=True,
        causal=False,
        token_types=True,
        dropouts={"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1},
    )


def _optional_rank(f: _Fields, key: str, default: int) -> int:
    """A latent rank: ``default`` when absent, 0 (no latent) when null or 0."""
    if key in f.data and f.data[key] is None:
        f.read.add(key)
        return 0
    return f.integer(key, MAX_FFN, default=default, minimum=0)


def _routing_groups(f: _Fields, experts: int, top_k: int, grouped: bool) -> dict[str, int]:
    """Node-limited routing (DeepSeek-V2 section 2.2.2 "device-limited routing", DeepSeek-V3 section
    2.1.2): experts in ``n_group`` groups, each token's ``num_experts_per_tok`` chosen within
    ``topk_group`` of them; (1, 1) where the router ignores groups (DeepSeek-V2's "greedy" top-k)."""
    groups = f.integer("n_group", MAX_EXPERTS, default=8 if f.family == "deepseek_v3" else 1)
    per_token = f.integer("topk_group", MAX_EXPERTS, default=4 if f.family == "deepseek_v3" else 1)
    if per_token > groups:
        raise f.error(f"topk_group {per_token} exceeds n_group {groups}", "topk_group", per_token, groups)
    if experts % groups:
        raise f.error(f"n_group {groups} does not divide n_routed_experts {experts}", "n_group", groups, experts)
    if top_k > per_token * (experts // groups):
        raise f.error(
            f"num_experts_per_tok {top_k} exceeds the {per_token * (experts // groups)} experts of "
            f"topk_group {per_token} groups",
            "num_experts_per_tok",
            top_k,
            per_token * (experts // groups),
        )
    if not grouped:
        return {"routing_groups": 1, "routing_groups_per_token": 1}
    return {"routing_groups": groups, "routing_groups_per_token": per_token}


def _read_deepseek(f: _Fields, name: str) -> ModelSpec:
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
    rope = f.integer("qk_rope_head_dim", MAX_HEAD_DIM)
    nope = f.integer("qk_nope_head_dim", MAX_HEAD_DIM)
    fields = _rotary_decoder(f, name, head_dim_default=nope + rope)
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
    num_layers = fields["num_layers"]
    experts, top_k = _experts(f, "n_routed_experts")
    first_dense = f.integer("first_k_dense_replace", MAX_LAYERS, default=0, minimum=0)
    freq = f.integer("moe_layer_freq", MAX_LAYERS, default=1)
    moe_layers = tuple(i for i in range(num_layers) if i >= first_dense and i % freq == 0)
    expert_ffn = f.integer("moe_intermediate_size", MAX_FFN)
    method = f.raw("topk_method", "noaux_tc" if f.family == "deepseek_v3" else "greedy")
    grouped = f.family == "deepseek_v3" or method == "group_limited_greedy"
    fields |= {
        "head_dim": nope + rope,
        "rotary_fraction": rope / (nope + rope),
        "q_lora_rank": _optional_rank(f, "q_lora_rank", 1536),
        "kv_lora_rank": f.integer("kv_lora_rank", MAX_FFN),
        "qk_rope_head_dim": rope,
        "v_head_dim": f.integer("v_head_dim", MAX_HEAD_DIM),
        "router_bias": f.family == "deepseek_v3",
        "router_scores_all_experts": True,  # DeepSeek-V2's softmax, DeepSeek-V3's sigmoid, over every expert
        "mtp_layers": f.integer("num_nextn_predict_layers", MAX_LAYERS, default=0, minimum=0),
        **_routing_groups(f, experts, top_k, grouped),
    }
    shared = f.integer("n_shared_experts", MAX_EXPERTS, default=1 if f.family == "deepseek_v3" else 0, minimum=0)
    return ModelSpec(
        ffn_hidden_size=f.integer("intermediate_size", MAX_FFN, default=_MISSING if first_dense else expert_ffn),
        num_experts=experts,
        experts_per_token=top_k,
        moe_ffn_hidden_size=expert_ffn,
        num_shared_experts=shared,
        shared_expert_ffn_hidden_size=expert_ffn if shared else 0,
        moe_layers=moe_layers,
        **fields,
    )


def _rope_layers(f: _Fields, num_layers: int) -> tuple[int, ...]:
    """Llama 4's ``no_rope_layers``: one 0/1 per layer, 1 where the layer has rotary positions (HF
    Llama4TextConfig); absent, every ``no_rope_layer_interval``-th layer (default 4) has none."""
    flags = f.raw("no_rope_layers", None)
    if flags is None:
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


def _chunked_layers(f: _Fields, num_layers: int, rope_layers: tuple[int, ...]) -> tuple[int, ...]:
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


def _read_llama4(f: _Fields, name: str) -> ModelSpec:
    """Llama 4 (text; HF modeling_llama4): MoE blocks at ``moe_layers`` (default every
    ``interleave_moe_layer_step``-th layer from step - 1), each with ``num_local_experts`` routed experts
    and one shared expert, both of ``intermediate_size``; dense blocks of ``intermediate_size_mlp``;
    chunked local attention of ``attention_chunk_size`` (null: none) on the rotary layers, global
    attention without rotary positions on the others (``no_rope_layers``); QK-norm on the rotary
    layers: an L2 norm without weights (``use_qk_norm``). Read and harmless: attn_temperature_tuning,
    floor_scale, attn_scale (a per-position scale of the queries of the global layers)."""
    fields = _rotary_decoder(f, name, head_dim_default=128) | {"linear_bias": f.flag("attention_bias", False)}
    num_layers = fields["num_layers"]
    experts, top_k = _experts(f, "num_local_experts")
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
    return ModelSpec(
        ffn_hidden_size=f.integer("intermediate_size_mlp", MAX_FFN, default=_MISSING if has_dense else expert_ffn),
        num_experts=experts,
        experts_per_token=top_k,
        moe_ffn_hidden_size=expert_ffn,
        num_shared_experts=1,
        shared_expert_ffn_hidden_size=expert_ffn,
        moe_layers=moe_layers,
        attention_chunk_size=chunk if chunked else None,
        chunked_attention_layers=chunked,
        nope_layers=tuple(i for i in range(num_layers) if i not in rope_layers),
        qk_norm="l2" if f.flag("use_qk_norm", True) else "none",
        # HF Llama4TextMoe: sigmoid scores of every expert; the top-1's probability scales ``routed_in``
        router_scores_all_experts=True,
        moe_probs_on_input=True,
        **fields,
    )


def _read_gpt_oss(f: _Fields, name: str) -> ModelSpec:
    """gpt-oss (HF modeling_gpt_oss; OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card", 2025): every block
    MoE with ``num_local_experts`` experts of ``intermediate_size`` whose gate/up and down projections
    have biases, a router with a bias, biased attention projections, one learned sink logit per head,
    ``sliding_window`` (default 128) on the layers ``layer_types`` names (default every other layer
    from the first). Read and harmless: swiglu_limit, swiglu_alpha (the clamp of its SwiGLU: the
    gated MLP's FLOPs)."""
    fields = _rotary_decoder(f, name, head_dim_default=64)
    num_layers = fields["num_layers"]
    experts, top_k = _experts(f, "num_local_experts")
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
    return ModelSpec(
        ffn_hidden_size=expert_ffn,
        num_experts=experts,
        experts_per_token=top_k,
        moe_ffn_hidden_size=expert_ffn,
        moe_layers=tuple(range(num_layers)),
        router_bias=True,
        attention_sinks=True,
        **fields | {"linear_bias": True} | _windows(f.window(128), layers),
    )


def _read_falcon(f: _Fields, name: str) -> ModelSpec:
    """Falcon (HF modeling_falcon; Almazrouei et al. 2023, arXiv 2311.16867): attention and a non-gated
    GeLU MLP of ``ffn_hidden_size`` (default 4 h) in parallel on the block input (``parallel_attn``,
    default true), LayerNorm, rotary positions (ALiBi is refused), biases where ``bias``; key/value heads
    ``num_kv_heads`` with ``new_decoder_architecture`` or without ``multi_query``, else one (multi-query);
    one norm per parallel block, two (ln_attn, ln_mlp) where ``num_ln_in_parallel_attn`` is 2 (the
    default with new_decoder_architecture), two in a sequential block."""
    hidden = f.integer("hidden_size", MAX_HIDDEN)
    heads = f.integer("num_attention_heads", MAX_HEADS)
    if hidden % heads:
        raise f.error(
            f"num_attention_heads {heads} does not divide hidden_size {hidden}", "num_attention_heads", heads, hidden
        )
    if f.flag("alibi", False):
        raise f.error(
            "field 'alibi' true (ALiBi positions) is not honoured; nestplan costs rotary positions",
            "alibi",
            True,
            "false",
        )
    new_arch, multi_query = f.flag("new_decoder_architecture", False), f.flag("multi_query", True)
    kv_heads = f.integer("num_kv_heads", MAX_HEADS, default=heads)  # HF saves it whatever the architecture
    if heads % kv_heads:
        raise f.error(
            f"num_kv_heads {kv_heads} does not divide num_attention_heads {heads}", "num_kv_heads", kv_heads, heads
        )
    if multi_query and not new_arch:
        kv_heads = 1
    parallel = f.flag("parallel_attn", True)
    one_or_two = f.integer("num_ln_in_parallel_attn", 2, default=2 if new_arch else 1)
    norms = one_or_two if parallel else 2
    return ModelSpec(
        name=name,
        family=f.family,
        hidden_size=hidden,
        num_layers=f.integer("num_hidden_layers", MAX_LAYERS),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=hidden // heads,
        ffn_hidden_size=f.integer("ffn_hidden_size", MAX_FFN, default=4 * hidden),
        gated_mlp=False,
        vocab_size=f.integer("vocab_size", MAX_VOCAB),
        tied_embeddings=f.flag("tie_word_embeddings", True),
        max_position_embeddings=f.integer(
            "max_position_embeddings", MAX_POSITIONS, default=_DEFAULT_MAX_POSITIONS["falcon"]
        ),
        learned_position_embeddings=False,
        norm="layernorm",
        linear_bias=f.flag("bias", False),
        dropout=f.any_dropout({"hidden_dropout": 0.0, "attention_dropout": 0.0}),
        block_norms=norms,
        parallel_block=parallel,
    )


_READERS: dict[str, Callable[[_Fields, str], ModelSpec]] = {
    "llama": _read_llama,
    "mistral": _read_mistral,
    "mixtral": _read_mixtral,
    "qwen2": _read_qwen2,
    "qwen2_moe": _read_qwen_moe,
    "qwen3": _read_qwen3,
    "qwen3_moe": _read_qwen_moe,
    "phi3": _read_phi3,
    "olmo2": _read_olmo2,
    "gemma2": _read_gemma,
    "gemma3": _read_gemma,
    "gemma3_text": _read_gemma,
    "nemotron": _read_nemotron,
    "nemotron_h": _read_nemotron_h,
    "jamba": _read_jamba,
    "gpt2": _read_gpt2,
    "gpt_neox": _read_gpt_neox,
    "bert": _read_bert,
    "deepseek_v2": _read_deepseek,
    "deepseek_v3": _read_deepseek,
    "llama4": _read_llama4,
    "llama4_text": _read_llama4,
    "gpt_oss": _read_gpt_oss,
    "falcon": _read_falcon,
}
assert set(_READERS) == set(SUPPORTED_FAMILIES)


def _check_model_name(name: str, field: str = "model name") -> str:
    """``name`` itself: no control character, at most ``MAX_NAME_CHARS`` characters."""
    check_string(name, field, "config.json")
    if len(name) > MAX_NAME_CHARS:
        raise ConfigError(
            f"config.json: {field} is {len(name)} characters long; at most {MAX_NAME_CHARS} allowed",
            field=field,
            value=len(name),
            limit=MAX_NAME_CHARS,
            unit="characters",
        )
    return name


def parse_config(data: dict, name: str) -> ModelSpec:
    """A ModelSpec from a Hugging Face ``config.json`` dict; the family is its ``model_type``. A
    multimodal config whose ``text_config`` object holds the language model (Gemma 3, LLaVA, ...) is
    read from that object: the language model is what nestplan plans (the vision tower is not counted)."""
    if not isinstance(data, dict):
        raise ConfigError(f"config.json: top level must be a JSON object, got {type(data).__name__}", field="config")
    if isinstance(data.get("text_config"), dict):
        data = data["text_config"]
    supported = ", ".join(SUPPORTED_FAMILIES)
    family = data.get("model_type")
    family = _SAME_ARCHITECTURE.get(family, family) if isinstance(family, str) else family
    if family is None:
        raise ConfigError(
            f"config.json: missing field 'model_type'; supported families: {supported}",
            field="model_type",
            limit=list(SUPPORTED_FAMILIES),
        )
    if not isinstance(family, str) or family not in _READERS:
        raise ConfigError(
            f"model_type {brief(family)} is not supported; supported families: {supported}",
            field="model_type",
            value=brief(family),
            limit=list(SUPPORTED_FAMILIES),
        )
    fields = _Fields(data, family)
    spec = _READERS[family](fields, _check_model_name(name))
    fields.check_unread()
    return spec


# ---------------------------------------------------------------------------
# writing: the inverse of parse_config


def config_dict(spec: ModelSpec) -> dict[str, Any]:
    """The inverse of :func:`parse_config`: ``spec`` as a Hugging Face ``config.json`` object of its
    family, which ``parse_config`` reads back into ``spec`` (its name and trace calibration aside:
    ``parse_config(config_dict(s), s.name)`` is ``s`` with both ``traced_*_scale`` at 1.0).

    It cannot write a ModelSpec that no config.json of its family gives (one built or altered by
    hand, such as a Llama with LayerNorm): a ConfigError names the first such field."""
    config = {"model_type": spec.family, **_WRITERS[spec.family](spec)}
    expected = dataclasses.replace(spec, traced_flops_scale=1.0, traced_activation_scale=1.0)
    read = parse_config(config, spec.name)
    if read != expected:
        differing = next(
            f.name for f in dataclasses.fields(ModelSpec) if getattr(read, f.name) != getattr(expected, f.name)
        )
        raise ConfigError(
            f"model {printable(spec.name)} cannot be written as a {spec.family} config.json: its "
            f"{differing} {brief(getattr(expected, differing))} is not one such a config gives",
            field=differing,
            value=getattr(expected, differing),
        )
    return config


def _dropout(spec: ModelSpec, *keys: str) -> dict[str, float]:
    """The family's dropout probabilities: 0.1 where the model stores dropout masks, else 0."""
    return dict.fromkeys(keys, 0.1 if spec.dropout else 0.0)


def _rotary_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": spec.tied_embeddings,
        "max_position_embeddings": spec.max_position_embeddings,
        **_dropout(spec, "attention_dropout"),
    }


def _llama_fields(spec: ModelSpec) -> dict[str, Any]:
    return {**_rotary_fields(spec), "intermediate_size": spec.ffn_hidden_size, "attention_bias": spec.linear_bias}


def _nemotron_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        **_rotary_fields(spec),
        "intermediate_size": spec.ffn_hidden_size,
        "attention_bias": spec.linear_bias,
        "mlp_bias": spec.linear_bias,
        "partial_rotary_factor": spec.rotary_fraction,
    }


def _nemotron_h_fields(spec: ModelSpec) -> dict[str, Any]:
    """Nemotron-H: the layers as ``hybrid_override_pattern`` (a block of attention and an MLP has no
    character: such a spec cannot be written), the Mamba-2 sizes and the E layers' experts."""
    chars = {(kind, mlp): char for char, (kind, mlp) in _HYBRID_LAYERS.items() if char != "E"}
    chars[("moe", True)] = "E"
    kinds = [("moe" if spec.is_moe_layer(i) else spec.mixer_of(i), spec.has_ffn(i)) for i in range(spec.num_layers)]
    unwritable = next((i for i, kind in enumerate(kinds) if kind not in chars), None)
    if unwritable is not None or spec.mamba is None:
        what = "no Mamba-2 sizes" if unwritable is None else f"layer {unwritable} with a mixer and an FFN"
        raise ConfigError(
            f"model {printable(spec.name)} cannot be written as a nemotron_h config.json: it has {what}",
            field="mamba" if unwritable is None else "ffn_free_layers",
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
        **_dropout(spec, "attention_dropout", "hidden_dropout"),
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


def _period_and_offset(layers: tuple[int, ...], num_layers: int) -> tuple[int, int]:
    """(period, offset) that give ``layers`` as the i with i % period == offset (none: past the last
    layer); a set no period gives is written as its first two layers' spacing, and the round trip
    check of ``config_dict`` names it."""
    if not layers:
        return num_layers + 1, num_layers
    return (layers[1] - layers[0] if len(layers) > 1 else num_layers), layers[0]


def _jamba_fields(spec: ModelSpec) -> dict[str, Any]:
    m = spec.mamba
    if not isinstance(m, Mamba1Shape) or m.inner % spec.hidden_size:
        raise ConfigError(
            f"model {printable(spec.name)} cannot be written as a jamba config.json: its Mamba mixer "
            "is not Jamba's (a selective SSM of a whole multiple of the hidden size)",
            field="mamba",
        )
    attention = tuple(i for i in range(spec.num_layers) if spec.mixer_of(i) == "attention")
    attn_period, attn_offset = _period_and_offset(attention, spec.num_layers)
    expert_period, expert_offset = _period_and_offset(spec.moe_layers if spec.is_moe else (), spec.num_layers)
    return {
        **_rotary_fields(spec),
        "intermediate_size": spec.ffn_hidden_size,
        "num_experts": spec.num_experts if spec.is_moe else 1,
        "num_experts_per_tok": spec.experts_per_token or 1,
        "attn_layer_period": attn_period,
        "attn_layer_offset": attn_offset,
        "expert_layer_period": expert_period,
        "expert_layer_offset": expert_offset,
        "mamba_d_state": m.state_size,
        "mamba_d_conv": m.conv_kernel,
        "mamba_expand": m.inner // spec.hidden_size,
        "mamba_dt_rank": m.dt_rank,
        "mamba_conv_bias": m.conv_bias,
    }


def _layer_types(spec: ModelSpec) -> list[str]:
    return ["sliding_attention" if spec.window_of(i) else "full_attention" for i in range(spec.num_layers)]


def _qwen_window_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        "use_sliding_window": spec.sliding_window is not None,
        "sliding_window": spec.sliding_window,
        "layer_types": _layer_types(spec),
    }


def _mistral_fields(spec: ModelSpec) -> dict[str, Any]:
    """Mistral and Phi-3: one window for every layer."""
    out = {**_rotary_fields(spec), "intermediate_size": spec.ffn_hidden_size, "sliding_window": spec.sliding_window}
    if spec.family == "phi3":
        out["partial_rotary_factor"] = spec.rotary_fraction
    return out


def _qwen_dense_fields(spec: ModelSpec) -> dict[str, Any]:
    out = {**_rotary_fields(spec), "intermediate_size": spec.ffn_hidden_size, **_qwen_window_fields(spec)}
    if spec.family == "qwen3":
        out["attention_bias"] = spec.linear_bias
    return out


def _olmo2_fields(spec: ModelSpec) -> dict[str, Any]:
    return {**_rotary_fields(spec), "intermediate_size": spec.ffn_hidden_size, "attention_bias": spec.linear_bias}


def _gemma_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        **_rotary_fields(spec),
        "intermediate_size": spec.ffn_hidden_size,
        "sliding_window": spec.sliding_window,
        "layer_types": _layer_types(spec),
    }


def _mixtral_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        **_rotary_fields(spec),
        "intermediate_size": spec.moe_ffn_hidden_size,
        "sliding_window": spec.sliding_window,
        "num_local_experts": spec.num_experts,
        "num_experts_per_tok": spec.experts_per_token,
    }


def _qwen_moe_fields(spec: ModelSpec) -> dict[str, Any]:
    out = {
        **_rotary_fields(spec),
        "intermediate_size": spec.ffn_hidden_size,
        "num_experts": spec.num_experts,
        "num_experts_per_tok": spec.experts_per_token,
        "moe_intermediate_size": spec.moe_ffn_hidden_size,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [i for i in range(spec.num_layers) if i not in spec.moe_layers],
        **_qwen_window_fields(spec),
    }
    if spec.family == "qwen2_moe":
        out["shared_expert_intermediate_size"] = spec.shared_expert_ffn_hidden_size
    else:
        out["attention_bias"] = spec.linear_bias
    return out


def _gpt2_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        "n_embd": spec.hidden_size,
        "n_head": spec.num_heads,
        "n_layer": spec.num_layers,
        "n_inner": spec.ffn_hidden_size,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": spec.tied_embeddings,
        "n_positions": spec.max_position_embeddings,
        **_dropout(spec, "resid_pdrop", "embd_pdrop", "attn_pdrop"),
    }


def _encoder_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_heads,
        "num_hidden_layers": spec.num_layers,
        "intermediate_size": spec.ffn_hidden_size,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": spec.tied_embeddings,
        "max_position_embeddings": spec.max_position_embeddings,
    }


def _gpt_neox_fields(spec: ModelSpec) -> dict[str, Any]:
    return {**_encoder_fields(spec), **_dropout(spec, "attention_dropout", "hidden_dropout")}


def _bert_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        **_encoder_fields(spec),
        "type_vocab_size": spec.type_vocab_size,
        **_dropout(spec, "hidden_dropout_prob", "attention_probs_dropout_prob"),
    }


def _deepseek_fields(spec: ModelSpec) -> dict[str, Any]:
    moe = spec.moe_layers
    grouped = spec.routing_groups > 1 or spec.routing_groups_per_token > 1
    method = "noaux_tc" if spec.family == "deepseek_v3" else ("group_limited_greedy" if grouped else "greedy")
    return {
        **_rotary_fields(spec),
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


def _llama4_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        **_rotary_fields(spec),
        "intermediate_size": spec.moe_ffn_hidden_size,
        "intermediate_size_mlp": spec.ffn_hidden_size,
        "num_local_experts": spec.num_experts,
        "num_experts_per_tok": spec.experts_per_token,
        "moe_layers": list(spec.moe_layers),
        "no_rope_layers": [0 if i in spec.nope_layers else 1 for i in range(spec.num_layers)],
        "attention_chunk_size": spec.attention_chunk_size,
        "layer_types": ["chunked_attention" if spec.chunk_of(i) else "full_attention" for i in range(spec.num_layers)],
        "use_qk_norm": spec.qk_norm == "l2",
        "attention_bias": spec.linear_bias,
    }


def _gpt_oss_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        **_rotary_fields(spec),
        "intermediate_size": spec.moe_ffn_hidden_size,
        "num_local_experts": spec.num_experts,
        "num_experts_per_tok": spec.experts_per_token,
        "sliding_window": spec.sliding_window,
        "layer_types": _layer_types(spec),
        "attention_bias": True,
    }


def _falcon_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_heads,
        "num_hidden_layers": spec.num_layers,
        "num_kv_heads": spec.num_kv_heads,
        "new_decoder_architecture": True,
        "parallel_attn": spec.parallel_block,
        "num_ln_in_parallel_attn": spec.block_norms if spec.parallel_block else None,
        "ffn_hidden_size": spec.ffn_hidden_size,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": spec.tied_embeddings,
        "max_position_embeddings": spec.max_position_embeddings,
        "bias": spec.linear_bias,
        **_dropout(spec, "hidden_dropout", "attention_dropout"),
    }


_WRITERS: dict[str, Callable[[ModelSpec], dict[str, Any]]] = {
    "llama": _llama_fields,
    "mistral": _mistral_fields,
    "mixtral": _mixtral_fields,
    "qwen2": _qwen_dense_fields,
    "qwen2_moe": _qwen_moe_fields,
    "qwen3": _qwen_dense_fields,
    "qwen3_moe": _qwen_moe_fields,
    "phi3": _mistral_fields,
    "olmo2": _olmo2_fields,
    "gemma2": _gemma_fields,
    "gemma3": _gemma_fields,
    "gemma3_text": _gemma_fields,
    "nemotron": _nemotron_fields,
    "nemotron_h": _nemotron_h_fields,
    "jamba": _jamba_fields,
    "gpt2": _gpt2_fields,
    "gpt_neox": _gpt_neox_fields,
    "bert": _bert_fields,
    "deepseek_v2": _deepseek_fields,
    "deepseek_v3": _deepseek_fields,
    "llama4": _llama4_fields,
    "llama4_text": _llama4_fields,
    "gpt_oss": _gpt_oss_fields,
    "falcon": _falcon_fields,
}
assert set(_WRITERS) == set(SUPPORTED_FAMILIES)


# ---------------------------------------------------------------------------
# files and the catalog


def _name_for_path(data: dict, path: Path) -> str:
    """``_name_or_path`` or ``name`` from the config, else the file stem (the folder for ``config.json``),
    checked as a name (:func:`_check_model_name`)."""
    for key in ("_name_or_path", "name"):
        value = data.get(key)
        if isinstance(value, str) and value.strip():
            return _check_model_name(value.strip(), f"field '{key}'")
    if path.stem == "config" and path.resolve().parent.name:
        return _check_model_name(path.resolve().parent.name, "the folder name")
    return _check_model_name(path.stem, "the file name")


def _as_path(text: str) -> Path | None:
    """The config file ``text`` designates, or None when it is a catalog name."""
    path = catalog.user_path(text)
    if catalog.is_file(path):
        return path
    if catalog.is_dir(path) and catalog.is_file(path / "config.json"):
        return path / "config.json"
    if text.lower().endswith(".json") or "/" in text or "\\" in text:
        return path / "config.json" if catalog.is_dir(path) else path
    return None


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name, or a Hugging Face ``config.json`` (a file, or a folder holding one)."""
    text = str(name_or_path).strip()
    path = _as_path(text)
    if path is not None:
        data = load_object(path, "model config file", "json")
        return parse_config(data, _name_for_path(data, path))
    entry = catalog.entry_path("model", text)
    return parse_config(load_object(entry, "model config file", "json"), entry.stem)


def model_names() -> list[str]:
    """Sorted names of the models shipped in the catalog."""
    return catalog.names("model")
