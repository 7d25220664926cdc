"""Batch, precision and optimizer as Megatron-LM flags: the gradients' dtype, the optimizer state through
Megatron-Core's precision-aware optimizer, FP8 and the tp communication overlap, with notes for what
Megatron-LM keeps otherwise (``nestplan.export.megatron`` gathers them with the other flags)."""

from __future__ import annotations


from nestplan.export.megatron_model import Flags
from nestplan.job import Job
from nestplan.settings import OptimizerState
from nestplan.plan import Plan


def framework_flags(plan: Plan) -> tuple[Flags, list[str]]:
    """FP8 (Transformer Engine's hybrid format: E4M3 forward, E5M2 gradients) with the costed recipe,
    FP8 parameters, and the userbuffer tp overlap, which Megatron-LM runs only with sequence
    parallelism (nestplan costs no overlap without it either)."""
    job, d = plan.job, plan.dims
    flags: Flags = []
    if job.settings.fp8_recipe is not None:
        flags += [("--fp8-format", "hybrid"), ("--fp8-recipe", job.settings.fp8_recipe.value)]
    if job.settings.fp8_params:
        flags.append(("--fp8-param-gather", None))
    notes = []
    if job.settings.tp_comm_overlap and d.sp_active:
        flags.append(("--tp-comm-overlap", None))
    elif job.settings.tp_comm_overlap and d.tp > 1:
        notes.append(
            "tp communication overlap needs sequence parallelism in Megatron-LM: not set, and nestplan "
            "costed the tp collectives exposed"
        )
    return flags, notes


def training_flags(plan: Plan) -> tuple[Flags, list[str]]:
    """Batch, precision, optimizer and the gradients' dtype: bf16 training accumulates and reduces
    gradients in fp32 unless told --grad-reduce-in-bf16, fp16 training in fp16 unless told
    --accumulate-allreduce-grads-in-fp32 (megatron/training/arguments.py, validate_args)."""
    job = plan.job
    flags: Flags = [("--micro-batch-size", plan.dims.micro_batch_size), ("--global-batch-size", job.global_batch_size)]
    if job.dtype in ("bf16", "fp16"):
        flags.append((f"--{job.dtype}", None))
    flags.append(("--optimizer", job.optimizer.value))
    notes = []
    if job.settings.grad_dtype == "fp32":
        flags.append(("--accumulate-allreduce-grads-in-fp32", None))
    elif job.settings.grad_dtype == job.dtype == "bf16":
        flags.append(("--grad-reduce-in-bf16", None))
    elif job.settings.grad_dtype != job.dtype:
        notes.append(
            f"Megatron-LM accumulates gradients in fp32 or in the training dtype ({job.dtype}), "
            f"not in {job.settings.grad_dtype} as nestplan costed"
        )
    state, state_notes = optimizer_state_flags(plan)
    return flags + state, notes + state_notes


def run_master_bytes(job: Job) -> int:
    """Bytes per parameter of the master copy Megatron-Core's precision-aware optimizer keeps: the 16-bit
    remainders beside bf16 parameters (OptimizerConfig.store_param_remainders, on by default), an fp32
    copy beside FP8 ones."""
    return 4 if job.settings.fp8_params else 2


def optimizer_state_flags(plan: Plan) -> tuple[Flags, list[str]]:
    """The optimizer state as costed, through Megatron-Core's precision-aware Adam (Transformer
    Engine's FusedAdam), which Megatron-Core runs under the distributed optimizer only
    (megatron/core/optimizer/__init__.py): the master weights' remainders, and bf16 moments for
    OptimizerState.BF16. Where it cannot, a note says what Megatron keeps instead."""
    job = plan.job
    if job.settings.optimizer_state is OptimizerState.FP32:
        return [], []
    if plan.dims.zero == 0:
        more = job.with_settings(optimizer_state=OptimizerState.FP32).optimizer_state_bytes - job.optimizer_state_bytes
        return [], [
            f"Megatron-LM's precision-aware optimizer, which keeps the {job.settings.optimizer_state.value} optimizer "
            f"state nestplan costed, needs the distributed optimizer (ZeRO 1 or more): not set, so Megatron "
            f"keeps fp32 master weights and moments, {more} bytes per parameter more"
        ]
    flags: Flags = [("--use-precision-aware-optimizer", None)]
    notes = []
    if job.settings.optimizer_state is OptimizerState.BF16:
        flags += [("--exp-avg-dtype", "bf16"), ("--exp-avg-sq-dtype", "bf16")]
    more = run_master_bytes(job) - job.master_bytes
    if more > 0:
        notes.append(
            f"Megatron-Core's precision-aware optimizer keeps {run_master_bytes(job)} bytes of master weight "
            f"per parameter, {more} more than the {job.settings.optimizer_state.value} state nestplan costed"
        )
    return flags, notes
