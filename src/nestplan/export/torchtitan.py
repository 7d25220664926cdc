"""torchtitan 0.3: the command line (``--parallelism.*``, ``--training.*`` and the activation
checkpoint policy) for ``torchrun -m torchtitan.train``, with a torchrun/SLURM header.

Flag names are those of torchtitan 0.3.0's own parser (``torchtitan_flags.txt``; a test checks
every emitted flag). torchtitan's device mesh is pp, dp_replicate, dp_shard, cp, tp (slowest
first), i.e. tp-cp-ep-dp-pp fastest first; expert parallelism borrows ranks from tp, cp and dp_shard (its
expert mesh is pp, dp_replicate, efsdp, ep with ep fastest: efsdp = dp_shard x cp x tp / ep).
ZeRO maps onto FSDP2: ZeRO 0 replicates (DDP), ZeRO 3 shards parameters and reshards after
forward, ZeRO 1 and 2 shard without resharding (FSDP2 has no optimizer-only sharding).
"""

from __future__ import annotations

from nestplan.export.common import (STAGE_MAJOR, Export, ExportFile, bash_array, expert_group_note, flag_pairs,
                                    header, rank_order_note, refuse, sbatch_lines, torchrun_prologue)
from nestplan.export.plan import ExportInput
from nestplan.job import CpCommType
from nestplan.plan import Plan
from nestplan.strategy.enums import Recompute, Schedule

NAME = "torchtitan"
TITLE = "torchtitan"
PIN = "torchtitan 0.3.0 command-line flags"
SCHEDULES = {Schedule.ONE_F_ONE_B: "1F1B", Schedule.GPIPE: "GPipe", Schedule.INTERLEAVED: "Interleaved1F1B"}
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
MODEL_CONFIGS = {"llama3-8b": ("llama3", "llama3_8b"), "llama3-70b": ("llama3", "llama3_70b"),
                 "llama3.1-405b": ("llama3", "llama3_405b")}   # torchtitan/models/llama3/config_registry.py
Flags = list[tuple[str, object]]


def _data_parallel(plan: Plan) -> tuple[Flags, list[str]]:
    d = plan.dims
    shards = d.dp * d.ep   # torchtitan's dp_shard includes the ranks expert parallelism borrows
    if d.zero == 0:
        if d.ep > 1:
            return ([("--parallelism.data-parallel-replicate-degree", d.dp),
                     ("--parallelism.data-parallel-shard-degree", d.ep)],
                    ["expert parallelism borrows dp_shard ranks in torchtitan: ZeRO 0 runs as HSDP with "
                     f"{d.dp} replicas of {d.ep}-way sharded FSDP"])
        return [("--parallelism.data-parallel-replicate-degree", d.dp),
                ("--parallelism.data-parallel-shard-degree", 1)], []
    reshard = "always" if d.zero == 3 else "never"
    notes = [] if d.zero >= 2 else ["torchtitan's FSDP2 has no optimizer-only sharding: ZeRO 1 runs as FSDP "
                                    "without resharding after forward (gradients sharded too: less memory, "
                                    "reduce-scatter instead of all-reduce)"]
    return [("--parallelism.data-parallel-replicate-degree", 1), ("--parallelism.data-parallel-shard-degree", shards),
            ("--parallelism.fsdp-reshard-after-forward", reshard)], notes


def titan_split(num_layers: int, stages: int, first_less: int, last_less: int) -> list[int] | None:
    """Transformer layers per (virtual) stage as torchtitan 0.3.0 splits them
    (``generate_llm_fqn_per_model_part``): num_layers + first_less + last_less effective layers
    spread evenly, the remainder one each to the first stages, the first stage giving up
    ``first_less`` and the last ``last_less`` layers to the embedding and the head. None where
    torchtitan refuses the numbers."""
    effective = num_layers + first_less + last_less
    per, extra = divmod(effective, stages)
    if stages > effective or per == 0 or first_less > per or last_less > per:
        return None
    counts = [per + (1 if k < extra else 0) for k in range(stages)]
    counts[0] -= first_less
    counts[-1] -= last_less
    return counts


def _stage_weights(target: list[int]) -> tuple[int, int] | None:
    """The (first_less, last_less) for which torchtitan's split equals ``target``, if any."""
    for first in range(max(target) + 1):
        for last in range(max(target) + 1):
            if titan_split(sum(target), len(target), first, last) == target:
                return first, last
    return None


def _pipeline(plan: Plan) -> tuple[Flags, list[str]]:
    d = plan.dims
    if d.pp == 1:
        return [("--parallelism.pipeline-parallel-degree", 1)], []
    flags: Flags = [("--parallelism.pipeline-parallel-degree", d.pp),
                    ("--parallelism.pipeline-parallel-schedule", SCHEDULES[d.schedule]),
                    ("--parallelism.pipeline-parallel-microbatch-size", d.micro_batch_size)]
    v = d.virtual_stages
    target = list(d.virtual_stage_layers(plan.model.num_layers))   # virtual stage i runs on rank i % pp
    weights = _stage_weights(target)
    if weights is None:   # the closest torchtitan split: even, the embedding and head counted as nothing
        weights = (0, 0)
        got = titan_split(sum(target), len(target), 0, 0) or []
        notes = [f"torchtitan's split options cannot express nestplan's layers per stage {','.join(map(str, target))} "
                 f"(it would run {','.join(map(str, got))}); give --parallelism.module-fqns-per-model-part "
                 "explicitly for the costed split"]
    else:
        notes = []
    if v > 1:   # torchtitan makes ceil(effective layers / layers-per-stage) stages, else 2 per rank
        lps = max(target)
        if -(-(sum(target) + sum(weights)) // lps) == len(target):
            flags.append(("--parallelism.pipeline-parallel-layers-per-stage", lps))
        elif v != 2:
            raise refuse(TITLE, f"torchtitan derives the virtual stages from one layer count per stage and "
                         f"cannot make {len(target)} stages of {','.join(map(str, target))}", "virtual_stages", v)
    flags += [("--parallelism.pipeline-parallel-first-stage-less-layers", weights[0]),
              ("--parallelism.pipeline-parallel-last-stage-less-layers", weights[1])]
    return flags, notes


def _checkpoint(plan: Plan) -> tuple[str, list[str]]:
    if plan.dims.recompute is Recompute.FULL:
        return "activation-checkpoint:full", []
    if plan.dims.recompute is Recompute.SELECTIVE:
        return "activation-checkpoint:selective", [
            "torchtitan's selective checkpointing (op policy: keeps matmul outputs, recomputes the rest) is "
            "close to, not the same as, the attention-core recomputation nestplan costed"]
    return "activation-checkpoint:none", []


def _job_notes(plan: Plan) -> list[str]:
    """What torchtitan 0.3.0 cannot be told: its optimizers are Adam and AdamW (the default, the same
    state as Adam), its attention a fused kernel (SDPA), its FSDP reductions in float32."""
    job = plan.job
    notes = []
    if plan.dims.cp > 1 and job.cp_comm_type is not CpCommType.ALLGATHER:
        notes.append(f"torchtitan's context parallelism (PyTorch's context_parallel) all-gathers or rotates K/V "
                     f"shards; it has no {job.cp_comm_type.value} exchange, which nestplan costed: evaluate the plan "
                     "with cp comm type allgather for the run torchtitan makes by default")
    if job.optimizer.value != "adam":
        notes.append(f"torchtitan's optimizers are Adam and AdamW: nestplan costed {job.optimizer.value} (less "
                     "optimizer state); AdamW will hold more memory than predicted")
    if not job.flash_attention:
        notes.append("torchtitan runs attention as a fused kernel (scaled_dot_product_attention): nestplan costed "
                     "attention without one (the score matrices stored), so the run takes less memory and time")
    if job.grad_dtype != "fp32":
        notes.append(f"torchtitan reduces gradients in float32 (--training.mixed-precision-reduce); nestplan costed "
                     f"{job.grad_dtype} gradients")
    if job.fp8:
        notes.append(f"nestplan costed FP8 GEMMs ({job.fp8_recipe.value} scaling): torchtitan 0.3.0's command line "
                     "has no float8 option; add the float8 model converter (torchao) to your config")
    if job.tp_comm_overlap and plan.dims.tp > 1:
        notes.append("nestplan costed tp collectives overlapped with their GEMMs: torchtitan's counterpart is async "
                     "tensor parallelism under torch.compile (--compile.enable-async-tensor-parallel)")
    return notes


def _experts(inp: ExportInput) -> tuple[int, list[str]]:
    """torchtitan's expert-parallel degree: its experts have no tensor parallelism (EP borrows the
    tp ranks instead), so nestplan's experts split ep x tp ways become ep x tp whole-expert shards
    (the same expert weights and FLOPs per device)."""
    d, m = inp.plan.dims, inp.model
    if d.ep == 1:
        return 1, []
    degree = d.ep * d.tp
    if m.num_experts % degree:
        raise refuse(TITLE, f"torchtitan has no expert tensor parallelism; ep {d.ep} x tp {d.tp} = {degree} does not "
                     f"divide the {m.num_experts} experts", "ep", d.ep, m.num_experts)
    notes = [] if d.tp == 1 else [
        f"torchtitan has no expert tensor parallelism: expert-parallel degree {degree} (ep {d.ep} x tp {d.tp}) "
        f"holds the same expert weights per device as nestplan's {d.tp}-way tensor-parallel experts"]
    group = expert_group_note(TITLE, inp, 1, degree, with_tp=True)   # torchtitan's ep is the fastest mesh axis
    return degree, notes + ([group] if group else [])


def all_flags(inp: ExportInput) -> tuple[Flags, str, list[str]]:
    """Every torchtitan flag of the export, the checkpoint subcommand, and the notes."""
    p, d, job = inp.plan, inp.plan.dims, inp.plan.job
    notes = [n for n in [rank_order_note(TITLE, inp, STAGE_MAJOR)] if n]
    ep, ep_notes = _experts(inp)
    flags: Flags = [("--parallelism.tensor-parallel-degree", d.tp),
                    ("--parallelism.enable-sequence-parallel" if d.sp_active
                     else "--parallelism.no-enable-sequence-parallel", None),
                    ("--parallelism.context-parallel-degree", d.cp), ("--parallelism.expert-parallel-degree", ep)]
    dp, dp_notes = _data_parallel(p)
    pipe, pipe_notes = _pipeline(p)
    # with pp the local batch is one pipeline flush of num_microbatches; without, one microbatch per
    # gradient-accumulation step (torchtitan: accumulation = global / (local x dp_replicate x dp_shard))
    local = job.global_batch_size // d.batch_replicas if d.pp > 1 else d.micro_batch_size
    flags += dp + pipe + [("--training.global-batch-size", job.global_batch_size),
                          ("--training.local-batch-size", local),
                          ("--training.seq-len", job.seq_len),
                          ("--training.mixed-precision-param", DTYPES.get(job.dtype, "bfloat16"))]
    ckpt, ckpt_notes = _checkpoint(p)
    return flags, ckpt, notes + ep_notes + dp_notes + pipe_notes + ckpt_notes + _job_notes(p)


def _model_config(name: str) -> tuple[str, str] | None:
    """torchtitan 0.3.0's own --module/--config for a catalog model, where it ships one."""
    return MODEL_CONFIGS.get(name)


def export(inp: ExportInput) -> Export:
    flags, ckpt, notes = all_flags(inp)
    m = inp.model
    known = _model_config(m.name)
    if known is None:
        notes.append(f"torchtitan 0.3.0 ships no config for {m.name}: set TT_MODULE/TT_CONFIG to a module and "
                     f"config of its shape ({m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads} heads"
                     f"{f', {m.num_experts} experts' if m.is_moe else ''})")
    module, config = known or ("llama3", "llama3_debugmodel")
    text = ("#!/usr/bin/env bash\n" + sbatch_lines(inp) + header(inp, TITLE, PIN, notes) + "set -euo pipefail\n"
            + torchrun_prologue(inp, 29500)
            + f'MODULE="${{TT_MODULE:-{module}}}"\nCONFIG="${{TT_CONFIG:-{config}}}"\n\n'
            + bash_array("PARALLEL_ARGS", flag_pairs(flags), "parallelism and batch, as nestplan costed them")
            + '\n"${TORCHRUN[@]}" -m torchtitan.train --module "$MODULE" --config "$CONFIG" \\\n'
            + f'    "${{PARALLEL_ARGS[@]}}" "$@" {ckpt}\n')
    return Export(NAME, (ExportFile("launch_torchtitan.sh", text, executable=True),), tuple(notes))
