"""Which of torchtitan 0.3.0's own models builds a model, chosen by its architecture (never its name), and
what that model cannot express, by the fact's ``stated_facts`` name.

torchtitan 0.3.0 ships (torchtitan/models/): ``llama3`` (Llama3Model: RMSNorm, SwiGLU, rotary GQA),
``qwen3`` (Qwen3Model: the same with per-head query/key RMSNorms, ``Qwen3TransformerBlock`` taking a dense
MLP or a ``MoE`` per layer), ``deepseek_v3`` (DeepSeekV3Model: multi-head latent attention, dense layers
first, MoE with shared experts and node-limited routing) and ``gpt_oss`` (GptOssModel: attention sinks,
per-layer sliding windows, biased projections and router). Every one takes the facts through its configs:
RoPE (models/common/rope.py ``RoPE.Config``: theta, scaling "none"/"llama"/"yarn"), norm epsilon
(``RMSNorm.Config.eps``), the router (models/common/moe.py ``TokenChoiceTopKRouter.Config``: score_func,
route_norm, route_scale, num_expert_groups, num_limited_groups; ``MoE.Config``: shared_experts,
load_balance_coeff, whose ``expert_bias_E`` is DeepSeek-V3's correction bias) and tied embeddings
(models/common/decoder.py ``Decoder.Config.enable_weight_tying``, refused there with pipeline parallelism).

:func:`built_model` is the model torchtitan builds (what nestplan predicts for), :func:`differences` names each
stated fact it builds otherwise; :func:`run_model` refuses where no torchtitan model is close."""

from __future__ import annotations

from dataclasses import replace

from nestplan.export.common import refuse
from nestplan.export.megatron_hybrid import hybrid_stack
from nestplan.model.facts import SILU, RopeType, RouterScore
from nestplan.model.spec import ModelSpec, QKNorm
from nestplan.model.stated import stated_facts

TITLE = "torchtitan"
LLAMA3, QWEN3, DEEPSEEK_V3, GPT_OSS = "llama3", "qwen3", "deepseek_v3", "gpt_oss"
SWIGLU_MULTIPLE = 256  # Llama's FFN sizes are multiples of 256 (Touvron et al. 2023, Llama 2's multiple_of)
DEFAULT_THETA = 10000.0  # RoPE.Config.theta's default: what torchtitan rotates by where a model states no base
SCALINGS = (RopeType.LLAMA3, RopeType.YARN)  # RoPE.Config.scaling "llama" and "yarn"


def architecture(m: ModelSpec) -> str:
    """torchtitan's model for ``m``'s shape: latent attention is DeepSeek-V3's, attention sinks gpt-oss's,
    experts, query/key norms or heads that do not tile the hidden size Qwen3's (its block takes a dense MLP
    or a MoE per layer and an explicit head size), any other decoder Llama 3's."""
    if m.is_mla:
        return DEEPSEEK_V3
    if m.attention_sinks:
        return GPT_OSS
    if m.is_moe or m.qk_norm is not QKNorm.NONE or m.head_dim * m.num_heads != m.hidden_size:
        return QWEN3
    return LLAMA3


def _blockers(m: ModelSpec) -> list[str]:
    """What no torchtitan 0.3.0 model is close to."""
    arch = architecture(m)
    suffix = m.is_moe and m.moe_layers == tuple(range(m.moe_layers[0], m.num_layers))
    every = m.is_moe and len(m.moe_layers) == m.num_layers
    return [
        what
        for bad, what in (
            (not m.causal, "bidirectional attention"),
            (m.attention_chunk_size is not None, "chunked attention"),
            (m.is_hybrid, hybrid_stack(m) if m.is_hybrid else ""),
            (m.moe_probs_on_input, "routing probabilities applied to the experts' input"),
            (m.shared_expert_gate, "a gated shared expert"),
            (m.qk_norm is QKNorm.L2, "L2 query/key norms"),
            (arch == DEEPSEEK_V3 and not suffix, "multi-head latent attention without MoE layers after dense ones"),
            (
                arch == GPT_OSS and (not every or m.num_shared_experts > 0),
                "attention sinks beside dense or shared MLPs",
            ),
        )
        if bad
    ]


def run_model(m: ModelSpec, pipelined: bool = False) -> ModelSpec:
    """The model torchtitan 0.3.0 builds for ``m`` (``pipelined``: with pipeline parallelism, which unties
    the embeddings), refused in one line where no torchtitan model is close."""
    missing = _blockers(m)
    if missing:
        raise refuse(
            TITLE,
            f"torchtitan 0.3.0 builds Llama 3, Qwen3 (dense and MoE), DeepSeek-V3 and gpt-oss models; {m.name} "
            f"has {', '.join(missing)}",
            "model",
            m.name,
        )
    return built_model(m, pipelined)


def _router_scores_all(m: ModelSpec) -> bool:
    """torchtitan's router scores every expert (TokenChoiceTopKRouter.forward); a softmax over all of them
    renormalised over the top k is the softmax over the top-k logits, so those two are the same router."""
    router = m.facts.router
    if router is None:
        return m.router_scores_all_experts
    return m.router_scores_all_experts if router.score is RouterScore.SOFTMAX and router.renormalised else True


def built_model(m: ModelSpec, pipelined: bool = False) -> ModelSpec:
    """What torchtitan builds for ``m`` with :func:`architecture`'s model: ``m`` where that model expresses
    every fact, else ``m`` with what it builds instead (a non-gated MLP's parameters kept by a SwiGLU of 2/3
    its hidden size, rounded to a multiple of 256 as Llama's are, so tp degrees still divide it)."""
    arch = architecture(m)
    f = m.facts
    ffn = m.ffn_hidden_size if m.gated_mlp else SWIGLU_MULTIPLE * round(2 * m.ffn_hidden_size / 3 / SWIGLU_MULTIPLE)
    keeps_scaling = f.rope_scaling is not None and f.rope_scaling.kind in SCALINGS
    facts = replace(
        f,
        # torchtitan's FeedForward and GroupedExperts compute F.silu (feed_forward.py, moe.py); gpt-oss's swiglu its own
        activation=f.activation if f.activation in SILU or arch == GPT_OSS else "silu",
        glu_clamp=f.glu_clamp if arch == GPT_OSS else None,
        glu_linear_offset=f.glu_linear_offset if arch == GPT_OSS else 0.0,
        rope_theta=f.rope_theta if f.rope_theta is not None else DEFAULT_THETA,
        rope_scaling=f.rope_scaling if keeps_scaling else None,
        local_rope_theta=None,
    )
    qk = {QKNorm.FULL: QKNorm.HEAD} if arch == QWEN3 else {QKNorm.HEAD: QKNorm.NONE, QKNorm.FULL: QKNorm.NONE}
    built = replace(
        m,
        norm="rmsnorm",
        gated_mlp=True,
        ffn_hidden_size=ffn,
        linear_bias=arch == GPT_OSS,
        qkv_bias=False,
        learned_position_embeddings=False,
        rotary_fraction=m.rotary_fraction if arch == DEEPSEEK_V3 else 1.0,
        tied_embeddings=m.tied_embeddings and not pipelined,
        dropout=False,
        block_norms=2,
        parallel_block=False,
        router_scores_all_experts=_router_scores_all(m),
        mtp_layers=0,
        blocks=tuple(
            replace(b, window=b.window if arch == GPT_OSS else None, rope=True, qk_norm=qk.get(b.qk_norm, b.qk_norm))
            for b in m.blocks
        ),
        facts=facts,
    )
    return m if built == m else built


def _partial_rope(m: ModelSpec) -> list[str]:
    """YaRN parameters the chosen model keeps but does not apply as Hugging Face does."""
    scaling, arch = m.facts.rope_scaling, architecture(m)
    if scaling is None or scaling.kind is not RopeType.YARN:
        return []
    if arch in (LLAMA3, QWEN3):
        return [
            "rope_scaling: torchtitan's Llama 3 and Qwen3 attention rotate by YaRN's frequencies without its "
            "attention temperature (0.1 ln(factor) + 1)"
        ]
    if scaling.get("attention_factor") is not None:
        return [
            "rope_scaling: torchtitan derives YaRN's attention temperature from the factor; the stated "
            f"attention_factor {scaling.get('attention_factor')} is not applied"
        ]
    if arch == DEEPSEEK_V3 and scaling.get("mscale", 0.0) != scaling.get("mscale_all_dim", 0.0):
        return [
            "rope_scaling: torchtitan's latent attention takes one mscale (mscale_all_dim); the stated mscale "
            f"{scaling.get('mscale')} is not applied to the rotary embedding"
        ]
    return []


def differences(m: ModelSpec, pipelined: bool = False) -> list[str]:
    """Each stated fact of ``m`` that torchtitan builds otherwise, by its ``stated_facts`` name, with what it
    builds instead; and the dropout it does not build."""
    built = built_model(m, pipelined)
    stated, made = stated_facts(m), stated_facts(built)
    named = [
        f"{name} {stated[name]!r}: torchtitan builds {made.get(name, 'none')!r}"
        for name in stated
        if stated[name] != made.get(name)
    ]
    extra = [what for bad, what in ((m.dropout, "dropout: torchtitan builds none"),) if bad]
    return named + extra + _partial_rope(m)
