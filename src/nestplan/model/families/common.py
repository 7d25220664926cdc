"""What several model families share: the bounds on a config's sizes, the reader of one
``config.json`` (:class:`ConfigFields`: :class:`nestplan.inputs.Fields` with the family's windows,
layer lists, dropout and the refusal of architecture keys it does not read), a family's registry
entry (:class:`Family`), and the readers and writers of the common parts (attention shape, the
rotary decoder, experts and their routing groups, sliding windows, dropout).

Choices the families rely on:

* ``num_key_value_heads`` defaults to the number of attention heads for every family (MHA), and
  ``head_dim`` (rotary families only) to hidden / heads.
* A key of ``_ARCHITECTURE_KEYS`` that the family's reader does not read, set to anything but
  null/false/0/[], is refused (a family's ``harmless_keys`` exempt a few).
* ``dropout`` is True when any of the family's dropout probabilities is > 0.
* Sliding windows: null means full attention; ``layer_types`` ("full_attention",
  "sliding_attention") names the windowed layers where the family has it.
* Inconsistent expert counts (top-k above the experts, topk_group above n_group, n_group not
  dividing the experts) are refused naming the field.
* Every size is a JSON integer (not ``2.0``, not ``true``) between 1 and a bound (``MAX_LAYERS``
  ...): far beyond any published model, but finite, so the planner's work stays bounded and no
  count overflows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping

from nestplan.errors import brief
from nestplan.inputs import Fields
from nestplan.model.facts import FactKeys
from nestplan.model.spec import FFN, Block, Mixer, ModelSpec, QKNorm

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


# layer_types entries (transformers >= 4.53) and whether the layer attends to a sliding window
_LAYER_TYPES = {"full_attention": False, "sliding_attention": True}


@dataclass(frozen=True)
class Family:
    """One Hugging Face ``model_type`` nestplan reads: its reader (config.json -> ModelSpec), its writer
    (the inverse, ModelSpec -> config.json fields), transformers' default ``max_position_embeddings``
    for it, the architecture keys its model applies without changing anything nestplan counts, the
    other ``model_type`` values whose configs are read as this one, and where its config keeps the
    model's :class:`~nestplan.model.facts.Facts` (norm epsilon, activation, RoPE, router weights)."""

    model_type: str
    read: Callable[[ConfigFields, str], ModelSpec]
    write: Callable[[ModelSpec], dict[str, Any]]
    max_positions: int
    harmless_keys: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    facts: FactKeys = FactKeys(("rms_norm_eps", 1e-6))  # where its config keeps the Facts, and their defaults


class ConfigFields(Fields):
    """Typed access to one config dict of ``family``; every error names the family and the field. It
    records the keys the reader looks at (:meth:`check_unread`)."""

    def __init__(self, data: Mapping[str, Any], family: Family) -> None:
        super().__init__(data, f"config.json ({family.model_type})")
        self.family = family.model_type
        self.max_positions = family.max_positions
        self.harmless_keys = family.harmless_keys

    def check_unread(self) -> None:
        """Refuse an architecture key that is set but that the family's reader did not read."""
        for key in _ARCHITECTURE_KEYS:
            value = self.data.get(key)
            if key not in self.read and key not in self.harmless_keys and value not in (None, False, 0, []):
                raise self.error(
                    f"field '{key}' changes the architecture and nestplan does not honour it in "
                    f"a {self.family} model; remove it or use a family that reads it",
                    key,
                    brief(value),
                )

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


def decoder_blocks(
    num_layers: int,
    window: int | None = None,
    windowed: Collection[int] = (),
    moe: Collection[int] = (),
    qk_norm: QKNorm = QKNorm.NONE,
    mixer: Mixer = Mixer.ATTENTION,
) -> tuple[Block, ...]:
    """``num_layers`` blocks of ``mixer`` and an FFN, an MoE one in the layers ``moe``, attending to a
    sliding ``window`` in the layers ``windowed`` (full attention everywhere when ``window`` is None),
    each with ``qk_norm``."""
    moe, windowed = frozenset(moe), frozenset(windowed if window is not None else ())
    return tuple(
        Block(mixer, FFN.MOE if i in moe else FFN.DENSE, window if i in windowed else None, qk_norm=qk_norm)
        for i in range(num_layers)
    )


def attention_shape(
    f: ConfigFields,
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


def decoder_fields(
    f: ConfigFields,
    name: str,
    shape: tuple[int, int, int, int],
    blocks: tuple[Block, ...],
    ffn: tuple[str, Any] | None = None,
    *,
    tied: bool = False,
    positions_key: str = "max_position_embeddings",
) -> dict[str, Any]:
    """Fields every family's reader fills: ``name``, the family, the attention ``shape`` (hidden, heads,
    kv heads, head dim), ``blocks``, the FFN width from ``ffn`` (key, default) where given, the
    vocabulary, tied embeddings (default ``tied``) and the positions under ``positions_key``."""
    hidden, heads, kv_heads, head_dim = shape
    fields: dict[str, Any] = dict(
        name=name,
        family=f.family,
        hidden_size=hidden,
        blocks=blocks,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
    )
    if ffn is not None:
        fields["ffn_hidden_size"] = f.integer(ffn[0], MAX_FFN, default=ffn[1])
    return fields | dict(
        vocab_size=f.integer("vocab_size", MAX_VOCAB),
        tied_embeddings=f.flag("tie_word_embeddings", tied),
        max_position_embeddings=f.integer(positions_key, MAX_POSITIONS, default=f.max_positions),
    )


def rotary_decoder(f: ConfigFields, name: str, head_dim_default: int | None = None) -> dict[str, Any]:
    """Fields shared by the Llama-style families (RMSNorm, RoPE, gated SiLU MLP, GQA)."""
    shape = attention_shape(
        f, "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", head_dim_default
    )
    return decoder_fields(f, name, shape, decoder_blocks(f.integer("num_hidden_layers", MAX_LAYERS))) | dict(
        gated_mlp=True,
        learned_position_embeddings=False,
        norm="rmsnorm",
        linear_bias=False,
        dropout=f.any_dropout({"attention_dropout": 0.0}),
    )


def expert_counts(f: ConfigFields, experts_key: str) -> tuple[int, int]:
    experts = f.integer(experts_key, MAX_EXPERTS)
    top_k = f.integer("num_experts_per_tok", MAX_EXPERTS)
    if top_k > experts:
        raise f.error(
            f"num_experts_per_tok {top_k} exceeds {experts_key} {experts}", "num_experts_per_tok", top_k, experts
        )
    return experts, top_k


def routing_groups(f: ConfigFields, experts: int, top_k: int, grouped: bool) -> dict[str, int]:
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


def every_layer(f: ConfigFields, num_layers: int, default_window: int | None, moe: bool = False) -> tuple[Block, ...]:
    """Blocks with a ``sliding_window`` that applies to every layer (Mistral, Mixtral, Phi-3: HF
    MistralConfig defaults it to 4096, MixtralConfig and Phi3Config to None; null means full attention),
    every FFN an MoE where ``moe``."""
    every = range(num_layers)
    return decoder_blocks(num_layers, f.window(default_window), every, every if moe else ())


def dropout_fields(spec: ModelSpec, *keys: str) -> dict[str, float]:
    """The family's dropout probabilities: 0.1 where the model stores dropout masks, else 0."""
    return dict.fromkeys(keys, 0.1 if spec.dropout else 0.0)


def rotary_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": spec.tied_embeddings,
        "max_position_embeddings": spec.max_position_embeddings,
        **dropout_fields(spec, "attention_dropout"),
    }


def layer_types(spec: ModelSpec) -> list[str]:
    return ["sliding_attention" if block.window else "full_attention" for block in spec.blocks]
