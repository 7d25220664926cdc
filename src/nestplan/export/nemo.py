"""NeMo 2 / Megatron-Bridge: Hydra-style recipe overrides (``section.field=value``) for the plan.

Keys are field names of Megatron-Bridge 0.3.1's ConfigContainer (``megatron_bridge_keys.txt``; a
test checks every emitted key). Megatron-Bridge runs Megatron-core, so parallelism, recomputation
and rank order follow the Megatron-LM exporter; the overrides go on top of a recipe for the model.
"""

from __future__ import annotations

import re

from nestplan.export import megatron
from nestplan.export.common import (REPLICA_MAJOR, Export, ExportFile, bash_array, header, sbatch_lines, shell_word,
                                    torchrun_prologue)
from nestplan.export.plan import ExportInput
from nestplan.job import CpCommType, Fp8Recipe
from nestplan.plan import Plan
from nestplan.strategy.enums import Recompute

NAME = "nemo"
TITLE = "NeMo / Megatron-Bridge"
PIN = "Megatron-Bridge 0.3.1 ConfigContainer override keys"
_HYDRA_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")   # a string Hydra's override grammar reads unquoted
_HYDRA_QUOTABLE = re.compile(r"[A-Za-z0-9_.*|+()-]*")   # no quote, backslash or $: literal in Hydra's double quotes


def _value(v: object) -> str:
    """An override value in Hydra's grammar: booleans, null and integers as literals, lists bracketed; other strings
    double-quoted unless a plain identifier (the pipeline layout's '|', '*' and '()' need the quotes)."""
    if isinstance(v, bool) or v is None:
        return "true" if v is True else "false" if v is False else "null"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ",".join(_value(x) for x in v) + "]"
    text = str(v)
    if _HYDRA_WORD.fullmatch(text) and text.lower() not in ("true", "false", "null", "nan", "inf"):
        return text
    assert _HYDRA_QUOTABLE.fullmatch(text), f"override values are nestplan's own words: {text!r}"
    return f'"{text}"'


def overrides(inp: ExportInput) -> tuple[list[tuple[str, object]], list[str]]:
    """(key, value) overrides and the notes."""
    p, d, job = inp.plan, inp.plan.dims, inp.plan.job
    megatron.check(inp)
    order, notes = megatron.rank_layout(inp, TITLE, "tp-pp-dp mapping")
    out: list[tuple[str, object]] = [
        ("model.tensor_model_parallel_size", d.tp), ("model.pipeline_model_parallel_size", d.pp),
        ("model.context_parallel_size", d.cp), ("model.sequence_parallel", d.sp_active),
        ("model.expert_model_parallel_size", d.ep), ("model.seq_length", job.seq_len),
        ("train.global_batch_size", job.global_batch_size), ("train.micro_batch_size", d.micro_batch_size),
        ("mixed_precision", _precision_recipe(job))]
    if d.ep > 1:
        out.append(("model.expert_tensor_parallel_size", d.tp))
    if d.cp > 1:
        out.append(("model.cp_comm_type", job.cp_comm_type.value))
        if job.cp_comm_type is CpCommType.A2A_P2P:
            out.append(("model.hierarchical_context_parallel_sizes", [job.cp_a2a_size, d.cp // job.cp_a2a_size]))
    if d.virtual_stages > 1:
        out.append(("model.virtual_pipeline_model_parallel_size", d.virtual_stages))
    n = d.layers_per_stage or ()
    if len(set(n)) > 1:
        if d.virtual_stages == 1 and len(set(n[1:-1])) <= 1:
            out += [("model.num_layers_in_first_pipeline_stage", n[0]),
                    ("model.num_layers_in_last_pipeline_stage", n[-1])]
        else:
            out.append(("model.pipeline_model_parallel_layout", megatron.layout(p)))
    out += _recompute(p) + _zero(p, notes) + _job(p, notes) + _framework(p, notes)
    if order == REPLICA_MAJOR:   # Megatron-core's tp-cp-ep-pp-dp order (--use-tp-pp-dp-mapping)
        out.append(("dist.use_tp_pp_dp_mapping", True))
    return out, notes


# Megatron-Bridge's mixed-precision recipes per FP8 scaling (megatron/bridge/training/mixed_precision.py)
FP8_RECIPES = {Fp8Recipe.DELAYED: "with_fp8_delayed_scaling", Fp8Recipe.TENSORWISE: "with_fp8_current_scaling",
               Fp8Recipe.BLOCKWISE: "with_fp8_subchannel_scaling", Fp8Recipe.MXFP8: "with_mxfp8"}


def _precision_recipe(job) -> str | None:
    if job.dtype not in ("bf16", "fp16"):
        return None
    return f"{job.dtype}_{FP8_RECIPES[job.fp8_recipe]}_mixed" if job.fp8 else f"{job.dtype}_mixed"


def _framework(plan: Plan, notes: list[str]) -> list[tuple[str, object]]:
    """The userbuffer tp overlap (with sequence parallelism, as Megatron needs) and what the
    mixed-precision recipe decides that nestplan may have costed otherwise."""
    job, d = plan.job, plan.dims
    if job.fp8_recipe is Fp8Recipe.TENSORWISE:
        notes.append("Megatron-Bridge's current-scaling FP8 recipe keeps the first and last transformer layers in "
                     "bf16 (first_last_layers_bf16); nestplan costed every block's GEMMs in FP8")
    if job.fp8_params:
        notes.append("nestplan costed parameters kept and all-gathered in FP8: set fp8_param_gather in your "
                     "recipe's mixed_precision")
    out: list[tuple[str, object]] = []
    if job.tp_comm_overlap and d.sp_active:
        out.append(("model.tp_comm_overlap", True))
    elif job.tp_comm_overlap and d.tp > 1:
        notes.append("tp communication overlap needs sequence parallelism: not set, and nestplan costed the tp "
                     "collectives exposed")
    return out


def _recompute(plan: Plan) -> list[tuple[str, object]]:
    if plan.dims.recompute is Recompute.FULL:
        return [("model.recompute_granularity", "full"), ("model.recompute_method", "uniform"),
                ("model.recompute_num_layers", 1)]
    if plan.dims.recompute is Recompute.SELECTIVE:
        return [("model.recompute_granularity", "selective")]
    return [("model.recompute_granularity", None)]


def _job(plan: Plan, notes: list[str]) -> list[tuple[str, object]]:
    """Optimizer and attention kernel as costed. The gradients' dtype comes with the mixed-precision
    recipe (bf16_mixed reduces in fp32, fp16_mixed in fp16; it overwrites the ddp section's choice):
    a note where that is not the dtype costed."""
    job = plan.job
    recipe_grads = "fp16" if job.dtype == "fp16" else "fp32"
    if job.grad_dtype != recipe_grads:
        notes.append(f"Megatron-Bridge's mixed-precision recipe for {job.dtype} keeps gradients in {recipe_grads}; "
                     f"nestplan costed {job.grad_dtype} (set grad_reduce_in_fp32 in your recipe's mixed_precision)")
    return [("optimizer.optimizer", job.optimizer.value),
            ("model.attention_backend", "flash" if job.flash_attention else "unfused")]


def _zero(plan: Plan, notes: list[str]) -> list[tuple[str, object]]:
    zero = int(plan.dims.zero)
    if zero == 0:
        return [("ddp.use_distributed_optimizer", False), ("optimizer.use_distributed_optimizer", False)]
    if zero == 1:
        job = plan.job
        return [("ddp.use_distributed_optimizer", True), ("optimizer.use_distributed_optimizer", True),
                ("ddp.overlap_grad_reduce", job.overlap_grad_reduce),
                ("ddp.overlap_param_gather", job.overlap_param_gather)]
    notes.append(f"ZeRO {zero} runs as Megatron-FSDP")
    strategy = "optim_grads" if zero == 2 else "optim_grads_params"
    return [("ddp.use_megatron_fsdp", True), ("ddp.data_parallel_sharding_strategy", strategy),
            ("ddp.use_distributed_optimizer", True), ("optimizer.use_distributed_optimizer", True)]


def export(inp: ExportInput) -> Export:
    items, notes = overrides(inp)
    lines = [f"{k}={_value(v)}" for k, v in items]
    text = ("#!/usr/bin/env bash\n" + sbatch_lines(inp) + header(inp, TITLE, PIN, notes) + "set -euo pipefail\n"
            + torchrun_prologue(inp, 29500)
            + 'RECIPE_SCRIPT="${RECIPE_SCRIPT:-run_recipe.py}"   # your Megatron-Bridge recipe entry point\n\n'
            + bash_array("OVERRIDES", [shell_word(line) for line in lines],
                         "on top of the model's recipe, as nestplan costed them")
            + '\n"${TORCHRUN[@]}" "$RECIPE_SCRIPT" "${OVERRIDES[@]}" "$@"\n')
    return Export(NAME, (ExportFile("launch_nemo.sh", text, executable=True),
                         ExportFile("nemo_overrides.txt", "\n".join(lines) + "\n")), tuple(notes))
