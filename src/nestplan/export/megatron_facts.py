"""A model's facts (``nestplan.model.stated``) as Megatron-LM flags: the norm's epsilon, the MLP's activation,
the rotary base and scaling, the router's weights and the vocabulary padding, with a note naming each fact
Megatron-LM builds otherwise (issue 27: the model as exported is the model as read).

Flag meanings are those of megatron-core 0.19.2: megatron/training/arguments.py (the flags),
megatron/training/argument_utils.py (``core_transformer_config_from_args``: --swiglu, --squared-relu and
--quick-geglu pick the activation; ``_apply_yarn_config_from_args`` the YaRN fields; ``gpt_config_from_args``),
megatron/core/transformer/transformer_config.py (``TransformerConfig``, ``MLATransformerConfig``'s YaRN fields),
megatron/core/transformer/moe/moe_utils.py (``topk_routing_with_score_function``) and
megatron/training/vocab_utils.py (``calculate_padded_vocab_size``)."""

from __future__ import annotations

from nestplan.export.common import refuse
from nestplan.model.facts import SILU, YARN_DEFAULTS, RopeScaling, RopeType, RouterScore
from nestplan.model.spec import ModelSpec

Flags = list[tuple[str, object]]

# Megatron's llama3 rope scaling fixes all but the factor (RotaryEmbedding._apply_scaling's defaults)
LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
# MLATransformerConfig's YaRN fields that no Megatron-LM flag sets, with their values
MLA_YARN_FIXED = {"beta_fast": 32.0, "beta_slow": 1.0, "original_max_position_embeddings": 4096, "truncate": True}
# --make-vocab-size-divisible-by's default: the most this export sets it to, and the value the Megatron-Bridge
# export keeps (nemo_model.padded_vocab)
MEGATRON_VOCAB_MULTIPLE = 128
TANH_GELUS = ("gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_accurate")  # GELU's tanh approximations


def activation_flags(m: ModelSpec) -> tuple[Flags, list[str]]:
    """The MLP's activation: SwiGLU (--swiglu), squared ReLU (--squared-relu), exact GELU (the default),
    a gated quick GELU (--quick-geglu); no flag gates GELU itself, so a gated GELU runs as --quick-geglu
    (x sigmoid(1.702 x)) and a tanh-approximated GELU as the exact one, both noted. Anything else is refused."""
    act, gated = m.facts.activation, m.gated_mlp
    if gated and act in SILU:
        return [("--swiglu", None)], []
    if not gated and act == "relu2":
        return [("--squared-relu", None)], []
    if not gated and act in ("gelu", *TANH_GELUS):
        note = [] if act == "gelu" else [f"activation: Megatron-core computes exact GELU (F.gelu) for {m.name}'s {act}"]
        return [], note
    if gated and act in ("gelu", "quick_gelu", *TANH_GELUS):
        note = (
            []
            if act == "quick_gelu"
            else [f"activation: Megatron-LM gates quick GELU (--quick-geglu) for {m.name}'s gated {act}"]
        )
        return [("--quick-geglu", None)], note + _glu_notes(m)
    what = f"{'a gated' if gated else 'an'} MLP with {act}"
    raise refuse("Megatron-LM", f"Megatron-LM's command line builds no {what} ({m.name})", "activation", act)


def _glu_notes(m: ModelSpec) -> list[str]:
    """gpt-oss's clamp and linear offset: TransformerConfig fields (activation_func_clamp_value,
    glu_linear_offset) that no Megatron-LM argument sets (megatron/training/arguments.py)."""
    f, notes = m.facts, []
    if f.glu_clamp is not None:
        notes.append(
            f"glu_clamp: Megatron-LM's command line sets no clamp; it builds none for {m.name}'s {f.glu_clamp}"
        )
    if f.glu_linear_offset:
        notes.append(f"glu_linear_offset: Megatron-LM's command line adds no {f.glu_linear_offset} to the linear half")
    return notes


def vocab_multiple(vocab: int, tp: int) -> int:
    """--make-vocab-size-divisible-by: Megatron pads the vocabulary to a multiple of it x tp; the largest value up
    to its default that pads nothing, or 1 (the fewest padded rows) when tp does not divide the vocabulary."""
    if vocab % tp:
        return 1
    per_rank = vocab // tp
    return max(d for d in range(1, MEGATRON_VOCAB_MULTIPLE + 1) if per_rank % d == 0)


def padded_vocab(vocab: int, tp: int) -> int:
    """The rows Megatron builds (vocab_utils.calculate_padded_vocab_size with ``vocab_multiple``)."""
    multiple = vocab_multiple(vocab, tp) * tp
    return -(-vocab // multiple) * multiple


def vocab_flags(m: ModelSpec, tp: int) -> tuple[Flags, list[str]]:
    d = vocab_multiple(m.vocab_size, tp)
    padded = padded_vocab(m.vocab_size, tp)
    if padded == m.vocab_size:
        return [("--make-vocab-size-divisible-by", d)], []
    note = (
        f"vocab_size: Megatron pads the embedding and output rows from {m.vocab_size} to {padded} "
        f"(a multiple of tp {tp}, which does not divide {m.vocab_size}); nestplan costs {m.vocab_size}"
    )
    return [("--make-vocab-size-divisible-by", d)], [note]


def rope_flags(m: ModelSpec, rotary: bool) -> tuple[Flags, list[str]]:
    """The rotary base (--rotary-base, an integer) and scaling; ``rotary``: whether the export gives rotary
    positions at all (no flag otherwise)."""
    f = m.facts
    if not rotary or f.rope_theta is None:
        return [], []
    base = round(f.rope_theta)
    notes = [] if base == f.rope_theta else [f"rope_theta: Megatron-LM's --rotary-base is an integer: {base}"]
    if f.local_rope_theta is not None and f.local_rope_theta != f.rope_theta:
        notes.append(
            f"local_rope_theta: Megatron-core has one rotary embedding, base {base}"
            f"{' with the scaling below' if f.rope_scaling else ''}, also on the sliding-window layers "
            f"({m.name}'s use base {f.local_rope_theta:g} unscaled)"
        )
    scaled, scaling_notes = (_mla_scaling if m.is_mla else _scaling)(m.name, f.rope_scaling)
    return [("--rotary-base", base)] + scaled, notes + scaling_notes


def _differences(s: RopeScaling, fixed: dict[str, object], defaults: dict[str, object]) -> list[str]:
    return [
        f"{k} {s.get(k, defaults.get(k))} (Megatron: {v})" for k, v in fixed.items() if s.get(k, defaults.get(k)) != v
    ]


def _scaling_note(name: str, s: RopeScaling, what: str, differences: list[str]) -> list[str]:
    if not differences:
        return []
    return [f"rope_scaling: {name}'s {s.kind.value} scaling {what}: {', '.join(differences)}"]


def _mscales(s: RopeScaling) -> tuple[float, float]:
    """(mscale, mscale_all_dim) as Megatron's YaRN takes them: transformers uses both only when both are
    given and non-zero, else 0.1 ln(factor) + 1, which Megatron's defaults (1, 0) give."""
    mscale, all_dim = s.get("mscale"), s.get("mscale_all_dim")
    return (float(mscale), float(all_dim)) if mscale and all_dim else (1.0, 0.0)


def _yarn_attention_note(name: str, s: RopeScaling) -> list[str]:
    if s.get("attention_factor") is None:
        return []
    return [f"rope_scaling: {name}'s yarn attention_factor; Megatron derives it from mscale and mscale_all_dim"]


def _scaling(name: str, s: RopeScaling | None) -> tuple[Flags, list[str]]:
    """Scaling of a rotary embedding outside MLA: llama3 (--use-rope-scaling, fixed frequency bands), linear
    (--rotary-seq-len-interpolation-factor, an integer), YaRN (--position-embedding-type yarn, set by
    megatron_model.position_embedding_type, and its --yarn-* flags); other kinds are noted."""
    if s is None:
        return [], []
    if s.kind is RopeType.LLAMA3:
        flags: Flags = [("--use-rope-scaling", None), ("--rope-scaling-factor", s.factor)]
        return flags, _scaling_note(name, s, "fixes", _differences(s, LLAMA3_FIXED, {}))
    if s.kind is RopeType.LINEAR and s.factor == int(s.factor):
        return [("--rotary-seq-len-interpolation-factor", int(s.factor))], []
    if s.kind is RopeType.YARN:
        mscale, all_dim = _mscales(s)
        flags = [("--rotary-scaling-factor", s.factor), ("--mscale", mscale), ("--mscale-all-dim", all_dim)]
        flags += [
            ("--yarn-original-max-position-embeddings", s.get("original_max_position_embeddings", 4096)),
            ("--yarn-beta-fast", s.get("beta_fast", YARN_DEFAULTS["beta_fast"])),
            ("--yarn-beta-slow", s.get("beta_slow", YARN_DEFAULTS["beta_slow"])),
        ]
        if not s.get("truncate", YARN_DEFAULTS["truncate"]):
            flags.append(("--no-yarn-correction-range-round-to-int", None))
        return flags, _yarn_attention_note(name, s)
    return [], [
        f"rope_scaling: Megatron-LM has no {s.kind.value} scaling (factor {s.factor:g}): it builds unscaled RoPE"
    ]


def _mla_scaling(name: str, s: RopeScaling | None) -> tuple[Flags, list[str]]:
    """MLA's rotary embedding is MLATransformerConfig's YaRN: --rotary-scaling-factor, --mscale and
    --mscale-all-dim set it, the rest is fixed (``MLA_YARN_FIXED``); unscaled RoPE is YaRN with factor 1
    (YarnRotaryEmbedding: interpolated and extrapolated frequencies equal, mscale 1)."""
    if s is None:
        return [("--rotary-scaling-factor", 1.0)], []
    if s.kind is not RopeType.YARN:
        return [("--rotary-scaling-factor", 1.0)], [
            f"rope_scaling: Megatron-core's MLA takes YaRN only; {name}'s {s.kind.value} scaling is left out"
        ]
    mscale, all_dim = _mscales(s)
    flags: Flags = [("--rotary-scaling-factor", s.factor), ("--mscale", mscale), ("--mscale-all-dim", all_dim)]
    notes = _scaling_note(
        name, s, "has what MLATransformerConfig fixes", _differences(s, MLA_YARN_FIXED, YARN_DEFAULTS)
    )
    return flags, notes + _yarn_attention_note(name, s)


def router_flags(m: ModelSpec) -> tuple[Flags, list[str]]:
    """How the router weighs the experts it picks (moe_utils.topk_routing_with_score_function): a softmax over
    the chosen logits (renormalised: the default), over every expert before the top-k (--moe-router-pre-softmax:
    not renormalised; required at top-1), a sigmoid (--moe-router-score-function sigmoid: renormalised when
    top-k > 1) with DeepSeek-V3's expert bias, times --moe-router-topk-scaling-factor."""
    router, k = m.facts.router, m.experts_per_token
    if router is None:
        return [], []
    flags: Flags = []
    megatron_renormalises = k > 1
    if router.score is RouterScore.SIGMOID:
        flags.append(("--moe-router-score-function", "sigmoid"))
        if m.router_bias and not m.linear_bias:  # the expert bias: on sigmoid scores only (TransformerConfig)
            flags.append(("--moe-router-enable-expert-bias", None))
    elif not router.renormalised or k == 1:
        flags.append(("--moe-router-pre-softmax", None))
        megatron_renormalises = False
    if router.scaling_factor != 1.0:
        flags.append(("--moe-router-topk-scaling-factor", router.scaling_factor))
    notes = []
    if megatron_renormalises != router.renormalised:
        notes.append(
            f"router_renormalised: Megatron-core {'renormalises' if megatron_renormalises else 'does not renormalise'} "
            f"{m.name}'s top-{k} {router.score.value} weights"
        )
    return flags, notes


GPT_LAYER_NORMS = 2  # TransformerLayer: input_layernorm and pre_mlp_layernorm (no post-norms)


def block_norm_notes(m: ModelSpec) -> list[str]:
    """A block with norms after attention and MLP too (Gemma 2 and 3): Megatron-core's GPT layer has two."""
    if m.is_hybrid or m.block_norms == GPT_LAYER_NORMS:
        return []
    return [
        f"block_norms: Megatron-core's TransformerLayer has {GPT_LAYER_NORMS} norms (before attention and MLP); "
        f"{m.name}'s blocks have {m.block_norms}, {m.hidden_size} parameters each, left out"
    ]


def fact_flags(m: ModelSpec, tp: int, rotary: bool) -> tuple[Flags, list[str]]:
    """The facts beside the router's flags (``router_flags``, which ``megatron_model.moe_flags`` writes): the
    norm's epsilon, the activation, the rotary base and scaling, the vocabulary padding; with every note,
    the router's included."""
    flags: Flags = [("--norm-epsilon", m.facts.norm_eps)]
    notes: list[str] = []
    for more, more_notes in (
        activation_flags(m),
        rope_flags(m, rotary),
        vocab_flags(m, tp),
        ([], router_flags(m)[1] if m.is_moe else []),
        ([], block_norm_notes(m)),
    ):
        flags += more
        notes += more_notes
    return flags, notes


def moe_bias_refusal(m: ModelSpec, expert_tp: int) -> None:
    """Megatron-core builds biased expert layers only without expert tensor parallelism (TransformerConfig:
    "Bias in Moe is only supported when ETP==1")."""
    if m.is_moe and m.linear_bias and expert_tp > 1:
        raise refuse(
            "Megatron-LM",
            f"Megatron-core builds {m.name}'s expert biases only with expert tensor parallelism 1, not {expert_tp}",
            "etp",
            expert_tp,
            1,
        )
