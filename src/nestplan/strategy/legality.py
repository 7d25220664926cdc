"""Legality: every rule that refuses a combination of parallel degrees, run settings and model, stated
once as a predicate that returns the error to raise (or None), so that the search space, the
baselines, the evaluator and the exports share them and no control flow catches a user error."""

from __future__ import annotations

import math

from nestplan.errors import ConfigError
from nestplan.hardware.accelerator import Accelerator
from nestplan.job import Job
from nestplan.model.spec import ModelSpec
from nestplan.model.ssm import Mamba1Shape, Mamba2Shape
from nestplan.settings import CpCommType, Fp8Recipe, RunSettings
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute


def _err(message: str, field: str, value: object, limit: object = None) -> ConfigError:
    return ConfigError(message, field=field, value=value, limit=limit)


def tp_conflict(model: ModelSpec, tp: int) -> ConfigError | None:
    """Why tensor parallelism ``tp`` cannot split the model (an error to raise), or None: tp must
    divide the attention heads and the FFN, and tp and the key-value heads must divide one another
    (fewer key-value heads than tp are replicated, Megatron-LM's GQA rule), and tp splits the Mamba
    mixers of a hybrid model (``_mamba_tp_conflict``)."""
    if model.num_heads % tp:
        return _err(f"tp {tp} does not divide the model's {model.num_heads} attention heads", "tp", tp, model.num_heads)
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        return _err(
            f"tp {tp} and the model's {model.num_kv_heads} key-value heads do not divide one another",
            "tp",
            tp,
            model.num_kv_heads,
        )
    if model.ffn_hidden_size % tp:
        return _err(
            f"tp {tp} does not divide the model's FFN size {model.ffn_hidden_size}", "tp", tp, model.ffn_hidden_size
        )
    return _mamba_tp_conflict(model.mamba if model.mamba_layers else None, tp)


def _mamba_tp_conflict(m: Mamba1Shape | Mamba2Shape | None, tp: int) -> ConfigError | None:
    """Why tp cannot split the model's Mamba mixers, or None: tp divides a Mamba-2 mixer's heads and
    groups (Megatron-core MambaMixer asserts ``nheads % tp == 0`` and ``ngroups % tp == 0``), a
    Mamba-1 mixer's channels (vLLM's MambaMixer splits its d inner channels over tp)."""
    if isinstance(m, Mamba2Shape):
        for what, count in (("Mamba heads", m.num_heads), ("Mamba groups", m.groups)):
            if count % tp:
                return _err(f"tp {tp} does not divide the model's {count} {what}", "tp", tp, count)
    elif isinstance(m, Mamba1Shape) and m.inner % tp:
        return _err(f"tp {tp} does not divide the model's {m.inner} Mamba channels", "tp", tp, m.inner)
    return None


def mamba_cp_conflict(m: Mamba1Shape | Mamba2Shape | None, tp: int, cp: int) -> ConfigError | None:
    """Why context parallelism cp cannot split the model's Mamba mixers, or None (Megatron-core
    megatron/core/ssm/mamba_context_parallel.py, MambaContextParallel): a rank's heads (H / tp) are
    split over cp, so tp x cp divides the heads; a rank's groups (G / tp) are split over cp or repeated
    cp / (G / tp) times, so the two divide one another. No framework runs Mamba-1 (Jamba) with cp."""
    if m is None or cp <= 1:
        return None
    if isinstance(m, Mamba1Shape):
        return _err(
            f"cp {cp} cannot split Mamba-1 mixers (Jamba): no framework runs them with context parallelism; use cp 1",
            "cp",
            cp,
            1,
        )
    if m.num_heads % (tp * cp):
        return _err(f"tp x cp = {tp * cp} does not divide the model's {m.num_heads} Mamba heads", "cp", cp, m.num_heads)
    groups = m.groups // tp
    if groups % cp and cp % groups:
        return _err(
            f"cp {cp} and the {groups} Mamba groups per tp rank (groups / tp) do not divide one another",
            "cp",
            cp,
            groups,
        )
    return None


def model_conflict(dims: ParallelDims, model: ModelSpec, seq_len: int) -> ConfigError | None:
    """Why the sub-graph degrees do not divide the model's shape (an error naming both numbers, to
    raise), or None."""
    problem = tp_conflict(model, dims.tp)
    if problem is not None:
        return problem
    if dims.ep > 1 and not model.is_moe:
        return _err(f"ep {dims.ep} needs a mixture-of-experts model; {model.name} is dense", "ep", dims.ep, 1)
    if dims.etp is not None and not model.is_moe:
        return _err(f"etp {dims.etp} needs a mixture-of-experts model; {model.name} is dense", "etp", dims.etp, dims.tp)
    if model.is_moe and model.num_experts % dims.expert_parallel:
        folded = "" if dims.etp is None else f" (ep {dims.ep} x tp {dims.tp} / etp {dims.etp})"
        return _err(
            f"expert parallelism {dims.expert_parallel}{folded} does not divide the model's "
            f"{model.num_experts} experts",
            "ep",
            dims.expert_parallel,
            model.num_experts,
        )
    if model.is_moe and model.moe_ffn_hidden_size % dims.expert_tp:
        return _err(
            f"expert tensor parallelism {dims.expert_tp} does not divide the experts' FFN size "
            f"{model.moe_ffn_hidden_size}",
            "etp",
            dims.expert_tp,
            model.moe_ffn_hidden_size,
        )
    if seq_len % (2 * dims.cp) and dims.cp > 1:
        return _err(
            f"cp {dims.cp} needs the sequence length {seq_len} to be a multiple of 2 x cp = {2 * dims.cp}",
            "cp",
            dims.cp,
            seq_len,
        )
    problem = mamba_cp_conflict(model.mamba if model.mamba_layers else None, dims.tp, dims.cp)
    if problem is not None:
        return problem
    return dims.layers_conflict(model.num_layers)


def check_against_model(dims: ParallelDims, model: ModelSpec, seq_len: int) -> None:
    """Divisibility of the sub-graph degrees against the model's shape (errors name both numbers)."""
    problem = model_conflict(dims, model, seq_len)
    if problem is not None:
        raise problem


def saved_activations_distributed(settings: RunSettings, dims: ParallelDims) -> bool:
    """Whether the plan splits each layer's saved input over its tp ranks (``distribute_saved_activations``):
    where Megatron-Core runs it, under full recomputation with tp > 1 (megatron/training/arguments.py) and
    without sequence parallelism (TransformerConfig refuses both), the setting taking effect nowhere else."""
    full = dims.recompute is Recompute.FULL
    return settings.distribute_saved_activations and full and dims.tp > 1 and not dims.sp_active


def cp_exchange_conflict(
    settings: RunSettings, cp: int, heads_per_device: int, kv_heads_per_device: int
) -> ConfigError | None:
    """Why the settings' context-parallel exchange cannot run at degree ``cp`` with these attention
    heads on a device (after tp), or None. The all-to-alls split a device's query and key/value
    heads over the group (Transformer Engine asserts both divisible); a2a+p2p's group divides cp."""
    kind = settings.cp_comm_type
    if cp == 1 or kind in (CpCommType.P2P, CpCommType.ALLGATHER):
        return None
    group = cp if kind is CpCommType.A2A else settings.cp_a2a_size
    if kind is CpCommType.A2A_P2P and (cp % group or group >= cp):
        return _err(
            f"cp {cp} is not a multiple of the a2a+p2p all-to-all group {group} times 2 or more",
            "cp",
            cp,
            f"a multiple of {group}, above it",
        )
    for name, heads in (("query", heads_per_device), ("key/value", kv_heads_per_device)):
        if heads % group:
            return _err(
                f"cp comm type {kind.value} splits a device's {heads} {name} heads "
                f"over {group} ranks, which does not divide them",
                "cp",
                cp,
                f"a divisor of {heads}",
            )
    return None


def widest_a2a_group(model: ModelSpec, cp: int, tp: int, domain_devices: int) -> int | None:
    """The a2a+p2p all-to-all group meant where none is named: the largest that stays inside one NVLink
    domain (its tp x group ranks consecutive, tp fastest as in the default rank order), leaves a ring of 2
    or more across (it divides cp, below it) and splits a device's query and key/value heads
    (``cp_exchange_conflict``); None where no group does."""
    heads, kv_heads = model.num_heads // tp, math.ceil(model.num_kv_heads / tp)
    for group in range(cp // 2, 1, -1):
        if cp % group == 0 and tp * group <= domain_devices and heads % group == 0 and kv_heads % group == 0:
            return group
    return None


def cp_comm_conflict(job: Job, cp: int, tp: int, model: ModelSpec) -> ConfigError | None:
    """Why ``job``'s context-parallel exchange cannot run at cp with tp's share of the heads, or why cp
    cannot split the model's Mamba mixers (strategy/dims.py ``mamba_cp_conflict``), or None."""
    mamba = mamba_cp_conflict(model.mamba if model.mamba_layers else None, tp, cp)
    return mamba or cp_exchange_conflict(job.settings, cp, model.num_heads // tp, math.ceil(model.num_kv_heads / tp))


def check_cp_comm(dims: ParallelDims, model: ModelSpec, job: Job) -> None:
    problem = cp_comm_conflict(job, dims.cp, dims.tp, model) or moe_overlap_conflict(dims, model, job)
    if problem is not None:
        raise problem


def moe_overlap_conflict(dims: ParallelDims, model: ModelSpec, job: Job) -> ConfigError | None:
    """Why ``job``'s MoE all-to-all overlap (RunSettings.moe_comm_overlap) cannot run this plan, or None:
    Megatron-Core's 1F1B A2A overlap needs expert parallelism, merges a forward with a backward under
    1F1B (interleaved once pp > 1), and no full recomputation
    (megatron/core/transformer/transformer_config.py, overlap_moe_expert_parallel_comm checks)."""
    if not job.settings.moe_comm_overlap:
        return None
    why = None
    if not model.is_moe or dims.expert_parallel < 2:
        why = ("needs expert parallelism", "ep", dims.expert_parallel, ">= 2")
    elif not dims.schedule.runs_moe_a2a_overlap(dims.pp):
        why = ("runs under 1F1B, interleaved once pp > 1", "schedule", dims.schedule.value, "1f1b or interleaved")
    elif dims.recompute is Recompute.FULL:
        why = ("keeps activations (no full recomputation)", "recompute", dims.recompute.value, "none or selective")
    if why is None:
        return None
    text, field, value, limit = why
    return ConfigError(
        f"the MoE all-to-all overlap (--moe-comm-overlap) {text}; the plan has {field} {value}",
        field=field,
        value=value,
        limit=limit,
    )


def accelerator_conflict(settings: RunSettings, accelerator: Accelerator) -> ConfigError | None:
    """Why ``settings`` cannot run on ``accelerator``, or None: FP8 needs FP8 tensor cores (a peak for fp8;
    Transformer Engine's check_fp8_support: compute capability 8.9 or later), and the MXFP8 recipe tensor
    cores that scale 32-element blocks themselves (``mx_block_scaling``; Transformer Engine's
    check_mxfp8_support refuses it below compute capability 10.0, Blackwell)."""
    recipe = settings.fp8_recipe
    if recipe is None:
        return None
    if "fp8" not in accelerator.peak_flops:
        return _err(
            f"accelerator {accelerator.name} has no FP8 tensor cores; FP8 (--fp8, --fp8-recipe) needs Hopper or later",
            "fp8_recipe",
            recipe.value,
            "an accelerator with a peak_fp8_TFLOPS",
        )
    if recipe is Fp8Recipe.MXFP8 and not accelerator.mx_block_scaling:
        usable = ", ".join(r.value for r in Fp8Recipe if r is not Fp8Recipe.MXFP8)
        return _err(
            f"fp8 recipe mxfp8 needs tensor cores that scale 32-element blocks (Blackwell; Transformer Engine "
            f"refuses MXFP8 below compute capability 10.0) and {accelerator.name} has none; use {usable}",
            "fp8_recipe",
            recipe.value,
            usable,
        )
    return None


def check_against_accelerator(settings: RunSettings, accelerator: Accelerator) -> None:
    problem = accelerator_conflict(settings, accelerator)
    if problem is not None:
        raise problem
