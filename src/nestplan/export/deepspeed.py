"""DeepSpeed: the JSON config (batch arithmetic, ZeRO stage, precision, optimizer, gradient
accumulation dtype, activation checkpointing, AutoTP width) and a launch script that states what
the user's code must pass.

DeepSpeed's pipeline engine takes the stage count from the user's ``PipelineModule(num_stages=...)``
and the expert-parallel width from ``deepspeed.moe.layer.MoE(ep_size=...)``, not from the config;
the launch script says both. Its topology is pipe-data-model (model fastest): tp-dp-pp.
Context parallelism becomes DeepSpeed-Ulysses sequence parallelism of the same width (an
all-to-all over attention heads instead of the ring nestplan costed; the export says so). ZeRO 2
and 3 cannot run under DeepSpeed's pipeline engine, nor layers given per virtual stage (it runs
no interleaving): such plans are refused.
"""

from __future__ import annotations

import json

from nestplan.export.common import (STAGE_MAJOR, Export, ExportFile, comment_text, header, rank_order_note, refuse,
                                    sbatch_lines, shell_word)
from nestplan.export.plan import ExportInput
from nestplan.plan import Plan
from nestplan.strategy.enums import Recompute, Schedule

NAME = "deepspeed"
TITLE = "DeepSpeed"
PIN = "DeepSpeed >= 0.16.4 JSON config (AutoTP training); validated against deepspeed 0.19"
OPTIMIZERS = {"adam": "Adam", "sgd": "SGD"}   # DeepSpeed's FusedAdam; torch.optim.SGD
ZERO_TESTED = ("adam",)                       # ZeRO refuses other optimizers unless allowed


def config(plan: Plan) -> dict:
    """The DeepSpeed config: train_batch_size = micro batch x accumulation x data-parallel ranks
    (DeepSpeed's data-parallel world is devices / (tp x pp) = dp x ep here)."""
    d, job = plan.dims, plan.job
    cfg: dict = {
        "train_batch_size": job.global_batch_size,
        "train_micro_batch_size_per_gpu": d.micro_batch_size,
        "gradient_accumulation_steps": plan.num_microbatches,
        "zero_optimization": {"stage": int(d.zero), "overlap_comm": True, "contiguous_gradients": True},
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    if job.dtype in ("bf16", "fp16"):
        cfg[job.dtype] = {"enabled": True}
    cfg["optimizer"] = {"type": OPTIMIZERS[job.optimizer.value]}
    if job.optimizer.value not in ZERO_TESTED and d.zero:
        cfg["zero_allow_untested_optimizer"] = True
    if _grad_accumulation_expressible(plan):
        cfg["data_types"] = {"grad_accum_dtype": job.grad_dtype}
    if d.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": d.tp}
    if d.cp > 1:
        cfg["sequence_parallel_size"] = d.cp
    if d.recompute is not Recompute.NONE:
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False, "synchronize_checkpoint_boundary": False}
    return cfg


def _model_dtype(plan: Plan) -> str:
    return plan.job.dtype if plan.job.dtype in ("bf16", "fp16") else "fp32"


def _grad_accumulation_expressible(plan: Plan) -> bool:
    """DeepSpeed accumulates gradients in ``data_types.grad_accum_dtype`` (fp32, fp16 or bf16); without
    ZeRO only in the model's own dtype (DeepSpeedEngine._do_optimizer_sanity_check)."""
    grad = plan.job.grad_dtype
    return grad in ("fp32", "fp16", "bf16") and (plan.dims.zero >= 1 or grad == _model_dtype(plan))


def check(plan: Plan, heads: int) -> None:
    d, optimizer = plan.dims, plan.job.optimizer.value
    if optimizer not in OPTIMIZERS:
        raise refuse(TITLE, f"the optimizers exported are {' and '.join(OPTIMIZERS)}, not {optimizer}",
                     "optimizer", optimizer, list(OPTIMIZERS))
    if d.cp > 1 and heads % (d.cp * d.tp):
        raise refuse(TITLE, f"Ulysses sequence parallelism of {d.cp} with tp {d.tp} needs the {heads} attention "
                     f"heads divisible by {d.cp * d.tp}", "cp", d.cp)
    if d.per_virtual_stage:
        raise refuse(TITLE, "DeepSpeed's pipeline engine runs one contiguous part per stage (PipelineModule, 1F1B) "
                     f"and cannot place layers per virtual stage ({d.pp} x {d.virtual_stages} chunks)",
                     "layers_per_stage", len(d.layers_per_stage or ()), d.pp)
    if d.zero >= 2 and d.pp > 1:
        raise refuse(TITLE, f"DeepSpeed's pipeline engine supports ZeRO 0 and 1 only, the plan has ZeRO "
                     f"{int(d.zero)} with pp {d.pp}", "zero_stage", int(d.zero), 1)


def notes_for(inp: ExportInput) -> list[str]:
    d = inp.plan.dims
    notes = [n for n in [rank_order_note(TITLE, inp, STAGE_MAJOR)] if n]
    if d.pp > 1:
        split = ",".join(map(str, d.layers_per_stage or ()))
        notes.append(f"your code must build PipelineModule(num_stages={d.pp}, partition_method=...) with the "
                     f"transformer layers split {split} (embedding on the first stage, head on the last)")
    if d.cp > 1:
        notes.append(f"cp {d.cp} runs as DeepSpeed-Ulysses (sequence_parallel_size {d.cp}): wrap attention in "
                     "deepspeed.sequence.layer.DistributedAttention; it exchanges heads by all-to-all where "
                     "nestplan costed a ring of key/value blocks")
    if d.ep > 1:
        notes.append(f"your code must build its MoE layers with deepspeed.moe.layer.MoE(ep_size={d.ep}, ...)")
    if d.recompute is Recompute.SELECTIVE:
        notes.append("selective recomputation (the attention core only) is up to your model code: wrap the "
                     "attention core in deepspeed.checkpointing.checkpoint")
    elif d.recompute is Recompute.FULL:
        notes.append("full recomputation: PipelineModule(activation_checkpoint_interval=1), or wrap each layer in "
                     "deepspeed.checkpointing.checkpoint")
    if d.schedule is not Schedule.ONE_F_ONE_B and d.pp > 1:
        notes.append(f"DeepSpeed's pipeline engine runs 1F1B; nestplan costed {d.schedule.value}")
    if d.zero == 1 and d.pp == 1:
        notes.append("ZeRO 1 shards optimizer state over the data-parallel ranks as nestplan costed")
    return notes + _job_notes(inp.plan)


def _job_notes(plan: Plan) -> list[str]:
    """The job settings ds_config.json cannot carry (the config names the optimizer, which an optimizer
    the user's code passes to deepspeed.initialize replaces)."""
    notes = []
    if not _grad_accumulation_expressible(plan):
        notes.append(f"DeepSpeed accumulates gradients in fp32, fp16 or bf16, without ZeRO in the model's "
                     f"{_model_dtype(plan)} only: not in {plan.job.grad_dtype} as nestplan costed")
    if not plan.job.flash_attention:
        notes.append("nestplan costed attention without a fused kernel (the score matrices stored): your model "
                     "code decides which attention runs")
    job = plan.job
    if job.fp8:
        notes.append(f"nestplan costed FP8 GEMMs ({job.fp8_recipe.value} scaling): DeepSpeed has no FP8 setting; "
                     "your model code must run its linear layers in FP8 (Transformer Engine's fp8_autocast)")
    if job.tp_comm_overlap and plan.dims.tp > 1:
        notes.append("nestplan costed tp collectives overlapped with their GEMMs: your model code's tensor-parallel "
                     "layers decide whether they are")
    return notes


def export(inp: ExportInput) -> Export:
    p = inp.plan
    check(p, inp.model.num_heads)
    notes = notes_for(inp)
    text = json.dumps(config(p), indent=2) + "\n"
    launch = ("#!/usr/bin/env bash\n" + sbatch_lines(inp) + header(inp, TITLE, PIN, notes)
              + "set -euo pipefail\n"
              + f"# {comment_text(f'{inp.nodes} nodes x {inp.devices_per_node} GPUs')}; list them in a hostfile "
              + "for the deepspeed launcher\n"
              + f"deepspeed --num_nodes {shell_word(inp.nodes)} --num_gpus {shell_word(inp.devices_per_node)} "
              + '"${TRAIN_SCRIPT:-train.py}" --deepspeed --deepspeed_config ds_config.json "$@"\n')
    return Export(NAME, (ExportFile("ds_config.json", text), ExportFile("launch_deepspeed.sh", launch, True)),
                  tuple(notes))
