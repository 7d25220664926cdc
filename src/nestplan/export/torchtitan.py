"""torchtitan 0.3: the command line (``--parallelism.*``, ``--training.*``, ``--compile.*`` and the
activation checkpoint policy) for ``torchrun -m torchtitan.train``, with a torchrun/SLURM header, and
the config module it names (``nestplan_torchtitan.py``: the model torchtitan builds for the plan, FP8
linears only where nestplan costed them).

Flag names are those of torchtitan 0.3.0's own parser (``torchtitan_flags.txt``; a test checks
every emitted flag, and tests/unit/test_real_torchtitan.py parses the launched command with
torchtitan itself). torchtitan's device mesh is pp, dp_replicate, dp_shard, cp, tp (slowest
first), i.e. tp-cp-ep-dp-pp fastest first; expert parallelism borrows ranks from tp, cp and dp_shard (its
expert mesh is pp, dp_replicate, efsdp, ep with ep fastest: efsdp = dp_shard x cp x tp / ep).
Where the costed order differs, the launch script renumbers the nodes when that lands every rank
on its costed device, else a note quotes the prediction under torchtitan's order.
ZeRO maps onto FSDP2: ZeRO 0 replicates (DDP), ZeRO 3 shards parameters and reshards after
forward, ZeRO 1 and 2 shard without resharding (FSDP2 has no optimizer-only sharding).
What torchtitan runs differently (all-gathered K/V for context parallelism, rowwise FP8, a fact its model of
the architecture cannot express, named as ``stated_facts`` names it: torchtitan_arch) is noted with nestplan's prediction for it; a ZB-H1 plan
(torch.distributed.pipelining has no single-chunk zero-bubble schedule) is refused, naming 1F1B's prediction.
"""

from __future__ import annotations

from dataclasses import replace

from nestplan.cost.evaluator import evaluate_plan
from nestplan.export import rank_order
from nestplan.export.common import (
    stack_notes,
    notes,
    sets,
    STAGE_MAJOR,
    Export,
    ExportFile,
    bash_array,
    counts_text,
    expert_group_note,
    flag_pairs,
    header,
    rank_order_note,
    refuse,
    schedule_refusal,
    sbatch_lines,
    torchrun_prologue,
)
from nestplan.export.plan import ExportInput
from nestplan.export.torchtitan_notes import job_notes
from nestplan.export.torchtitan_arch import architecture, differences, run_model
from nestplan.export.torchtitan_model import CONFIG_FUNCTION, CONFIG_MODULE, MODEL_CONFIGS, config_module
from nestplan.export.torchtitan_split import layers_per_stage_flag, listed_split, stage_weights
from nestplan.export.torchtitan_split import titan_split as titan_split  # re-exported: the split lives there
from nestplan.job import Job
from nestplan.settings import CpCommType, Fp8Recipe, MoeDispatcher, OptimizerState, Framework
from nestplan.model.config import catalog_architecture
from nestplan.model.spec import ModelSpec
from nestplan.plan import Plan
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, Schedule

NAME = "torchtitan"
TITLE = "torchtitan"
PIN = "torchtitan 0.3.0 command-line flags"
# torch.distributed.pipelining's schedule names (get_schedule_class); it has no single-chunk ZB-H1: a plan
# under it is refused (``export``), naming its closest, 1F1B (the same microbatch order, the backward whole)
SCHEDULES = {
    Schedule.ONE_F_ONE_B: "1F1B",
    Schedule.GPIPE: "GPipe",
    Schedule.INTERLEAVED: "Interleaved1F1B",
    Schedule.ZBV: "ZBVZeroBubble",
    Schedule.DUALPIPEV: "DualPipeV",
}
COSTED_SCHEDULES = tuple(SCHEDULES)  # what it runs as nestplan costs it
CP_EXCHANGES = (CpCommType.ALLGATHER,)  # 0.3.0's context parallelism all-gathers K/V (FlexAttention)
EXPERT_TP = (1,)  # 0.3.0's experts have no tensor parallelism: expert parallelism borrows the tp ranks
# What the export does with every run setting (settings.RunSettings) that differs from its default;
# tests/unit/test_export_settings.py checks each declaration against the export itself
SETTINGS = {
    "framework": notes("a plan costed for another framework: the note says so"),
    "attention_kernel": notes("a kernel other than the framework's: the note names both"),
    "grad_dtype": notes("FSDP reduces gradients in float32 (mixed_precision_reduce)"),
    "flash_attention": notes("torchtitan runs its SDPA attention"),
    "tp_comm_overlap": sets("--compile.enable --compile.enable-async-tensor-parallel"),
    "overlap_grad_reduce": notes("FSDP2 overlaps its reduce-scatters with the backward (noted when costed exposed)"),
    "overlap_param_gather": notes("FSDP2 prefetches the next layer's parameters (noted when costed exposed)"),
    "fp8_recipe": sets("float8 converter (rowwise current scaling; other recipes noted)"),
    "fp8_params": sets("float8 converter; FP8 parameters noted"),
    "cp_comm_type": notes("its context parallelism is the ring (allgather, p2p)"),
    "cp_a2a_size": notes("no hierarchical context parallelism"),
    "moe_comm_overlap": notes("no overlap of expert all-to-alls"),
    "moe_capacity_factor": notes("dropless routing"),
    "moe_dispatcher": notes("its all-to-all dispatch"),
    "distribute_saved_activations": notes("its activation checkpoint keeps each layer's whole input"),
    "optimizer_state": notes("float32 parameters and moments"),
}
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}  # TrainingConfig.mixed_precision_param's choices
Flags = list[tuple[str, object]]


def moe_comm_overlap(m: ModelSpec) -> bool:
    """Whether it runs ``m``'s expert all-to-alls under another microbatch's compute: never
    (0.3.0 has no cross-microbatch all-to-all overlap)."""
    return False


def _data_parallel(plan: Plan) -> tuple[Flags, list[str]]:
    d = plan.dims
    shards = d.dp * d.ep  # torchtitan's dp_shard includes the ranks expert parallelism borrows
    if d.zero == 0:
        if d.ep > 1:
            return (
                [
                    ("--parallelism.data-parallel-replicate-degree", d.dp),
                    ("--parallelism.data-parallel-shard-degree", d.ep),
                ],
                [
                    "expert parallelism borrows dp_shard ranks in torchtitan: ZeRO 0 runs as HSDP with "
                    f"{d.dp} replicas of {d.ep}-way sharded FSDP"
                ],
            )
        return [
            ("--parallelism.data-parallel-replicate-degree", d.dp),
            ("--parallelism.data-parallel-shard-degree", 1),
        ], []
    reshard = "always" if d.zero == 3 else "never"  # ZeRO 1 and 2 alike (without pp ZeRO 1 runs as 2: _run_job)
    notes = (
        []
        if d.zero != 1 or d.pp == 1
        else [
            "torchtitan's FSDP2 has no optimizer-only sharding: ZeRO 1 runs as FSDP without resharding after forward; "
            "torch's pipeline stages defer its gradient reduce-scatter to the last microbatch, so the step communicates "
            "as ZeRO 1 does"
        ]
    )
    return [
        ("--parallelism.data-parallel-replicate-degree", 1),
        ("--parallelism.data-parallel-shard-degree", shards),
        ("--parallelism.fsdp-reshard-after-forward", reshard),
    ], notes


def _pipeline(plan: Plan) -> tuple[Flags, list[str]]:
    d = plan.dims
    if d.pp == 1:
        return [("--parallelism.pipeline-parallel-degree", 1)], []
    flags: Flags = [
        ("--parallelism.pipeline-parallel-degree", d.pp),
        ("--parallelism.pipeline-parallel-schedule", SCHEDULES[d.schedule]),
        ("--parallelism.pipeline-parallel-microbatch-size", d.micro_batch_size),
    ]
    listed = listed_split(plan)
    if listed is not None:
        return flags, [
            f"torchtitan's split flags cannot give nestplan's layers per stage {counts_text(listed)}: "
            f"{CONFIG_MODULE}.py lists each stage's modules (parallelism.module_fqns_per_model_part)"
        ]
    target = list(d.virtual_stage_layers(plan.model.num_layers))
    weights = stage_weights(target)
    assert weights is not None, "listed_split lists every split the weights cannot give"
    lps = layers_per_stage_flag(target, weights)
    if d.virtual_stages > 1 and lps is not None:
        flags.append(("--parallelism.pipeline-parallel-layers-per-stage", lps))
    flags += [
        ("--parallelism.pipeline-parallel-first-stage-less-layers", weights[0]),
        ("--parallelism.pipeline-parallel-last-stage-less-layers", weights[1]),
    ]
    return flags, []


def _checkpoint(plan: Plan) -> tuple[str, list[str]]:
    if plan.dims.recompute is Recompute.FULL:
        return "activation-checkpoint:full", []
    if plan.dims.recompute is Recompute.SELECTIVE:
        return "activation-checkpoint:selective", [
            "torchtitan's selective checkpointing (op policy: keeps matmul outputs, recomputes the rest) is "
            "close to, not the same as, the attention-core recomputation nestplan costed"
        ]
    return "activation-checkpoint:none", []


def _run_job(plan: Plan) -> tuple[ModelSpec, ParallelDims, Job, list[str]]:
    """The model, degrees and job torchtitan 0.3.0 runs for the plan where they differ in what nestplan
    can cost, and what differs: a model is built as torchtitan's model of its architecture, with what that
    cannot express built otherwise (``torchtitan_arch.run_model``, the facts named in the note); without pp, ZeRO 1 runs as ZeRO 2 (FSDP2 reduce-scatters gradients each
    microbatch; with pp, torch's pipeline stages defer that to the last one, as ZeRO 1); its context parallelism all-gathers K/V (FlexAttention with ``flex_cp_allgather``;
    0.3.0 has no ring or all-to-all option); its float8 linears (torchao) scale from the current amax
    (rowwise; nestplan's closest recipe is tensorwise current scaling) and keep parameters in the
    training dtype."""
    pipelined = plan.dims.pp > 1
    model, changes = run_model(plan.model, pipelined), []
    if model != plan.model:
        changes.append(
            f"torchtitan 0.3.0 builds {plan.model.name} as its {architecture(plan.model)} model, which cannot "
            f"express: {'; '.join(differences(plan.model, pipelined))}"
        )
    dims, sharding = _run_sharding(plan)
    job, moe = _run_moe(plan.job)
    changes += sharding + moe
    if dims.cp > 1 and job.settings.cp_comm_type not in CP_EXCHANGES:
        changes.append(
            f"torchtitan 0.3.0's context parallelism all-gathers K/V (FlexAttention); it has no "
            f"{job.settings.cp_comm_type.value} exchange, which nestplan costed"
        )
        job = job.with_settings(cp_comm_type=CP_EXCHANGES[0], cp_a2a_size=1)
    job, precision = _run_precision(job)
    return model, dims, job, changes + precision


def _run_sharding(plan: Plan) -> tuple[ParallelDims, list[str]]:
    """The degrees FSDP2 runs (``_run_job``): ZeRO 1 without pp as ZeRO 2, experts without tensor parallelism."""
    dims, changes = plan.dims, []
    if dims.zero == 1 and dims.pp == 1:
        changes.append(
            "torchtitan's FSDP2 has no optimizer-only sharding: ZeRO 1 runs as FSDP without resharding "
            "after forward, i.e. ZeRO 2 (gradients reduce-scattered every microbatch)"
        )
        dims = replace(dims, zero=2)
    if plan.model.is_moe and dims.expert_tp > 1 and dims.sp_active and dims.ep * dims.tp > 1:
        changes.append(
            f"torchtitan 0.3.0's experts have no tensor parallelism: it runs them whole over ep x tp = "
            f"{dims.ep * dims.tp} ranks (etp 1), where nestplan costed them split {dims.expert_tp} ways"
        )
        dims = replace(dims, etp=1)
    return dims, changes


def _run_moe(job: Job) -> tuple[Job, list[str]]:
    """The MoE settings torchtitan 0.3.0 runs (``_run_job``): all-to-alls, dropless experts, no overlap."""
    changes = []
    if job.settings.moe_dispatcher is not MoeDispatcher.ALLTOALL:
        changes.append(
            f"torchtitan 0.3.0 dispatches every token copy with all-to-alls, not the {job.settings.moe_dispatcher.value} "
            "dispatcher nestplan costed"
        )
        job = job.with_settings(moe_dispatcher=MoeDispatcher.ALLTOALL)
    if job.settings.moe_capacity_factor is not None:
        changes.append(
            f"torchtitan 0.3.0's experts are dropless: they process the routed tokens as routed, not "
            f"padded to the capacity factor {job.settings.moe_capacity_factor} nestplan costed"
        )
        job = job.with_settings(moe_capacity_factor=None)
    if job.settings.moe_comm_overlap:
        changes.append(
            "torchtitan 0.3.0 runs each microbatch's expert all-to-alls exposed: it has no "
            "cross-microbatch overlap, which nestplan costed"
        )
        job = job.with_settings(moe_comm_overlap=False)
    return job, changes


def _run_precision(job: Job) -> tuple[Job, list[str]]:
    """The precision torchtitan runs (``_run_job``): rowwise float8 linears, float32 parameters and moments."""
    changes = []
    if job.fp8 and job.settings.fp8_recipe is not Fp8Recipe.TENSORWISE:
        changes.append(
            f"torchtitan's float8 linears (torchao, rowwise current scaling) replace the "
            f"{job.settings.fp8_recipe.value} scaling nestplan costed (costed here as tensorwise)"
        )
        job = job.with_settings(fp8_recipe=Fp8Recipe.TENSORWISE)
    if job.settings.fp8_params:
        changes.append("torchtitan keeps parameters in float32 with bfloat16 compute, not in FP8 as nestplan costed")
        job = job.with_settings(fp8_params=False)
    if job.settings.optimizer_state is not OptimizerState.FP32:
        changes.append(
            f"torchtitan's Adam keeps float32 moments beside float32 parameters, not the "
            f"{job.settings.optimizer_state.value} optimizer state nestplan costed"
        )
        job = job.with_settings(optimizer_state=OptimizerState.FP32)
    return job, changes


def _run_note(plan: Plan) -> list[str]:
    """A note quoting nestplan's prediction for what torchtitan runs, where it differs from what was costed."""
    model, dims, job, changes = _run_job(plan)
    if not changes:
        return []
    other = evaluate_plan(model, plan.cluster, dims, job, plan.axis_order)
    return [
        f"{'; '.join(changes)}: for what torchtitan runs nestplan predicts step {other.step_time_s:.3f} s "
        f"({other.tokens_per_s:,.0f} tokens/s) instead of {plan.predicted.step_time_s:.3f} s"
    ]


def _compile(plan: Plan) -> tuple[Flags, list[str]]:
    """torch.compile and async tensor parallelism, on only where nestplan costed tp collectives under
    their GEMMs (torchtitan's async TP needs torch.compile)."""
    if plan.job.settings.tp_comm_overlap and plan.dims.tp > 1:
        return [("--compile.enable", None), ("--compile.enable-async-tensor-parallel", None)], [
            "nestplan costed tp collectives overlapped with their GEMMs: torchtitan runs async tensor parallelism, "
            "which needs torch.compile; compile also fuses elementwise kernels nestplan costs unfused"
        ]
    return [("--compile.no-enable", None), ("--compile.no-enable-async-tensor-parallel", None)], []


def _experts(inp: ExportInput) -> tuple[int, list[str]]:
    """torchtitan's expert-parallel degree: its experts have no tensor parallelism (EP borrows the
    tp ranks instead), so nestplan's experts split ep x tp ways become ep x tp whole-expert shards
    (the same expert weights and FLOPs per device)."""
    d, m = inp.plan.dims, inp.model
    if d.ep == 1 and d.etp is None:
        return 1, []
    degree = d.ep * d.tp
    if m.num_experts % degree:
        raise refuse(
            TITLE,
            f"torchtitan has no expert tensor parallelism; ep {d.ep} x tp {d.tp} = {degree} does not "
            f"divide the {m.num_experts} experts",
            "ep",
            d.ep,
            m.num_experts,
        )
    notes = (
        []
        if d.expert_tp == 1
        else [
            f"torchtitan has no expert tensor parallelism: expert-parallel degree {degree} (ep {d.ep} x tp {d.tp}) "
            f"holds the same expert weights per device as nestplan's {d.expert_tp}-way tensor-parallel experts"
        ]
    )
    group = expert_group_note(TITLE, inp, 1, degree, etp=1)  # torchtitan's ep is the fastest mesh axis
    return degree, notes + ([group] if group else [])


def node_order(inp: ExportInput) -> tuple[int, ...] | None:
    """Where torchtitan's fixed mesh order (tp-cp-ep-dp-pp fastest first) differs from the costed one but
    renumbering the nodes lands every torchtitan rank on the device nestplan costed for its mesh
    coordinates (export.rank_order): the torchrun node rank of each node, in network order. None where
    the orders agree or no node order does it."""
    p = inp.plan
    if rank_order.same_layout(p, STAGE_MAJOR):
        return None
    return rank_order.node_ranks(p, STAGE_MAJOR, inp.devices_per_node)


def _node_order_lines(order: tuple[int, ...]) -> str:
    """Shell lines, before the torchrun prologue, that give node k (network order) torchrun node rank
    NODE_ORDER[k] (node 0 keeps rank 0, so the rendezvous stays on the allocation's first node)."""
    return (
        "# torchtitan's mesh order is fixed: node k (network order: SLURM_NODEID, or NODE_INDEX by hand) runs "
        "torchrun\n# node rank NODE_ORDER[k] so that its ranks land on the devices nestplan costed\n"
        f"NODE_ORDER=({' '.join(str(int(n)) for n in order)})\n"
        'NODE_RANK="${NODE_RANK:-${NODE_ORDER[${NODE_INDEX:-${SLURM_NODEID:-0}}]}}"\n'
    )


def all_flags(inp: ExportInput) -> tuple[Flags, str, list[str]]:
    """Every torchtitan flag of the export, the checkpoint subcommand, and the notes."""
    p, d, job = inp.plan, inp.plan.dims, inp.plan.job
    if d.schedule not in COSTED_SCHEDULES:  # ZB-H1: its closest is 1F1B
        raise schedule_refusal(TITLE, NAME, p, replace(d, schedule=Schedule.ONE_F_ONE_B), COSTED_SCHEDULES)
    if job.dtype not in DTYPES:
        raise refuse(TITLE, "torchtitan 0.3.0 computes in bfloat16 or float32", "job.dtype", job.dtype, list(DTYPES))
    remap = node_order(inp)
    notes = (
        [n for n in [rank_order_note(TITLE, inp, STAGE_MAJOR)] if n]
        if remap is None
        else [
            f"torchtitan orders ranks {'-'.join(STAGE_MAJOR)} (fastest first); the launch script renumbers the nodes "
            f"(NODE_ORDER) so that they land on the devices nestplan costed under {'-'.join(p.axis_order)}"
        ]
    )
    ep, ep_notes = _experts(inp)
    flags: Flags = [
        ("--parallelism.tensor-parallel-degree", d.tp),
        (
            "--parallelism.enable-sequence-parallel" if d.sp_active else "--parallelism.no-enable-sequence-parallel",
            None,
        ),
        ("--parallelism.context-parallel-degree", d.cp),
        ("--parallelism.expert-parallel-degree", ep),
    ]
    dp, dp_notes = _data_parallel(p)
    pipe, pipe_notes = _pipeline(p)
    compiled, compile_notes = _compile(p)
    # with pp the local batch is one pipeline flush of num_microbatches; without, one microbatch per
    # gradient-accumulation step (torchtitan: accumulation = global / (local x dp_replicate x dp_shard))
    local = job.global_batch_size // d.batch_replicas if d.pp > 1 else d.micro_batch_size
    # nestplan costs no CUDA graph capture; torchtitan 0.3.0 captures by default and refuses it with pp > 1
    # (Trainer.Config._validate_cuda_graphs) and with its default expert dispatcher
    flags += (
        dp
        + pipe
        + [
            ("--training.global-batch-size", job.global_batch_size),
            ("--training.local-batch-size", local),
            ("--training.seq-len", job.seq_len),
            ("--training.mixed-precision-param", DTYPES[job.dtype]),
            ("--training.disable-cuda-graphs", None),
        ]
        + compiled
    )
    ckpt, ckpt_notes = _checkpoint(p)
    if catalog_architecture(inp.model, MODEL_CONFIGS) is None:
        notes.append(
            f"torchtitan ships no tokenizer for {inp.model.name}: give --hf-assets-path the folder of its "
            f"Hugging Face tokenizer ({inp.model.vocab_size} tokens); the config's default is Llama 3.1's"
        )
    notes += [*ep_notes, *dp_notes, *pipe_notes, *ckpt_notes, *compile_notes, *job_notes(p), *model_notes(p)]
    return flags, ckpt, notes + _run_note(p)


def check_model(m: ModelSpec) -> None:
    """A model torchtitan 0.3.0 has nothing close to (``torchtitan_arch.run_model``): refused."""
    run_model(m)


def model_notes(plan: Plan) -> list[str]:
    """The stated facts torchtitan builds otherwise where the model nestplan costs stays the same (YaRN's
    temperature): the ones that change it are in the prediction's note (``_run_note``)."""
    pipelined = plan.dims.pp > 1
    if run_model(plan.model, pipelined) != plan.model:
        return []
    named = differences(plan.model, pipelined)
    return (
        [f"torchtitan 0.3.0 builds {plan.model.name} as its {architecture(plan.model)} model: {'; '.join(named)}"]
        if named
        else []
    )


def export(inp: ExportInput) -> Export:
    flags, ckpt, notes = all_flags(inp)
    remap = node_order(inp)
    module = config_module(inp, run_model(inp.model, inp.plan.dims.pp > 1), ("--compile.enable", None) in flags)
    notes = [*notes, *stack_notes(inp.plan, Framework.TORCHTITAN)]
    text = (
        "#!/usr/bin/env bash\n"
        + sbatch_lines(inp)
        + header(inp, TITLE, PIN, notes)
        + "set -euo pipefail\n"
        + (_node_order_lines(remap) if remap else "")
        + torchrun_prologue(inp, 29500)
        + f"# {CONFIG_MODULE}.py (next to this script) holds the model config; sbatch runs a copy of this\n"
        "# script, so set NESTPLAN_EXPORT_DIR to the export folder there\n"
        'EXPORT_DIR="${NESTPLAN_EXPORT_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"\n'
        'export PYTHONPATH="$EXPORT_DIR${PYTHONPATH:+:$PYTHONPATH}"\n\n'
        + bash_array("PARALLEL_ARGS", flag_pairs(flags), "parallelism and batch, as nestplan costed them")
        + f'\n"${{TORCHRUN[@]}}" -m torchtitan.train --module {CONFIG_MODULE} --config {CONFIG_FUNCTION} \\\n'
        + f'    "${{PARALLEL_ARGS[@]}}" "$@" {ckpt}\n'
    )
    return Export(
        NAME,
        (ExportFile("launch_torchtitan.sh", text, executable=True), ExportFile(f"{CONFIG_MODULE}.py", module)),
        tuple(notes),
    )
