"""torchtitan 0.3: the command line (``--parallelism.*``, ``--training.*`` and the activation
checkpoint policy) for ``torchrun -m torchtitan.train``, with a torchrun/SLURM header.

Flag names are those of torchtitan 0.3.0's own parser (``torchtitan_flags.txt``; a test checks
every emitted flag). torchtitan's device mesh is pp, dp_replicate, dp_shard, cp, tp (slowest
first), i.e. tp-cp-ep-dp-pp fastest first, expert parallelism borrowed from dp_shard x cp.
ZeRO maps onto FSDP2: ZeRO 0 replicates (DDP), ZeRO 3 shards parameters and reshards after
forward, ZeRO 1 and 2 shard without resharding (FSDP2 has no optimizer-only sharding).
"""

from __future__ import annotations

from nestplan.export.common import (STAGE_MAJOR, Export, ExportFile, bash_array, flag_pairs, header,
                                    rank_order_note, sbatch_lines, torchrun_prologue)
from nestplan.export.plan import ExportInput, PlanSettings
from nestplan.strategy.enums import Recompute, Schedule

NAME = "torchtitan"
TITLE = "torchtitan"
PIN = "torchtitan 0.3.0 command-line flags"
SCHEDULES = {Schedule.ONE_F_ONE_B: "1F1B", Schedule.GPIPE: "GPipe", Schedule.INTERLEAVED: "Interleaved1F1B"}
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
Flags = list[tuple[str, object]]


def _data_parallel(p: PlanSettings) -> tuple[Flags, list[str]]:
    shards = p.dp * p.ep   # torchtitan's dp_shard includes the ranks expert parallelism borrows
    if p.zero == 0:
        if p.ep > 1:
            return ([("--parallelism.data-parallel-replicate-degree", p.dp),
                     ("--parallelism.data-parallel-shard-degree", p.ep)],
                    ["expert parallelism borrows dp_shard ranks in torchtitan: ZeRO 0 runs as HSDP with "
                     f"{p.dp} replicas of {p.ep}-way sharded FSDP"])
        return [("--parallelism.data-parallel-replicate-degree", p.dp),
                ("--parallelism.data-parallel-shard-degree", 1)], []
    reshard = "always" if p.zero == 3 else "never"
    notes = [] if p.zero >= 2 else ["torchtitan's FSDP2 has no optimizer-only sharding: ZeRO 1 runs as FSDP "
                                    "without resharding after forward (gradients sharded too: less memory, "
                                    "reduce-scatter instead of all-reduce)"]
    return [("--parallelism.data-parallel-replicate-degree", 1), ("--parallelism.data-parallel-shard-degree", shards),
            ("--parallelism.fsdp-reshard-after-forward", reshard)], notes


def _pipeline(p: PlanSettings) -> tuple[Flags, list[str]]:
    if p.pp == 1:
        return [("--parallelism.pipeline-parallel-degree", 1)], []
    flags: Flags = [("--parallelism.pipeline-parallel-degree", p.pp),
                    ("--parallelism.pipeline-parallel-schedule", SCHEDULES[p.schedule]),
                    ("--parallelism.pipeline-parallel-microbatch-size", p.micro_batch_size)]
    n, notes = p.layers_per_stage, []
    per_rank = max(n)
    if p.virtual_stages > 1:
        flags.append(("--parallelism.pipeline-parallel-layers-per-stage", per_rank // p.virtual_stages))
    middle = n[1:-1]
    if len(set(n)) > 1:
        if len(set(middle)) <= 1 and n[0] <= per_rank and n[-1] <= per_rank and p.virtual_stages == 1:
            flags += [("--parallelism.pipeline-parallel-first-stage-less-layers", per_rank - n[0]),
                      ("--parallelism.pipeline-parallel-last-stage-less-layers", per_rank - n[-1])]
        else:
            notes.append(f"torchtitan splits layers evenly apart from the first and last stage; nestplan's split "
                         f"{','.join(map(str, n))} needs --parallelism.module-fqns-per-model-part")
    return flags, notes


def _checkpoint(p: PlanSettings) -> tuple[str, list[str]]:
    if p.recompute is Recompute.FULL:
        return "activation-checkpoint:full", []
    if p.recompute is Recompute.SELECTIVE:
        return "activation-checkpoint:selective", [
            "torchtitan's selective checkpointing (op policy: keeps matmul outputs, recomputes the rest) is "
            "close to, not the same as, the attention-core recomputation nestplan costed"]
    return "activation-checkpoint:none", []


def all_flags(inp: ExportInput) -> tuple[Flags, str, list[str]]:
    """Every torchtitan flag of the export, the checkpoint subcommand, and the notes."""
    p = inp.plan
    notes = [n for n in [rank_order_note(TITLE, inp, STAGE_MAJOR)] if n]
    flags: Flags = [("--parallelism.tensor-parallel-degree", p.tp),
                    ("--parallelism.enable-sequence-parallel" if p.sp else "--parallelism.no-enable-sequence-parallel",
                     None),
                    ("--parallelism.context-parallel-degree", p.cp), ("--parallelism.expert-parallel-degree", p.ep)]
    dp, dp_notes = _data_parallel(p)
    pipe, pipe_notes = _pipeline(p)
    flags += dp + pipe + [("--training.global-batch-size", p.global_batch_size),
                          ("--training.local-batch-size", p.global_batch_size // (p.dp * p.ep)),
                          ("--training.seq-len", p.seq_len),
                          ("--training.mixed-precision-param", DTYPES.get(p.dtype, "bfloat16"))]
    ckpt, ckpt_notes = _checkpoint(p)
    return flags, ckpt, notes + dp_notes + pipe_notes + ckpt_notes


def export(inp: ExportInput) -> Export:
    flags, ckpt, notes = all_flags(inp)
    m = inp.model
    notes.append(f"torchtitan builds its models from its own modules: pick the --module/--config matching "
                 f"{m.name} ({m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads} heads)")
    text = ("#!/usr/bin/env bash\n" + sbatch_lines(inp) + header(inp, TITLE, PIN, notes) + "set -euo pipefail\n"
            + torchrun_prologue(inp, 29500)
            + 'MODULE="${TT_MODULE:-llama3}"\nCONFIG="${TT_CONFIG:-llama3_8b}"\n\n'
            + bash_array("PARALLEL_ARGS", flag_pairs(flags), "parallelism and batch, as nestplan costed them")
            + '\n"${TORCHRUN[@]}" -m torchtitan.train --module "$MODULE" --config "$CONFIG" \\\n'
            + f'    "${{PARALLEL_ARGS[@]}}" "$@" {ckpt}\n')
    return Export(NAME, (ExportFile("launch_torchtitan.sh", text, executable=True),), tuple(notes))
