"""What Megatron-core builds of a model's blocks: the block forms its GPT layers lack, and a hybrid stack
(Nemotron-H) as the layer symbols of its HybridModel, which Megatron-LM's pretrain_hybrid.py trains
(``nestplan.export.megatron`` writes the layer pattern with the costed pipeline split)."""

from __future__ import annotations


from nestplan.cost.evaluator import evaluate_plan
from nestplan.model.spec import FFN, Mixer, ModelSpec
from nestplan.model.ssm import Mamba1Shape
from nestplan.plan import Plan


def hybrid_stack(m: ModelSpec) -> str | None:
    """What makes ``m`` a hybrid stack rather than a GPT (Nemotron-H, Jamba): its Mamba layers by index
    (and its blocks without a mixer or an FFN), or None for a transformer."""
    if not m.is_hybrid:
        return None
    kind = "Mamba-1" if isinstance(m.mamba, Mamba1Shape) else "Mamba-2"
    parts = [f"{kind} mixers in layers {','.join(map(str, m.mamba_layers))}"] if m.mamba_layers else []
    mixerless, ffn_free = m.layers_where(lambda b: b.mixer is Mixer.NONE), m.layers_where(lambda b: b.ffn is FFN.NONE)
    if mixerless:
        parts.append(f"no mixer in layers {','.join(map(str, mixerless))}")
    if ffn_free:
        parts.append(f"no FFN in layers {','.join(map(str, ffn_free))}")
    return "a hybrid stack (" + "; ".join(parts) + ")"


def unbuildable(m: ModelSpec) -> str | None:
    """The first architecture feature of ``m`` that Megatron-core's GPT layers cannot build (it has
    neither a parallel attention + MLP block nor chunked attention: megatron/core/transformer; a hybrid
    stack is no GPT: Megatron-core builds Mamba-2 hybrids as a HybridModel, which this export runs with
    Megatron-LM's pretrain_hybrid.py, and has no Mamba-1 mixer), or None."""
    hybrid = hybrid_stack(m)
    if hybrid:
        if isinstance(m.mamba, Mamba1Shape):
            return f"Mamba-1 mixers (none in Megatron-core) in {hybrid}"
        return f"{hybrid} in a GPT (Megatron-core builds it as a HybridModel: nestplan --export megatron)"
    return _block_unbuildable(m)


def _block_unbuildable(m: ModelSpec) -> str | None:
    """A block form no Megatron-core layer has: attention and MLP in parallel, chunked attention."""
    if m.parallel_block:
        return "attention and MLP in parallel on the block input (Falcon's parallel_attn)"
    if m.attention_chunk_size is not None:
        return "chunked local attention (Llama 4's attention_chunk_size)"
    return None


# Megatron-core's hybrid layer symbols (megatron/core/models/hybrid/hybrid_layer_allocation.py, Symbols):
# one layer each, a pre-norm and its one module; '|' ends a pipeline segment
MAMBA, ATTENTION, MLP, MOE, PIPE = "M", "*", "-", "E", "|"


# what Megatron-LM's hybrid entry point builds its layers from (its examples/mamba/train.sh passes it;
# hybrid_builders.py raises without --spec)
HYBRID_SPEC = ("megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec")


HYBRID_SCRIPT = "pretrain_hybrid.py"


# Megatron-core's MambaMixer fixes its conv width and SSD chunk length and asserts a conv bias: no argument
# sets them (megatron/core/ssm/mamba_mixer.py, MambaMixer.__init__: d_conv=4, chunk_size=128, conv_bias)
MIXER_CONV_KERNEL = 4


MIXER_CHUNK_SIZE = 128


FP8_IN_PROJ_MULTIPLE = 16  # MambaMixer.__init__ asserts 2 d + 2 G N + H a multiple of 16 under FP8


HYBRID_NOTE = (
    "pretrain_hybrid.py and pipe-separated --hybrid-layer-pattern are Megatron-LM's since 2026-04 "
    "(commit 60408d5f, megatron-core 0.19); older Megatron-LM, such as the flag table's pin, trains "
    "hybrids with pretrain_mamba.py and --hybrid-override-pattern, on even pipeline stages only"
)


def hybrid_symbol(m: ModelSpec, index: int) -> str | None:
    """The Megatron-core layer symbol of block ``index``: a Mamba or attention mixer alone, or an FFN
    alone (MoE in ``moe_layers``, else an MLP); None for a block Megatron-core builds as no single layer."""
    mixer, ffn = m.mixer_of(index), m.has_ffn(index)
    if not ffn:
        return {"mamba": MAMBA, "attention": ATTENTION}.get(mixer)
    if mixer == "none":
        return MOE if m.is_moe_layer(index) else MLP
    return None


def hybrid_unbuildable(m: ModelSpec) -> str | None:
    """The first feature of the hybrid stack ``m`` that Megatron-core's HybridModel cannot build as
    nestplan costed it, or None: a Mamba-1 mixer (none in Megatron-core), a block of a mixer and an FFN
    or of neither (no layer symbol), MTP modules (nestplan costs each as a block like the last;
    Megatron's hybrid MTP is a pattern of its own), latent attention, a conv width or conv bias its
    MambaMixer does not have, and the block forms no Megatron-core layer has."""
    if isinstance(m.mamba, Mamba1Shape):
        return unbuildable(m)
    odd = [i for i in range(m.num_layers) if hybrid_symbol(m, i) is None]
    shape = m.mamba
    problems = [
        (
            bool(odd),
            f"blocks that are not one Megatron-core hybrid layer (a mixer and an FFN, or neither) "
            f"in layers {','.join(map(str, odd))}",
        ),
        (m.mtp_layers > 0, f"{m.mtp_layers} MTP modules in a hybrid stack"),
        (m.is_mla, "multi-head latent attention in a hybrid stack (Megatron-core's '+' layers, not exported)"),
        (
            shape is not None and shape.conv_kernel != MIXER_CONV_KERNEL,
            f"a Mamba conv1d of width {shape and shape.conv_kernel} (Megatron-core's MambaMixer: {MIXER_CONV_KERNEL})",
        ),
        (
            shape is not None and not shape.conv_bias,
            "a Mamba conv1d without bias (Megatron-core's MambaMixer asserts one)",
        ),
    ]
    return next((what for bad, what in problems if bad), None) or _block_unbuildable(m)


def hybrid_layers(m: ModelSpec) -> str:
    """The hybrid stack's blocks as Megatron-core's layer symbols, in model order (``hybrid_symbol``)."""
    return "".join(str(hybrid_symbol(m, i)) for i in range(m.num_layers))


def hybrid_notes(plan: Plan) -> list[str]:
    """What the hybrid export needs of Megatron-LM, the SSD chunk length where it differs from the costed,
    and the MoE all-to-all overlap a HybridModel cannot run (it has no build_schedule_plan, which
    Megatron-core's combined 1F1B schedule asks of the model: megatron/core/models/gpt/gpt_model.py
    only), with nestplan's prediction without it."""
    shape, job = plan.model.mamba, plan.job
    notes = [HYBRID_NOTE]
    if shape is not None and shape.chunk_size != MIXER_CHUNK_SIZE:
        notes.append(
            f"Megatron-core's MambaMixer scans in chunks of {MIXER_CHUNK_SIZE} tokens; nestplan costed "
            f"{plan.model.name}'s {shape.chunk_size}"
        )
    if job.settings.moe_comm_overlap:
        other = evaluate_plan(
            plan.model, plan.cluster, plan.dims, job.with_settings(moe_comm_overlap=False), plan.axis_order
        )
        notes.append(
            f"Megatron-core overlaps MoE all-to-alls (--overlap-moe-expert-parallel-comm) in GPT models only: "
            f"the hybrid runs them exposed, for which nestplan predicts step {other.step_time_s:.3f} s "
            f"({other.tokens_per_s:,.0f} tokens/s) instead of {plan.predicted.step_time_s:.3f} s"
        )
    return notes
