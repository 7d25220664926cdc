"""A model's shape as Megatron-LM flags: attention (grouped queries, MLA, QK-norm, windows, sinks) and
experts (router, shared experts, dispatcher, MTP), for ``nestplan.export.megatron.model_flags``."""

from __future__ import annotations

from dataclasses import dataclass

from nestplan.export.megatron_facts import router_flags
from nestplan.job import Job
from nestplan.model.facts import RopeType
from nestplan.settings import MoeDispatcher
from nestplan.model.spec import ModelSpec
from nestplan.plan import Plan

Flags = list[tuple[str, object]]  # (flag, value or None for a switch), as export.common.flag_pairs writes them


def position_embedding_type(m: ModelSpec) -> str:
    """Megatron's --position-embedding-type: learned, none where no head has rotary positions
    (Nemotron-H's attention), YaRN for a YaRN-scaled rotary outside MLA (whose YaRN is its own,
    MLATransformerConfig.rope_type), else RoPE (on --rotary-percent of each head)."""
    if m.learned_position_embeddings:
        return "learned_absolute"
    if m.rotary_fraction == 0:
        return "none"
    scaling = m.facts.rope_scaling
    return "yarn" if scaling and scaling.kind is RopeType.YARN and not m.is_mla else "rope"


@dataclass(frozen=True)
class AttentionOptions:
    """What Megatron-core's TransformerConfig sets for a model's attention beyond its shape:
    Q/K/V biases (``add_qkv_bias``), a per-head RMSNorm of queries and keys or MLA's latent norms (``qk_layernorm``), a
    sliding window (``window_size`` = (w - 1, 0): a query sees itself and the w - 1 keys before it,
    FlashAttention's convention) on every layer or, with ``windowed`` (1 per window layer:
    TransformerConfig.window_attn_skip_freq as a list), on some, and notes for what it cannot build."""

    qkv_bias: bool
    qk_layernorm: bool
    window: tuple[int, int] | None
    notes: tuple[str, ...]
    windowed: tuple[int, ...] | None = None


def attention_options(m: ModelSpec, per_layer: bool = False) -> AttentionOptions:
    """``per_layer``: the framework takes a window on some layers only (Megatron-LM's --window-attn-skip-freq)."""
    notes = []
    if m.qk_norm == "full":
        notes.append(
            f"qk_norm: {m.name} normalises the whole query and key width (OLMo 2); Megatron-core's qk_layernorm "
            "normalises per head (the same FLOPs and memory to nestplan's precision, other weights)"
        )
    layers = [m.window_of(i) for i in range(m.num_layers)]
    sizes = {w for w in layers if w is not None}
    window, windowed = None, None
    if len(sizes) == 1 and (None not in layers or per_layer):
        window = (min(sizes.pop(), 2**30) - 1, 0)
        windowed = tuple(int(w is not None) for w in layers) if None in layers else None
    elif sizes:
        notes.append(
            f"window: {m.name} mixes sliding-window and full-attention layers; this export gives Megatron-core "
            "no window, so every layer attends to the whole sequence (slower than costed at long sequences)"
        )
    # MLA's latent norms are Megatron-core's qk_layernorm there (MLASelfAttention's q_layernorm, kv_layernorm);
    # without a query latent it would also norm q_proj's input (mla_qk_norm_config.py, _resolve_mla_qk_layernorm)
    qk_layernorm = m.qk_norm != "none" or (m.is_mla and m.q_lora_rank > 0)
    if m.is_mla and not m.q_lora_rank:
        notes.append(
            f"attention_variant: Megatron-core's MLA norms the key/value latent only with qk_layernorm, which without "
            f"a query latent also norms q_proj's input; left out, so {m.name}'s kv latent norm "
            f"({m.kv_lora_rank} parameters a layer) is not built"
        )
    return AttentionOptions(m.qkv_bias and not m.linear_bias, qk_layernorm, window, tuple(notes), windowed)


def mla_flags(m: ModelSpec) -> Flags:
    """Multi-head latent attention (megatron/training/arguments.py _add_mla_args; MLATransformerConfig):
    qk_head_dim is the part of a query/key head without rotary positions."""
    flags: Flags = [("--multi-latent-attention", None)]
    if m.q_lora_rank:
        flags.append(("--q-lora-rank", m.q_lora_rank))
    return flags + [
        ("--kv-lora-rank", m.kv_lora_rank),
        ("--qk-head-dim", m.head_dim - m.qk_rope_head_dim),
        ("--qk-pos-emb-head-dim", m.qk_rope_head_dim),
        ("--v-head-dim", m.value_head_dim),
    ]


def attention_flags(m: ModelSpec) -> Flags:
    opts = attention_options(m, per_layer=True)
    flags: Flags = [("--add-qkv-bias", None)] if opts.qkv_bias else []
    if opts.qk_layernorm:
        flags.append(("--qk-layernorm", None))
    if m.qk_norm == "l2":  # Llama 4's weightless QK-norm (TransformerConfig.qk_l2_norm)
        flags.append(("--qk-l2-norm", None))
    if not all(block.rope for block in m.blocks):  # 1: a layer without rotary positions (arguments.py --no-rope-freq)
        flags.append(("--no-rope-freq", f"[{','.join('0' if block.rope else '1' for block in m.blocks)}]"))
    if m.attention_sinks:  # a learned logit per head in the softmax (TransformerConfig.softmax_type)
        flags.append(("--softmax-type", "learnable"))
    if opts.window is not None:
        flags.append(("--window-size", f"{opts.window[0]},{opts.window[1]}"))
    if opts.windowed is not None:
        flags.append(("--window-attn-skip-freq", f"[{','.join(map(str, opts.windowed))}]"))
    return flags


def dispatcher(job: Job) -> str:
    """Megatron-Core's token dispatcher for the one nestplan costed: the flex dispatcher's backend
    defaults to DeepEP (TransformerConfig.moe_flex_dispatcher_backend)."""
    return "flex" if job.settings.moe_dispatcher is MoeDispatcher.DEEPEP else "alltoall"


def moe_flags(m: ModelSpec, plan: Plan) -> Flags:
    flags: Flags = [
        ("--num-experts", m.num_experts),
        ("--moe-router-topk", m.experts_per_token),
        ("--moe-ffn-hidden-size", m.moe_ffn_hidden_size),
        ("--moe-token-dispatcher-type", dispatcher(plan.job)),
    ]  # as costed
    if len(m.moe_layers) != m.num_layers and not m.is_hybrid:  # a hybrid's pattern places them (E)
        pattern = ",".join("1" if m.is_moe_layer(i) else "0" for i in range(m.num_layers))
        flags.append(("--moe-layer-freq", f"[{pattern}]"))
    if m.num_shared_experts:
        flags.append(("--moe-shared-expert-intermediate-size", m.num_shared_experts * m.shared_expert_ffn_hidden_size))
    if m.routing_groups > 1:  # node-limited routing (TransformerConfig.moe_router_num_groups / group_topk)
        flags += [
            ("--moe-router-num-groups", m.routing_groups),
            ("--moe-router-group-topk", m.routing_groups_per_token),
        ]
    flags += router_flags(m)[0]  # score function, expert bias, renormalisation, scaling factor
    if m.mtp_layers:
        flags.append(("--mtp-num-layers", m.mtp_layers))
    if plan.job.dtype == "bf16":
        flags.append(("--moe-grouped-gemm", None))
    return flags
