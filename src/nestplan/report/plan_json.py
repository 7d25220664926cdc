"""The plan object, schema ``nestplan.plan/1`` (every field: docs/formats.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nestplan.cost.prediction import Prediction
from nestplan.job import Job, Optimizer

SCHEMA = "nestplan.plan/1"


@dataclass(frozen=True)
class SearchStats:
    solve_time_s: float
    candidates: int
    pruned_memory: int


def _job(job: Job) -> dict[str, Any]:
    """Every setting of the job, so that an export of the saved plan runs what was costed."""
    return {"global_batch_size": job.global_batch_size, "seq_len": job.seq_len, "dtype": job.dtype,
            "grad_dtype": job.grad_dtype, "optimizer": Optimizer(job.optimizer).value,
            "flash_attention": job.flash_attention}


def _parallel(pred: Prediction) -> dict[str, Any]:
    d = pred.plan
    return {
        "tp": d.tp, "pp": d.pp, "dp": d.dp, "cp": d.cp, "ep": d.ep, "sp": d.sp_active,
        "zero_stage": int(d.zero), "recompute": d.recompute.value, "micro_batch_size": d.micro_batch_size,
        "num_microbatches": pred.num_microbatches, "schedule": d.schedule.value,
        "virtual_stages": d.virtual_stages,
        "layers_per_stage": [s.last_layer - s.first_layer + 1 for s in pred.stages],
    }


def _stages(pred: Prediction) -> list[dict[str, Any]]:
    return [{
        "layers": [s.first_layer, s.last_layer], "embedding": s.has_embedding, "head": s.has_head,
        "devices": s.devices, "time_s": s.cycle_s, "forward_s": s.forward_s, "backward_s": s.backward_s,
        "memory_bytes": s.peak_memory_bytes, "memory_breakdown_bytes": dict(s.memory_bytes),
    } for s in pred.stages]


def _placement(pred: Prediction, level_names: list[str]) -> dict[str, Any]:
    pl = pred.placement
    return {
        "axis_order": list(pl.axis_order),
        "levels_spanned": pl.levels_spanned(),
        "level_names": level_names,
        "pp_boundary_levels": list(pl.pp_boundary_levels),
    }


def _prediction(pred: Prediction) -> dict[str, Any]:
    return {
        "step_time_s": pred.step_time_s,
        "breakdown_s": dict(pred.breakdown_s),
        "tokens_per_s": pred.tokens_per_s,
        "model_tflops_per_device": pred.model_tflops_per_device,
        "hardware_tflops_per_device": pred.hardware_tflops_per_device,
        "mfu": pred.mfu,
        "peak_memory_bytes_per_device": pred.peak_memory_bytes_per_device,
        "memory_breakdown_bytes": dict(pred.memory_breakdown_bytes),
        "memory_capacity_bytes": pred.memory_capacity_bytes,
        "fits": pred.fits,
        "memory_excess_bytes": pred.memory_excess_bytes,
    }


def plan_to_dict(pred: Prediction, *, model: str, cluster: str, devices_total: int, job: Job,
                 level_names: list[str], search: SearchStats) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "model": model,
        "cluster": cluster,
        "devices_total": devices_total,
        "devices_used": pred.devices_used,
        "job": _job(job),
        "parallel": _parallel(pred),
        "stages": _stages(pred),
        "placement": _placement(pred, level_names),
        "prediction": _prediction(pred),
        "search": {"solve_time_s": search.solve_time_s, "candidates": search.candidates,
                   "pruned_memory": search.pruned_memory},
    }
