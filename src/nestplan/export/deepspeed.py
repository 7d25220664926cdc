"""DeepSpeed: the JSON config (batch arithmetic, ZeRO stage, precision, optimizer, gradient
accumulation dtype, activation checkpointing, AutoTP width) and a launch script that states what
the user's code must pass.

DeepSpeed's pipeline engine takes the stage count from the user's ``PipelineModule(num_stages=...)``
and the expert-parallel width from ``deepspeed.moe.layer.MoE(ep_size=...)``, not from the config;
the launch script says both. Its topology is pipe-data-model (model fastest): tp-dp-pp.
Context parallelism becomes DeepSpeed-Ulysses sequence parallelism of the same width (an
all-to-all over attention heads instead of the ring nestplan costed; the export says so). ZeRO 2
and 3 cannot run under DeepSpeed's pipeline engine: such plans are refused.
"""

from __future__ import annotations

import json

from nestplan.export.common import (STAGE_MAJOR, Export, ExportFile, comment_text, header, rank_order_note, refuse,
                                    sbatch_lines, shell_word)
from nestplan.export.plan import ExportInput, PlanSettings
from nestplan.strategy.enums import Recompute, Schedule

NAME = "deepspeed"
TITLE = "DeepSpeed"
PIN = "DeepSpeed >= 0.16.4 JSON config (AutoTP training); validated against deepspeed 0.19"
OPTIMIZERS = {"adam": "Adam", "sgd": "SGD"}   # DeepSpeed's FusedAdam; torch.optim.SGD
ZERO_TESTED = ("adam",)                       # ZeRO refuses other optimizers unless allowed


def config(p: PlanSettings) -> dict:
    """The DeepSpeed config: train_batch_size = micro batch x accumulation x data-parallel ranks
    (DeepSpeed's data-parallel world is devices / (tp x pp) = dp x ep here)."""
    cfg: dict = {
        "train_batch_size": p.global_batch_size,
        "train_micro_batch_size_per_gpu": p.micro_batch_size,
        "gradient_accumulation_steps": p.num_microbatches,
        "zero_optimization": {"stage": p.zero, "overlap_comm": True, "contiguous_gradients": True},
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    if p.dtype in ("bf16", "fp16"):
        cfg[p.dtype] = {"enabled": True}
    cfg["optimizer"] = {"type": OPTIMIZERS[p.optimizer]}
    if p.optimizer not in ZERO_TESTED and p.zero:
        cfg["zero_allow_untested_optimizer"] = True
    if _grad_accumulation_expressible(p):
        cfg["data_types"] = {"grad_accum_dtype": p.grad_dtype}
    if p.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": p.tp}
    if p.cp > 1:
        cfg["sequence_parallel_size"] = p.cp
    if p.recompute is not Recompute.NONE:
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False, "synchronize_checkpoint_boundary": False}
    return cfg


def _model_dtype(p: PlanSettings) -> str:
    return p.dtype if p.dtype in ("bf16", "fp16") else "fp32"


def _grad_accumulation_expressible(p: PlanSettings) -> bool:
    """DeepSpeed accumulates gradients in ``data_types.grad_accum_dtype`` (fp32, fp16 or bf16); without
    ZeRO only in the model's own dtype (DeepSpeedEngine._do_optimizer_sanity_check)."""
    return p.grad_dtype in ("fp32", "fp16", "bf16") and (p.zero >= 1 or p.grad_dtype == _model_dtype(p))


def check(p: PlanSettings, heads: int) -> None:
    if p.optimizer not in OPTIMIZERS:
        raise refuse(TITLE, f"the optimizers exported are {' and '.join(OPTIMIZERS)}, not {p.optimizer}",
                     "optimizer", p.optimizer, list(OPTIMIZERS))
    if p.cp > 1 and heads % (p.cp * p.tp):
        raise refuse(TITLE, f"Ulysses sequence parallelism of {p.cp} with tp {p.tp} needs the {heads} attention "
                     f"heads divisible by {p.cp * p.tp}", "cp", p.cp)
    if p.zero >= 2 and p.pp > 1:
        raise refuse(TITLE, f"DeepSpeed's pipeline engine supports ZeRO 0 and 1 only, the plan has ZeRO {p.zero} "
                     f"with pp {p.pp}", "zero_stage", p.zero, 1)


def notes_for(inp: ExportInput) -> list[str]:
    p = inp.plan
    notes = [n for n in [rank_order_note(TITLE, inp, STAGE_MAJOR)] if n]
    if p.pp > 1:
        split = ",".join(map(str, p.layers_per_stage))
        notes.append(f"your code must build PipelineModule(num_stages={p.pp}, partition_method=...) with the "
                     f"transformer layers split {split} (embedding on the first stage, head on the last)")
    if p.cp > 1:
        notes.append(f"cp {p.cp} runs as DeepSpeed-Ulysses (sequence_parallel_size {p.cp}): wrap attention in "
                     "deepspeed.sequence.layer.DistributedAttention; it exchanges heads by all-to-all where "
                     "nestplan costed a ring of key/value blocks")
    if p.ep > 1:
        notes.append(f"your code must build its MoE layers with deepspeed.moe.layer.MoE(ep_size={p.ep}, ...)")
    if p.recompute is Recompute.SELECTIVE:
        notes.append("selective recomputation (the attention core only) is up to your model code: wrap the "
                     "attention core in deepspeed.checkpointing.checkpoint")
    elif p.recompute is Recompute.FULL:
        notes.append("full recomputation: PipelineModule(activation_checkpoint_interval=1), or wrap each layer in "
                     "deepspeed.checkpointing.checkpoint")
    if p.schedule is not Schedule.ONE_F_ONE_B and p.pp > 1:
        notes.append(f"DeepSpeed's pipeline engine runs 1F1B; nestplan costed {p.schedule.value}")
    if p.zero == 1 and p.pp == 1:
        notes.append("ZeRO 1 shards optimizer state over the data-parallel ranks as nestplan costed")
    return notes + _job_notes(p)


def _job_notes(p: PlanSettings) -> list[str]:
    """The job settings ds_config.json cannot carry (the config names the optimizer, which an optimizer
    the user's code passes to deepspeed.initialize replaces)."""
    notes = []
    if not _grad_accumulation_expressible(p):
        notes.append(f"DeepSpeed accumulates gradients in fp32, fp16 or bf16, without ZeRO in the model's "
                     f"{_model_dtype(p)} only: not in {p.grad_dtype} as nestplan costed")
    if not p.flash_attention:
        notes.append("nestplan costed attention without a fused kernel (the score matrices stored): your model "
                     "code decides which attention runs")
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
