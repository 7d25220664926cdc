"""Writing the plan JSON: the fields both schemas share (``sections``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nestplan.job import Job
from nestplan.plan.summary import PredictionSummary, StageSummary
from nestplan.search.stats import SearchStats
from nestplan.strategy.dims import ParallelDims


def sections(
    dims: ParallelDims,
    axis_order: Sequence[str],
    job: Job,
    predicted: PredictionSummary,
    level_names: Sequence[str],
    search: SearchStats,
) -> dict[str, Any]:
    """The fields both schemas share after ``devices_total``: devices_used, job, parallel, stages,
    placement, prediction, search."""
    p = predicted
    return {
        "devices_used": dims.devices,
        "job": job.to_dict(),
        "parallel": _parallel(dims, job),
        "stages": [_stage(s) for s in p.stages],
        "placement": {
            "axis_order": [str(a) for a in axis_order],
            "levels_spanned": dict(p.levels_spanned),
            "level_names": list(level_names),
            "pp_boundary_levels": list(p.pp_boundary_levels),
        },
        "prediction": _prediction(p),
        "search": {
            "solve_time_s": search.solve_time_s,
            "candidates": search.candidates,
            "pruned_memory": search.pruned_memory,
        },
    }


def _parallel(dims: ParallelDims, job: Job) -> dict[str, Any]:
    """The parallel section: degrees, ZeRO, recomputation, microbatches, schedule, layers per stage."""
    return {
        "tp": dims.tp,
        "pp": dims.pp,
        "dp": dims.dp,
        "cp": dims.cp,
        "ep": dims.ep,
        "sp": dims.sp_active,
        "etp": dims.expert_tp,
        "expert_parallel": dims.expert_parallel,
        "zero_stage": int(dims.zero),
        "recompute": dims.recompute.value,
        "micro_batch_size": dims.micro_batch_size,
        "num_microbatches": dims.num_microbatches(job.global_batch_size),
        "schedule": dims.schedule.value,
        "virtual_stages": dims.virtual_stages,
        "layers_per_stage": list(dims.layers_per_stage or ()),
    }


def _stage(s: StageSummary) -> dict[str, Any]:
    """One entry of the stages section."""
    return {
        "layers": [s.first_layer, s.last_layer],
        "embedding": s.has_embedding,
        "head": s.has_head,
        "devices": s.devices,
        "time_s": s.cycle_s,
        "forward_s": s.forward_s,
        "backward_s": s.backward_s,
        "memory_bytes": s.memory_bytes,
        "memory_breakdown_bytes": dict(s.memory_breakdown_bytes),
    }


def _prediction(p: PredictionSummary) -> dict[str, Any]:
    """The prediction section: step time and its breakdown, throughput, memory and whether it fits."""
    return {
        "step_time_s": p.step_time_s,
        "breakdown_s": dict(p.breakdown_s),
        "tokens_per_s": p.tokens_per_s,
        "model_tflops_per_device": p.model_tflops_per_device,
        "hardware_tflops_per_device": p.hardware_tflops_per_device,
        "mfu": p.mfu,
        "peak_memory_bytes_per_device": p.peak_memory_bytes_per_device,
        "memory_breakdown_bytes": dict(p.memory_breakdown_bytes),
        "memory_capacity_bytes": p.memory_capacity_bytes,
        "fits": p.fits,
        "memory_excess_bytes": p.memory_excess_bytes,
    }
