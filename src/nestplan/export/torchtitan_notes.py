"""What the torchtitan export notes of the job's settings that torchtitan 0.3.0 cannot be told: its
optimizers, its attention kernel, its gradient reduction dtype, its float8 experts, the FSDP2 overlaps it
always runs and the activation checkpoint it keeps whole."""

from __future__ import annotations

from nestplan.job import Job
from nestplan.plan import Plan
from nestplan.strategy.legality import saved_activations_distributed


def job_notes(plan: Plan) -> list[str]:
    """What torchtitan 0.3.0 cannot be told: its optimizers are Adam and AdamW (the default, the same
    state as Adam), its attention a fused kernel (FlexAttention), its FSDP reductions in float32."""
    job = plan.job
    notes = []
    if job.optimizer.value != "adam":
        notes.append(
            f"torchtitan's optimizers are Adam and AdamW: nestplan costed {job.optimizer.value} (less "
            "optimizer state); AdamW will hold more memory than predicted"
        )
    if not job.settings.flash_attention:
        notes.append(
            "torchtitan runs attention as a fused kernel (FlexAttention): nestplan costed "
            "attention without one (the score matrices stored), so the run takes less memory and time"
        )
    if job.settings.grad_dtype != "fp32":
        notes.append(
            f"torchtitan reduces gradients in float32 (--training.mixed-precision-reduce); nestplan costed "
            f"{job.settings.grad_dtype} gradients"
        )
    if job.fp8 and plan.model.is_moe:
        notes.append(
            "torchtitan's float8 converter swaps linear layers only: the experts' grouped GEMMs run in "
            "bfloat16 where nestplan costed FP8"
        )
    if saved_activations_distributed(job.settings, plan.dims):
        notes.append(
            "nestplan costed each layer's saved input split over the tp ranks (--distribute-saved-activations): "
            "torchtitan's activation checkpoint keeps it whole on every rank, tp times the memory costed for it"
        )
    return notes + _overlap_notes(job)


def _overlap_notes(job: Job) -> list[str]:
    """The data-parallel overlaps torchtitan cannot turn off: FSDP2 reduce-scatters each layer's gradients
    under the backward and prefetches the next layer's parameters (torch.distributed.fsdp fully_shard)."""
    exposed = [
        what
        for what, overlapped in (
            ("the gradient reduction (--no-overlap-grad-reduce)", job.settings.overlap_grad_reduce),
            ("the parameter all-gather (--no-overlap-param-gather)", job.settings.overlap_param_gather),
        )
        if not overlapped
    ]
    if not exposed:
        return []
    return [
        f"nestplan costed {' and '.join(exposed)} exposed: torchtitan's FSDP2 overlaps its reduce-scatters "
        "with the backward and prefetches the next layer's parameters, so the run can be faster than predicted"
    ]
