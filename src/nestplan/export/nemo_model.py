"""The model as Megatron-Bridge 0.6.2 builds it: the recipe of the model's architecture and every fact of
``nestplan.model.stated.stated_facts`` as a field of the recipe's model provider, or a note naming the fact,
or a refusal (issue 27: the model as exported is the model as read).

Read in Megatron-Bridge 0.6.2: models/gpt_provider.py (GPTModelProvider: rotary_base, rope_scaling and
rope_scaling_factor, seq_len_interpolation_factor, the yarn_* fields), models/mla_provider.py
(MLAModelProvider = Megatron-core's MLATransformerConfig + GPTModelProvider: q_lora_rank ... v_head_dim,
rope_type and the unprefixed YaRN fields), models/conversion/model_bridge.py (CONFIG_MAPPING: which
Hugging Face key is which provider field), utils/activation_map.py (the activation names an override
takes), training/setup.py (_validate_and_set_vocab_size: a vocabulary the model sets is used unpadded);
and in megatron-core 0.19.2: models/common/embeddings/rotary_pos_embedding.py (RotaryEmbedding._apply_scaling,
Llama 3.1's frequency bands with fixed low 1, high 4 and 8192 original positions),
transformer/moe/moe_utils.py (topk_routing_with_score_function), transformer/utils.py
(is_layer_window_attention: window_attn_skip_freq as a per-layer list).
"""

from __future__ import annotations

from nestplan.export import megatron
from nestplan.export.common import refuse
from nestplan.export.megatron_facts import LLAMA3_FIXED, MEGATRON_VOCAB_MULTIPLE, block_norm_notes
from nestplan.export.megatron_model import position_embedding_type
from nestplan.model.config import catalog_architecture
from nestplan.model.facts import YARN_DEFAULTS, RopeScaling, RopeType, RouterScore
from nestplan.model.spec import ModelSpec
from nestplan.plan import Plan

TITLE = "Megatron-Bridge"
Items = list[tuple[str, object]]

# Library recipes of Megatron-Bridge 0.6.2 (megatron/bridge/recipes/*/<family>.py, the legacy names
# run_recipe.py --recipe loads) for the catalog models they were written for, chosen for a model of that
# architecture whatever its name (model.config.catalog_architecture). Every model field is overridden either
# way; the recipe brings its provider class (MLA's fields) and the settings nestplan does not cost.
RECIPES = {
    "llama2-7b": "llama2_7b_pretrain_config",
    "llama3-8b": "llama3_8b_pretrain_config",
    "llama3-70b": "llama3_70b_pretrain_config",
    "llama3.1-8b": "llama31_8b_pretrain_config",
    "llama3.1-70b": "llama31_70b_pretrain_config",
    "llama3.1-405b": "llama31_405b_pretrain_config",
    "qwen3-8b": "qwen3_8b_pretrain_config",
    "qwen3-32b": "qwen3_32b_pretrain_config",
    "qwen3-235b-a22b": "qwen3_235b_a22b_pretrain_config",
    "gpt-oss-20b": "gpt_oss_20b_pretrain_config",
    "gpt-oss-120b": "gpt_oss_120b_pretrain_config",
    "gpt3-175b": "gpt3_175b_pretrain_config",
    "deepseek-v2-lite": "deepseek_v2_lite_pretrain_config",
    "deepseek-v3": "deepseek_v3_pretrain_config",
    "kimi-k2": "kimi_k2_pretrain_config",
}
GENERIC_RECIPE = "vanilla_gpt_pretrain_config"  # recipes/gpt/vanilla_gpt.py: a GPTModelProvider
GENERIC_MLA_RECIPE = "deepseek_v3_pretrain_config"  # its provider is an MLAModelProvider
# Hugging Face's activation names (ACT2FN) -> Megatron-Bridge's (utils/activation_map.py ACTIVATION_FUNC_MAP);
# gelu_new, gelu_fast and gelu_pytorch_tanh are all the tanh approximation Megatron-core calls fast_gelu
ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_new": "fast_gelu",
    "gelu_fast": "fast_gelu",
    "gelu_pytorch_tanh": "fast_gelu",
    "quick_gelu": "quick_gelu",
    "relu": "relu",
    "relu2": "squared_relu",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
}
# what Megatron-Bridge builds for an activation it does not have, the nearest of its own
NEAREST_ACTIVATIONS = {"gelu_accurate": "fast_gelu", "relu6": "relu"}
# Hugging Face's YaRN keys -> GPTModelProvider's fields and MLATransformerConfig's (model_bridge.py's two
# YARN mappings), with the defaults Hugging Face's _compute_yarn_parameters takes for an absent key
YARN_FIELDS = (
    ("factor", "yarn_rotary_scaling_factor", "rotary_scaling_factor", None),
    (
        "original_max_position_embeddings",
        "yarn_original_max_position_embeddings",
        "original_max_position_embeddings",
        None,
    ),
    ("beta_fast", "yarn_beta_fast", "beta_fast", YARN_DEFAULTS["beta_fast"]),
    ("beta_slow", "yarn_beta_slow", "beta_slow", YARN_DEFAULTS["beta_slow"]),
    ("mscale", "yarn_mscale", "mscale", 1.0),
    ("mscale_all_dim", "yarn_mscale_all_dim", "mscale_all_dim", 0.0),
)


def recipe(m: ModelSpec) -> str:
    """The recipe function ``run_recipe.py --recipe`` loads for this model: its architecture's, never its
    name's; an MLA model of no recipe's architecture runs DeepSeek-V3's (its provider has MLA's fields)."""
    own = catalog_architecture(m, RECIPES)
    if own is not None:
        return RECIPES[own]
    return GENERIC_MLA_RECIPE if m.is_mla else GENERIC_RECIPE


def position_embedding(m: ModelSpec) -> str:
    """GPTModelProvider's position_embedding_type: Megatron-LM's (learned, none or RoPE), YaRN for a GPT
    model of YaRN-scaled RoPE; MLA takes "rope" and its YaRN through rope_type (model_bridge.py)."""
    kind = position_embedding_type(m)
    scaling = m.facts.rope_scaling
    yarn = kind == "rope" and not m.is_mla and scaling is not None and scaling.kind is RopeType.YARN
    return "yarn" if yarn else kind


def rotary_percent(m: ModelSpec) -> float:
    """The rotary share of a head: MLA's rotary part is its own head (qk_pos_emb_head_dim), all rotary."""
    return 1.0 if m.is_mla else m.rotary_fraction


def check_model(m: ModelSpec) -> None:
    """A model Megatron-Bridge's recipes cannot build: an encoder, what Megatron-core's GPT cannot, or a RoPE
    scaling Megatron-core does not have (longrope's per-frequency factors)."""
    if not m.causal:
        raise refuse(TITLE, f"Megatron-Bridge has no encoder (BERT) recipe for {m.name}", "model", m.name)
    missing = megatron.unbuildable(m)
    if missing:
        raise refuse(TITLE, f"Megatron-Bridge cannot build {missing} of {m.name}", "model", m.name)
    scaling = m.facts.rope_scaling
    if scaling is not None and scaling.kind is RopeType.LONGROPE:
        raise refuse(
            TITLE,
            f"Megatron-core has no longrope (rope_scaling of {m.name}: per-frequency factors on every position)",
            "rope_scaling",
            scaling.kind.value,
            [RopeType.LINEAR.value, RopeType.LLAMA3.value, RopeType.YARN.value],
        )


def padded_vocab(m: ModelSpec, tp: int) -> int:
    """The vocabulary the export gives the model: the model's own where tp divides it (Megatron-Bridge then
    keeps it unpadded), else Megatron-core's padding to a multiple of 128 x tp, which its vocab-parallel
    embedding needs."""
    if m.vocab_size % tp == 0:
        return m.vocab_size
    multiple = MEGATRON_VOCAB_MULTIPLE * tp
    return -(-m.vocab_size // multiple) * multiple


def fact_fields(m: ModelSpec, plan: Plan) -> tuple[Items, list[str]]:
    """The stated facts beyond the shapes as provider fields, and the notes (each naming its fact)."""
    notes: list[str] = []
    items = _norm_and_activation(m, notes) + _vocabulary(m, plan.dims.tp, notes) + _window(m, notes)
    items += _rope(m, notes)
    if m.is_mla:
        items += mla_fields(m)
    if m.is_moe:
        items += _router(m, notes)
    return items, notes + block_norm_notes(m)


def _norm_and_activation(m: ModelSpec, notes: list[str]) -> Items:
    act = m.facts.activation
    name = ACTIVATIONS.get(act) or NEAREST_ACTIVATIONS[act]
    if act not in ACTIVATIONS:
        notes.append(f"activation: Megatron-Bridge has no {act}; it builds {name}")
    # Megatron-core's fused bias-activation takes gelu (with a bias or gated) and SwiGLU only
    # (TransformerConfig.__post_init__)
    fusion = name == "silu" or (name == "gelu" and (m.gated_mlp or m.linear_bias))
    return [
        ("model.layernorm_epsilon", m.facts.norm_eps),
        ("model.activation_func", name),
        ("model.glu_linear_offset", m.facts.glu_linear_offset),  # gpt-oss: the linear half plus 1
        ("model.activation_func_clamp_value", m.facts.glu_clamp),  # gpt-oss: both halves clamped at 7
        ("model.bias_activation_fusion", fusion),
    ]


def _vocabulary(m: ModelSpec, tp: int, notes: list[str]) -> Items:
    """The model's vocabulary, never the tokenizer's (recipes/common.py sets use_tokenizer_vocab_size)."""
    vocab = padded_vocab(m, tp)
    if vocab != m.vocab_size:
        notes.append(
            f"vocab_size: {m.vocab_size} padded to {vocab} (a multiple of {MEGATRON_VOCAB_MULTIPLE} x tp {tp}, as "
            "Megatron-core pads it); the padded rows are parameters nestplan does not count"
        )
    return [
        ("tokenizer.use_tokenizer_vocab_size", False),
        ("model.vocab_size", vocab),
        ("model.make_vocab_size_divisible_by", MEGATRON_VOCAB_MULTIPLE),
    ]


def _window(m: ModelSpec, notes: list[str]) -> Items:
    """A sliding window (w - 1 keys before the query, FlashAttention's convention) on the layers that have
    one: every layer, or those of ``window_attn_skip_freq``'s per-layer list (1: windowed)."""
    windows = [m.window_of(i) for i in range(m.num_layers)]
    sizes = {w for w in windows if w is not None}
    if not sizes:
        return [("model.window_size", None), ("model.window_attn_skip_freq", None)]
    if len(sizes) > 1:
        notes.append(f"window: {m.name} has windows of {sorted(sizes)}; Megatron-core takes one size: the largest")
    size = [min(max(sizes), 2**30) - 1, 0]
    pattern = None if None not in windows else [0 if w is None else 1 for w in windows]
    return [("model.window_size", size), ("model.window_attn_skip_freq", pattern)]


def _rope(m: ModelSpec, notes: list[str]) -> Items:
    """The rotary base and scaling; Gemma 3's second base for its windowed layers has no field."""
    f = m.facts
    if f.rope_theta is None or position_embedding(m) == "none" or m.learned_position_embeddings:
        return []
    theta = int(f.rope_theta) if float(f.rope_theta).is_integer() else f.rope_theta
    items: Items = [("model.rotary_base", theta)]
    if f.local_rope_theta is not None and f.local_rope_theta != f.rope_theta:
        notes.append(
            f"local_rope_theta: Megatron-core has one rotary base; the windowed layers of {m.name} run with "
            f"{f.rope_theta:g}, not {f.local_rope_theta:g}"
        )
    scaling = f.rope_scaling
    if m.is_mla:
        return items + _mla_rope(m, scaling, notes)
    items += [("model.rope_scaling", scaling is not None and scaling.kind is RopeType.LLAMA3)]
    if scaling is None or scaling.kind is RopeType.DYNAMIC:
        if scaling is not None:
            notes.append("rope_scaling: Megatron-core has no dynamic NTK scaling; it builds unscaled RoPE")
        return items + [("model.seq_len_interpolation_factor", None)]
    if scaling.kind is RopeType.LINEAR:
        return items + [("model.seq_len_interpolation_factor", scaling.factor)]
    if scaling.kind is RopeType.LLAMA3:
        bands = {k: scaling.get(k) for k in LLAMA3_FIXED}
        if bands != LLAMA3_FIXED:
            notes.append(f"rope_scaling: Megatron-core's Llama 3.1 bands are {LLAMA3_FIXED}; {m.name} states {bands}")
        return items + [("model.rope_scaling_factor", scaling.factor), ("model.seq_len_interpolation_factor", None)]
    return items + [("model.seq_len_interpolation_factor", None)] + _yarn(m, scaling, notes, mla=False)


def _yarn(m: ModelSpec, scaling: RopeScaling, notes: list[str], mla: bool) -> Items:
    if scaling.get("attention_factor") is not None:
        notes.append(
            "rope_scaling: Megatron-core's YaRN derives its attention factor from mscale; attention_factor is not set"
        )
    items: Items = []
    for hf_key, gpt_field, mla_field, default in YARN_FIELDS:
        value = scaling.get(hf_key, default)
        if hf_key == "original_max_position_embeddings" and value is None:
            value = m.max_position_embeddings  # transformers' default
        items.append((f"model.{mla_field if mla else gpt_field}", value))
    if not mla:
        items.append(
            ("model.yarn_correction_range_round_to_int", bool(scaling.get("truncate", YARN_DEFAULTS["truncate"])))
        )
    return items


def _mla_rope(m: ModelSpec, scaling: RopeScaling | None, notes: list[str]) -> Items:
    """MLATransformerConfig's rope_type ("rope" or "yarn") and its YaRN fields."""
    if scaling is not None and scaling.kind is RopeType.YARN:
        return [("model.rope_type", "yarn")] + _yarn(m, scaling, notes, mla=True)
    if scaling is not None:
        notes.append(
            f"rope_scaling: Megatron-core's MLA takes RoPE or YaRN; {m.name}'s {scaling.kind.value} is not built"
        )
    # MLA scales its softmax by YaRN's mscale whatever rope_type is (multi_latent_attention.py): factor 1 keeps it 1
    return [("model.rope_type", "rope"), ("model.rotary_scaling_factor", 1.0), ("model.mscale", 1.0)] + [
        ("model.mscale_all_dim", 1.0)
    ]


def mla_fields(m: ModelSpec) -> Items:
    """Multi-head latent attention (MLATransformerConfig): qk_head_dim is the part of a query/key head
    without rotary positions; no query latent is q_lora_rank null."""
    return [
        ("model.multi_latent_attention", True),
        ("model.q_lora_rank", m.q_lora_rank or None),
        ("model.kv_lora_rank", m.kv_lora_rank),
        ("model.qk_head_dim", m.head_dim - m.qk_rope_head_dim),
        ("model.qk_pos_emb_head_dim", m.qk_rope_head_dim),
        ("model.v_head_dim", m.value_head_dim),
        ("model.mtp_num_layers", m.mtp_layers or None),
    ]


def _router(m: ModelSpec, notes: list[str]) -> Items:
    """How the router weighs its experts (moe_utils.topk_routing_with_score_function): a softmax over the
    chosen experts' logits (renormalised) or over every expert before the top-k (not renormalised), or a
    sigmoid per expert, renormalised over the chosen ones when more than one; then the scaling factor.
    A per-expert selection bias (DeepSeek-V3's e_score_correction_bias) is the expert bias; a router with
    a linear bias (gpt-oss) has it through add_bias_linear."""
    router = m.facts.router
    sigmoid = router.score is RouterScore.SIGMOID
    pre_softmax = not sigmoid and not router.renormalised
    if not sigmoid and router.renormalised == m.router_scores_all_experts:
        notes.append(
            "router_scores_all_experts: Megatron-core's softmax router renormalises exactly when it scores only "
            f"the chosen experts; {m.name}'s weights are the same either way"
        )
    if sigmoid and router.renormalised != (m.experts_per_token > 1):
        notes.append(
            "router_renormalised: Megatron-core's sigmoid router renormalises the chosen weights when it picks "
            f"more than one expert; {m.name} states renormalised={router.renormalised}"
        )
    return [
        ("model.moe_router_score_function", router.score.value),
        ("model.moe_router_pre_softmax", pre_softmax),
        ("model.moe_router_topk_scaling_factor", None if router.scaling_factor == 1.0 else router.scaling_factor),
        ("model.moe_router_enable_expert_bias", m.router_bias and not m.linear_bias),
        ("model.moe_router_num_groups", m.routing_groups if m.routing_groups > 1 else None),
        ("model.moe_router_group_topk", m.routing_groups_per_token if m.routing_groups > 1 else None),
    ]
