"""Megatron-LM: a launch script with the plan's exact flags, its environment and a torchrun/SLURM header.

Flag names are those of ``megatron/training/arguments.py`` at the commit named in
``megatron_flags.txt`` (a test checks every emitted flag against that table), and
tests/unit/test_real_megatron.py runs megatron-core 0.19.2's own ``parse_args``/``validate_args``,
TransformerConfig, layer split and RankGenerator on the exported command line.
Megatron-LM lays ranks out tp-cp-ep-dp-pp (fastest first) or, with
``--use-tp-pp-dp-mapping``, tp-cp-ep-pp-dp: the two orders nestplan's search explores.
Expert parallelism is carved out of data parallelism in both, as in nestplan. Where neither
flag gives the costed order, the script starts each node with the torchrun node rank that
puts Megatron's ranks on the costed devices (``node_ranks.txt``, export.rank_order), where one exists.
A Mamba-2 hybrid stack (Nemotron-H) runs Megatron-LM's pretrain_hybrid.py, its blocks and the costed
pipeline split given by the layer pattern (``hybrid_pattern``); everything else is as for a GPT.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from nestplan.cost.evaluator import evaluate_plan
from nestplan.cost.schedules import named as named_schedule
from nestplan.export import rank_order
from nestplan.export.common import (
    REPLICA_MAJOR,
    STAGE_MAJOR,
    Export,
    ExportFile,
    bash_array,
    choose_order,
    expert_group_note,
    flag_pairs,
    header,
    rank_order_note,
    refuse,
    sbatch_lines,
    torchrun_prologue,
)
from nestplan.export.plan import ExportInput
from nestplan.job import Job
from nestplan.model.spec import ModelSpec
from nestplan.model.ssm import Mamba1Shape
from nestplan.plan import Plan
from nestplan.settings import CpCommType, MoeDispatcher, OptimizerState
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, Schedule

NAME = "megatron"
TITLE = "Megatron-LM"
PIN = (
    "flags of NVIDIA/Megatron-LM megatron/training/arguments.py at commit 000c4ac2; accepted by "
    "megatron-core 0.19.2's parse_args and validate_args"
)
ORDERS = {STAGE_MAJOR: (), REPLICA_MAJOR: (("--use-tp-pp-dp-mapping", None),)}
OPTIMIZERS = ("adam", "sgd")  # --optimizer's choices that nestplan costs (nestplan.job.Optimizer)
Flags = list[tuple[str, object]]


def orders(plan: Plan) -> list[tuple[str, ...]]:
    """The rank orders Megatron-core can run for this plan. Its expert layers use their own grid
    (etp-ep-edp-pp) under the same order, and outside a pp-last order with pp > 1 it requires the
    expert and dense data-parallel sizes equal (cp x dp = dp x ep here), so tp-cp-ep-pp-dp needs
    ep = cp when ep > 1 (megatron/core/parallel_state.py, initialize_model_parallel)."""
    d = plan.dims
    if d.ep > 1 and d.pp > 1 and d.cp != d.ep:
        return [STAGE_MAJOR]
    return list(ORDERS)


# The schedules Megatron-LM runs as nestplan costs them (megatron/core/pipeline_parallel/schedules.py): 1F1B
# and interleaved 1F1B, no zero-bubble or DualPipe schedule. One it lacks runs as 1F1B with the plan's
# chunks per stage (cost/schedules ``named``): GPipe and ZB-H1 as 1F1B on the same stages, the V-shaped ones
# (two chunks per stage) as interleaved 1F1B with two chunks per stage, placed round-robin.
COSTED_SCHEDULES = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)
CP_EXCHANGES = tuple(CpCommType)  # --cp-comm-type takes every exchange
EXPERT_TP = None  # --expert-tensor-parallel-size takes any divisor of tp (parallel folding): no restriction


def moe_comm_overlap(m: ModelSpec) -> bool:
    """Whether Megatron-LM runs ``m``'s expert all-to-alls under another microbatch's compute
    (--overlap-moe-expert-parallel-comm, Megatron-Core's combined 1F1B schedule): a GPTModel's, not a
    HybridModel's (it has no build_schedule_plan, which that schedule asks of the model)."""
    return not m.is_hybrid


def run_dims(plan: Plan) -> ParallelDims:
    """The plan as Megatron-core runs it: its own schedule where it lacks the costed one, each stage
    keeping its costed layers (a V schedule's stage s holds virtual stages s and 2 pp - 1 - s; under
    interleaving its two chunks are virtual stages s and pp + s, each half the stage's layers)."""
    d = plan.dims
    if d.schedule in COSTED_SCHEDULES:
        return d
    split = d.stage_layers(plan.model.num_layers) if d.layers_per_stage is not None else None
    return replace(d, schedule=named_schedule(Schedule.ONE_F_ONE_B, d.virtual_stages), layers_per_stage=split)


def schedule_note(plan: Plan) -> str | None:
    """The schedule Megatron-core runs where it lacks the costed one, with nestplan's prediction for it."""
    d, run = plan.dims, run_dims(plan)
    if run == d:
        return None
    other = evaluate_plan(plan.model, plan.cluster, run, plan.job, plan.axis_order)
    chunks = " (two chunks per stage, round-robin: the head on the last stage)" if run.virtual_stages > 1 else ""
    return (
        f"Megatron-core has no {d.schedule.value} schedule; it runs {run.schedule.value}{chunks}, the stages "
        f"keeping their layers: under it nestplan predicts step {other.step_time_s:.3f} s "
        f"({other.tokens_per_s:,.0f} tokens/s) instead of {plan.predicted.step_time_s:.3f} s"
    )


def _pipeline_split(plan: Plan) -> Flags:
    """Virtual stages and uneven splits: first/last counts when the middle is even, else a layout; none
    for a hybrid stack, whose layer pattern carries its split (``hybrid_pattern``: Megatron-core's
    validate_args refuses the layout, virtual stages and, with pipes, first/last counts beside it)."""
    if plan.model.is_hybrid:
        return []
    run = run_dims(plan)
    n, v = run.layers_per_stage or (), run.virtual_stages
    if len(set(n)) == 1:
        return [("--num-virtual-stages-per-pipeline-rank", v)] if v > 1 else []
    middle = n[1:-1]
    if v == 1 and len(set(middle)) <= 1:
        return [("--decoder-first-pipeline-num-layers", n[0]), ("--decoder-last-pipeline-num-layers", n[-1])]
    return [("--pipeline-model-parallel-layout", layout(plan))]


def layout(plan: Plan) -> str:
    """Megatron's --pipeline-model-parallel-layout: pp x v segments in model order (segment v*pp + k is
    virtual chunk v of pipeline rank k, as Megatron's interleaved schedule places them), E = embedding
    on the first, L = loss (head) on the last with the model's MTP modules (m) before it, t*n = n
    transformer layers (none: the segment is E or L alone); three or more equal segments in a row as Megatron's (segment|)*k
    (megatron/core/transformer/pipeline_parallel_layer_layout.py, parse_str_to_list). The split is
    the one Megatron-core runs (``run_dims``)."""
    counts = run_dims(plan).virtual_stage_layers(plan.model.num_layers)
    segments = [f"t*{n}" if n else "" for n in counts]
    segments[0] = "E" + segments[0]
    segments[-1] = segments[-1] + "m" * plan.model.mtp_layers + "L"
    runs: list[list] = []
    for segment in segments:
        if runs and runs[-1][0] == segment:
            runs[-1][1] += 1
        else:
            runs.append([segment, 1])
    text = ""
    for i, (segment, count) in enumerate(runs):
        repeated = count - 1 if i == len(runs) - 1 else count  # the last segment has no '|' after it
        text += f"({segment}|)*{repeated}" if repeated >= 3 else f"{segment}|" * repeated
    return text + runs[-1][0]


def _overlaps(plan: Plan, gather: bool) -> Flags:
    """The step end's overlaps as costed (the parameter all-gather only where parameters are sharded)."""
    job = plan.job
    flags: Flags = [("--overlap-grad-reduce", None)] if job.settings.overlap_grad_reduce else []
    return flags + ([("--overlap-param-gather", None)] if gather and job.settings.overlap_param_gather else [])


def _zero(plan: Plan) -> tuple[Flags, list[str]]:
    """ZeRO 1: the distributed optimizer; ZeRO 2/3: Megatron-FSDP's sharding strategies."""
    zero = int(plan.dims.zero)
    if zero == 0:
        return _overlaps(plan, gather=False), []
    if zero == 1:
        return [("--use-distributed-optimizer", None)] + _overlaps(plan, gather=True), []
    strategy = "optim_grads" if zero == 2 else "optim_grads_params"
    note = (
        f"ZeRO {zero} runs as Megatron-FSDP (--data-parallel-sharding-strategy {strategy}), which needs "
        "--ckpt-format fsdp_dtensor and CUDA_DEVICE_MAX_CONNECTIONS other than 1"
    )
    return [
        ("--use-megatron-fsdp", None),
        ("--data-parallel-sharding-strategy", strategy),
        ("--ckpt-format", "fsdp_dtensor"),
    ] + _overlaps(plan, gather=True), [note]


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


def _recompute(plan: Plan) -> Flags:
    if plan.dims.recompute is Recompute.FULL:  # every layer's input kept, the layer re-run in backward
        return [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    if plan.dims.recompute is Recompute.SELECTIVE:  # the attention core only (Korthikanti et al. 2022)
        return [("--recompute-granularity", "selective"), ("--recompute-modules", "core_attn")]
    return []


def rank_layout(
    inp: ExportInput, title: str, mapping: str, node_order: bool = False
) -> tuple[tuple[str, ...], list[str]]:
    """The rank order Megatron-core runs this plan with and its layout notes (rank order, the
    tp-pp-dp mapping's ep = cp condition, the expert grid), for Megatron-LM and NeMo alike;
    ``mapping`` names the framework's switch for the tp-pp-dp order; ``node_order``: the launch script
    reorders the nodes so that the order's groups are the costed ones (no rank-order note then)."""
    allowed = orders(inp.plan)
    order = choose_order(inp.plan, allowed)
    d = inp.plan.dims
    notes = [] if node_order else [n for n in [rank_order_note(title, inp, order)] if n]
    if notes and len(allowed) < len(ORDERS):
        notes[0] += f"; Megatron-core's {mapping} needs ep = cp with experts and pp > 1 (here ep {d.ep}, cp {d.cp})"
    if d.expert_parallel > 1:
        notes += [n for n in [expert_note(inp)] if n]
    return order, notes


def node_order(inp: ExportInput) -> str | None:
    """node_ranks.txt where Megatron-LM's rank order differs from the costed one and a node order
    makes its groups the costed ones (export.rank_order); None otherwise."""
    order = choose_order(inp.plan, orders(inp.plan))
    return rank_order.node_rank_file(inp.plan, TITLE, order, inp.devices_per_node)


def rank_placement(inp: ExportInput) -> str | None:
    """rank_nodes.txt where Megatron-LM's rank order differs from the costed one and no node order
    helps: SLURM then places every rank on the node it was costed on; None otherwise."""
    if node_order(inp) is not None:
        return None
    order = choose_order(inp.plan, orders(inp.plan))
    return rank_order.rank_node_file(inp.plan, TITLE, order, inp.devices_per_node)


def _placement_note(plan: Plan, file_name: str) -> str:
    """What the node order or the per-rank placement does, where Megatron-LM's order is not the costed one."""
    order = "-".join(choose_order(plan, orders(plan)))
    if file_name == rank_order.FILE_NAME:
        return (
            f"Megatron-LM numbers ranks {order}, not the costed {'-'.join(plan.axis_order)}: {file_name} gives "
            "each node the torchrun node rank that puts its ranks on the devices nestplan costed them on "
            "(the groups are the costed ones)"
        )
    return (
        f"no node order maps Megatron-LM's {order} onto the costed {'-'.join(plan.axis_order)}: under sbatch the "
        f"script starts every rank as its own task on the node {file_name} names (SLURM_HOSTFILE, srun "
        "--distribution=arbitrary), so each group spans the nodes nestplan costed; run any other way, torchrun "
        "keeps Megatron-LM's order, as the rank-layout note says"
    )


def _node_order_lines() -> str:
    """Shell lines that set torchrun's node rank from node_ranks.txt and this node's place in the allocation."""
    return (
        f"# node order ({rank_order.FILE_NAME}): each node starts the torchrun node rank that puts its ranks\n"
        "# on the devices nestplan costed them on. NODE_INDEX: this node's place in network order\n"
        'NODE_INDEX="${NODE_INDEX:-${SLURM_NODEID:-0}}"\n'
        f'mapfile -t NODE_RANKS < <(grep -v "^#" "$(dirname "${{BASH_SOURCE[0]}}")/{rank_order.FILE_NAME}")\n'
        'if [[ ! "$NODE_INDEX" =~ ^[0-9]+$ ]] || (( NODE_INDEX >= ${#NODE_RANKS[@]} )); then\n'
        f'  echo "NODE_INDEX $NODE_INDEX is not a node of {rank_order.FILE_NAME}" >&2\n'
        "  exit 2\n"
        "fi\n"
        'NODE_RANK="${NODE_RANKS[NODE_INDEX]}"\n'
    )


def _rank_placement_lines(devices_per_node: int) -> str:
    """Shell lines that, under sbatch, start every rank as its own SLURM task on the node
    rank_nodes.txt names (SLURM_HOSTFILE read by srun --distribution=arbitrary); elsewhere the script
    goes on to torchrun, node by node, in Megatron-LM's own order."""
    name = rank_order.RANK_FILE_NAME
    return (
        f"# rank placement ({name}): under sbatch, rank r runs as SLURM task r on the node line r names;\n"
        "# run any other way, torchrun starts the ranks node by node in Megatron-LM's own order (see the notes)\n"
        'if [[ -n "${SLURM_JOB_ID:-}" && -z "${SLURM_STEP_ID:-}" ]]; then\n'
        '  mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")\n'
        f'  mapfile -t RANK_NODE < <(grep -v "^#" "$(dirname "${{BASH_SOURCE[0]}}")/{name}")\n'
        '  SLURM_HOSTFILE="$(mktemp)"\n'
        '  for node in "${RANK_NODE[@]}"; do printf "%s\\n" "${HOSTS[node]}"; done > "$SLURM_HOSTFILE"\n'
        "  export SLURM_HOSTFILE NESTPLAN_RANK_TASKS=1\n"
        f'  exec srun --ntasks="${{#RANK_NODE[@]}}" --distribution=arbitrary --gpus-per-node={devices_per_node} '
        'bash "$0" "$@"\n'
        "fi\n"
    )


def _one_process_per_task() -> str:
    """After the torchrun prologue: in a task of that srun, SLURM started the rank, which runs Megatron-LM itself."""
    return (
        'if [[ -n "${NESTPLAN_RANK_TASKS:-}" ]]; then\n'
        '  export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS" MASTER_ADDR MASTER_PORT\n'
        "  TORCHRUN=(python3)   # one process per SLURM task\n"
        "fi\n"
    )


def _cp_flags(job: Job, cp: int) -> Flags:
    """The context-parallel exchange nestplan costs (job.CpCommType), by Megatron-LM's own names;
    the hierarchical kind names its all-to-all and ring sizes, innermost first."""
    flags: Flags = [("--cp-comm-type", job.settings.cp_comm_type.value)]
    if job.settings.cp_comm_type is CpCommType.A2A_P2P:
        flags.append(
            ("--hierarchical-context-parallel-sizes", (job.settings.cp_a2a_size, cp // job.settings.cp_a2a_size))
        )
    return flags


def parallel_flags(inp: ExportInput) -> tuple[Flags, list[str]]:
    d = inp.plan.dims
    order, notes = rank_layout(inp, TITLE, "--use-tp-pp-dp-mapping", node_order=node_order(inp) is not None)
    flags: Flags = [
        ("--tensor-model-parallel-size", d.tp),
        ("--pipeline-model-parallel-size", d.pp),
        ("--context-parallel-size", d.cp),
    ]
    flags += list(ORDERS[order])
    if d.sp_active:
        flags.append(("--sequence-parallel", None))
    if d.cp > 1:
        flags += _cp_flags(inp.plan.job, d.cp)
    if d.expert_parallel > 1 or d.etp is not None:  # Megatron's expert grid: etp x expert_parallel x edp x pp
        flags += [("--expert-model-parallel-size", d.expert_parallel), ("--expert-tensor-parallel-size", d.expert_tp)]
    # Megatron-Core's 1F1B A2A overlap, as costed (cost/comm.py expert_all_to_alls); none in a HybridModel (hybrid_notes)
    if inp.plan.job.settings.moe_comm_overlap and not inp.model.is_hybrid:
        flags.append(("--overlap-moe-expert-parallel-comm", None))
    if inp.plan.job.settings.moe_capacity_factor is not None:  # each expert padded to its capacity, as costed
        flags += [
            ("--moe-expert-capacity-factor", inp.plan.job.settings.moe_capacity_factor),
            ("--moe-pad-expert-input-to-capacity", None),
        ]
    zero, zero_notes = _zero(inp.plan)
    notes += [n for n in [schedule_note(inp.plan)] if n]
    return flags + _pipeline_split(inp.plan) + zero + _recompute(inp.plan), notes + zero_notes


def expert_note(inp: ExportInput) -> str | None:
    """Megatron-core lays expert layers out on their own grid, etp-ep-edp-pp (cp folded into ep and
    edp): its expert-parallel groups are ep x tp / etp ranks etp apart."""
    return expert_group_note("Megatron-core", inp, inp.plan.dims.expert_tp, inp.plan.dims.expert_parallel)


def hybrid_stack(m: ModelSpec) -> str | None:
    """What makes ``m`` a hybrid stack rather than a GPT (Nemotron-H, Jamba): its Mamba layers by index
    (and its blocks without a mixer or an FFN), or None for a transformer."""
    if not m.is_hybrid:
        return None
    kind = "Mamba-1" if isinstance(m.mamba, Mamba1Shape) else "Mamba-2"
    parts = [f"{kind} mixers in layers {','.join(map(str, m.mamba_layers))}"] if m.mamba_layers else []
    if m.mixerless_layers:
        parts.append(f"no mixer in layers {','.join(map(str, m.mixerless_layers))}")
    if m.ffn_free_layers:
        parts.append(f"no FFN in layers {','.join(map(str, m.ffn_free_layers))}")
    return "a hybrid stack (" + "; ".join(parts) + ")"


def unbuildable(m: ModelSpec) -> str | None:
    """The first architecture feature of ``m`` that Megatron-core's GPT layers cannot build (it has
    neither a parallel attention + MLP block nor chunked attention: megatron/core/transformer; a hybrid
    stack is no GPT: Megatron-core builds Mamba-2 hybrids as a HybridModel, which this export runs with
    Megatron-LM's pretrain_hybrid.py, and has no Mamba-1 mixer), or None."""
    hybrid = hybrid_stack(m)
    if hybrid:
        if isinstance(m.mamba, Mamba1Shape):
            return f"Mamba-1 mixers (none in Megatron-core) in {hybrid}"
        return f"{hybrid} in a GPT (Megatron-core builds it as a HybridModel: nestplan --export megatron)"
    return _block_unbuildable(m)


def _block_unbuildable(m: ModelSpec) -> str | None:
    """A block form no Megatron-core layer has: attention and MLP in parallel, chunked attention."""
    if m.parallel_block:
        return "attention and MLP in parallel on the block input (Falcon's parallel_attn)"
    if m.chunked_attention_layers:
        return "chunked local attention (Llama 4's attention_chunk_size)"
    return None


# Megatron-core's hybrid layer symbols (megatron/core/models/hybrid/hybrid_layer_allocation.py, Symbols):
# one layer each, a pre-norm and its one module; '|' ends a pipeline segment
MAMBA, ATTENTION, MLP, MOE, PIPE = "M", "*", "-", "E", "|"
# what Megatron-LM's hybrid entry point builds its layers from (its examples/mamba/train.sh passes it;
# hybrid_builders.py raises without --spec)
HYBRID_SPEC = ("megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec")
HYBRID_SCRIPT = "pretrain_hybrid.py"
# Megatron-core's MambaMixer fixes its conv width and SSD chunk length and asserts a conv bias: no argument
# sets them (megatron/core/ssm/mamba_mixer.py, MambaMixer.__init__: d_conv=4, chunk_size=128, conv_bias)
MIXER_CONV_KERNEL = 4
MIXER_CHUNK_SIZE = 128
FP8_IN_PROJ_MULTIPLE = 16  # MambaMixer.__init__ asserts 2 d + 2 G N + H a multiple of 16 under FP8
HYBRID_NOTE = (
    "pretrain_hybrid.py and pipe-separated --hybrid-layer-pattern are Megatron-LM's since 2026-04 "
    "(commit 60408d5f, megatron-core 0.19); older Megatron-LM, such as the flag table's pin, trains "
    "hybrids with pretrain_mamba.py and --hybrid-override-pattern, on even pipeline stages only"
)


def hybrid_symbol(m: ModelSpec, index: int) -> str | None:
    """The Megatron-core layer symbol of block ``index``: a Mamba or attention mixer alone, or an FFN
    alone (MoE in ``moe_layers``, else an MLP); None for a block Megatron-core builds as no single layer."""
    mixer, ffn = m.mixer_of(index), m.has_ffn(index)
    if not ffn:
        return {"mamba": MAMBA, "attention": ATTENTION}.get(mixer)
    if mixer == "none":
        return MOE if m.is_moe_layer(index) else MLP
    return None


def hybrid_unbuildable(m: ModelSpec) -> str | None:
    """The first feature of the hybrid stack ``m`` that Megatron-core's HybridModel cannot build as
    nestplan costed it, or None: a Mamba-1 mixer (none in Megatron-core), a block of a mixer and an FFN
    or of neither (no layer symbol), MTP modules (nestplan costs each as a block like the last;
    Megatron's hybrid MTP is a pattern of its own), latent attention, a conv width or conv bias its
    MambaMixer does not have, and the block forms no Megatron-core layer has."""
    if isinstance(m.mamba, Mamba1Shape):
        return unbuildable(m)
    odd = [i for i in range(m.num_layers) if hybrid_symbol(m, i) is None]
    shape = m.mamba
    problems = [
        (
            bool(odd),
            f"blocks that are not one Megatron-core hybrid layer (a mixer and an FFN, or neither) "
            f"in layers {','.join(map(str, odd))}",
        ),
        (m.mtp_layers > 0, f"{m.mtp_layers} MTP modules in a hybrid stack"),
        (m.is_mla, "multi-head latent attention in a hybrid stack (Megatron-core's '+' layers, not exported)"),
        (
            shape is not None and shape.conv_kernel != MIXER_CONV_KERNEL,
            f"a Mamba conv1d of width {shape and shape.conv_kernel} (Megatron-core's MambaMixer: {MIXER_CONV_KERNEL})",
        ),
        (
            shape is not None and not shape.conv_bias,
            "a Mamba conv1d without bias (Megatron-core's MambaMixer asserts one)",
        ),
    ]
    return next((what for bad, what in problems if bad), None) or _block_unbuildable(m)


def check_model(m: ModelSpec) -> None:
    """A model Megatron-core cannot build (``unbuildable`` for a GPT, ``hybrid_unbuildable`` for a
    hybrid stack): refused."""
    missing = hybrid_unbuildable(m) if m.is_hybrid else unbuildable(m)
    if missing:
        raise refuse(TITLE, f"Megatron-core cannot build {missing} of {m.name}", "model", m.name)


def hybrid_layers(m: ModelSpec) -> str:
    """The hybrid stack's blocks as Megatron-core's layer symbols, in model order (``hybrid_symbol``)."""
    return "".join(str(hybrid_symbol(m, i)) for i in range(m.num_layers))


def hybrid_pattern(plan: Plan) -> str:
    """Megatron-core's --hybrid-layer-pattern for the plan: one symbol per block (``hybrid_symbol``),
    and with pp > 1 the costed split as pipe-separated segments, one per virtual stage in model order
    (segment v pp + k is chunk v of pipeline rank k, as Megatron-core's select_pipeline_segment reads
    it; validate_args then derives the virtual pipeline size from their number). The split is the
    one Megatron-core runs (``run_dims``)."""
    m = plan.model
    symbols = hybrid_layers(m)
    if plan.dims.pp == 1:
        return symbols
    segments, start = [], 0
    for count in run_dims(plan).virtual_stage_layers(m.num_layers):
        segments.append(symbols[start : start + count])
        start += count
    return PIPE.join(segments)


def hybrid_flags(plan: Plan) -> Flags:
    """The hybrid stack: its layer pattern with the pipeline split, the layer specs, the Mamba-2 sizes
    (megatron/training/arguments.py in megatron-core 0.19.2; --mamba-num-heads given, so d = H P)."""
    flags: Flags = [("--hybrid-layer-pattern", hybrid_pattern(plan)), ("--spec", HYBRID_SPEC)]
    shape = plan.model.mamba
    if shape is not None and plan.job.settings.fp8_recipe is not None and shape.in_proj_width % FP8_IN_PROJ_MULTIPLE:
        raise refuse(
            TITLE,
            f"Megatron-core's MambaMixer runs FP8 only where in_proj's output width is a multiple "
            f"of {FP8_IN_PROJ_MULTIPLE}; {plan.model.name}'s is {shape.in_proj_width}",
            "fp8",
            plan.job.settings.fp8_recipe.value,
        )
    if shape is not None:
        flags += [
            ("--mamba-num-heads", shape.num_heads),
            ("--mamba-head-dim", shape.head_dim),
            ("--mamba-state-dim", shape.state_size),
            ("--mamba-num-groups", shape.groups),
        ]
    return flags


def hybrid_notes(plan: Plan) -> list[str]:
    """What the hybrid export needs of Megatron-LM, the SSD chunk length where it differs from the costed,
    and the MoE all-to-all overlap a HybridModel cannot run (it has no build_schedule_plan, which
    Megatron-core's combined 1F1B schedule asks of the model: megatron/core/models/gpt/gpt_model.py
    only), with nestplan's prediction without it."""
    shape, job = plan.model.mamba, plan.job
    notes = [HYBRID_NOTE]
    if shape is not None and shape.chunk_size != MIXER_CHUNK_SIZE:
        notes.append(
            f"Megatron-core's MambaMixer scans in chunks of {MIXER_CHUNK_SIZE} tokens; nestplan costed "
            f"{plan.model.name}'s {shape.chunk_size}"
        )
    if job.settings.moe_comm_overlap:
        other = evaluate_plan(
            plan.model, plan.cluster, plan.dims, job.with_settings(moe_comm_overlap=False), plan.axis_order
        )
        notes.append(
            f"Megatron-core overlaps MoE all-to-alls (--overlap-moe-expert-parallel-comm) in GPT models only: "
            f"the hybrid runs them exposed, for which nestplan predicts step {other.step_time_s:.3f} s "
            f"({other.tokens_per_s:,.0f} tokens/s) instead of {plan.predicted.step_time_s:.3f} s"
        )
    return notes


def model_flags(m: ModelSpec, plan: Plan) -> Flags:
    job = plan.job
    check_model(m)
    flags: Flags = [
        ("--num-layers", m.num_layers),
        ("--hidden-size", m.hidden_size),
        ("--ffn-hidden-size", m.ffn_hidden_size),
        ("--num-attention-heads", m.num_heads),
    ]
    if m.num_kv_heads != m.num_heads:
        flags += [("--group-query-attention", None), ("--num-query-groups", m.num_kv_heads)]
    if m.is_mla:
        flags += _mla_flags(m)
    elif m.head_dim * m.num_heads != m.hidden_size:
        flags.append(("--kv-channels", m.head_dim))
    flags += [
        ("--seq-length", job.seq_len),
        ("--max-position-embeddings", max(m.max_position_embeddings, job.seq_len)),
        ("--position-embedding-type", position_embedding_type(m)),
        ("--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"),
        ("--attention-backend", "flash" if job.settings.flash_attention else "unfused"),
    ]
    if m.gated_mlp:
        flags.append(("--swiglu", None))
    if m.family in ("nemotron", "nemotron_h"):  # squared-ReLU MLPs (HF NemotronConfig; NemotronH's relu2)
        flags.append(("--squared-relu", None))
    if m.family == "nemotron":  # LayerNorm with a zero-centred gamma (HF NemotronConfig)
        flags.append(("--apply-layernorm-1p", None))
    if position_embedding_type(m) == "rope" and m.rotary_fraction < 1 and not m.is_mla:
        flags.append(("--rotary-percent", m.rotary_fraction))
    if not m.linear_bias:
        flags.append(("--disable-bias-linear", None))
    flags += _attention_flags(m)
    if not m.tied_embeddings:
        flags.append(("--untie-embeddings-and-output-weights", None))
    if not m.dropout:
        flags += [("--attention-dropout", 0.0), ("--hidden-dropout", 0.0)]
    if m.is_moe:
        flags += _moe_flags(m, plan)
    if m.is_hybrid:
        flags += hybrid_flags(plan)
    return flags


def position_embedding_type(m: ModelSpec) -> str:
    """Megatron's --position-embedding-type: learned, none where no head has rotary positions
    (Nemotron-H's attention), else RoPE (on --rotary-percent of each head)."""
    if m.learned_position_embeddings:
        return "learned_absolute"
    return "none" if m.rotary_fraction == 0 else "rope"


@dataclass(frozen=True)
class AttentionOptions:
    """What Megatron-core's TransformerConfig sets for a model's attention beyond its shape:
    Q/K/V biases (``add_qkv_bias``), a per-head RMSNorm of queries and keys (``qk_layernorm``), a
    sliding window on every layer (``window_size`` = (w - 1, 0): a query sees itself and the w - 1
    keys before it, FlashAttention's convention), and notes for what it cannot build."""

    qkv_bias: bool
    qk_layernorm: bool
    window: tuple[int, int] | None
    notes: tuple[str, ...]


def attention_options(m: ModelSpec) -> AttentionOptions:
    notes = []
    if m.qk_norm == "full":
        notes.append(
            f"{m.name} normalises the whole query and key width (OLMo 2); Megatron-core's qk_layernorm "
            "normalises per head (the same FLOPs and memory to nestplan's precision, other weights)"
        )
    windowed = {m.window_of(i) for i in range(m.num_layers)}
    window = None
    if len(windowed) == 1 and None not in windowed:
        w = min(windowed.pop(), 2**30)
        window = (w - 1, 0)
    elif len(windowed) > 1:
        notes.append(
            f"{m.name} mixes sliding-window and full-attention layers; this export gives Megatron-core "
            "no window, so every layer attends to the whole sequence (slower than costed at long sequences)"
        )
    return AttentionOptions(m.qkv_bias and not m.linear_bias, m.qk_norm != "none", window, tuple(notes))


def _mla_flags(m: ModelSpec) -> Flags:
    """Multi-head latent attention (megatron/training/arguments.py _add_mla_args; MLATransformerConfig):
    qk_head_dim is the part of a query/key head without rotary positions."""
    flags: Flags = [("--multi-latent-attention", None)]
    if m.q_lora_rank:
        flags.append(("--q-lora-rank", m.q_lora_rank))
    return flags + [
        ("--kv-lora-rank", m.kv_lora_rank),
        ("--qk-head-dim", m.head_dim - m.qk_rope_head_dim),
        ("--qk-pos-emb-head-dim", m.qk_rope_head_dim),
        ("--v-head-dim", m.value_head_dim),
    ]


def _attention_flags(m: ModelSpec) -> Flags:
    opts = attention_options(m)
    flags: Flags = [("--add-qkv-bias", None)] if opts.qkv_bias else []
    if opts.qk_layernorm:
        flags.append(("--qk-layernorm", None))
    if m.qk_norm == "l2":  # Llama 4's weightless QK-norm (TransformerConfig.qk_l2_norm)
        flags.append(("--qk-l2-norm", None))
    if m.nope_layers:  # 1: a layer without rotary positions (arguments.py --no-rope-freq)
        flags.append(
            ("--no-rope-freq", f"[{','.join('1' if i in m.nope_layers else '0' for i in range(m.num_layers))}]")
        )
    if m.attention_sinks:  # a learned logit per head in the softmax (TransformerConfig.softmax_type)
        flags.append(("--softmax-type", "learnable"))
    if opts.window is not None:
        flags.append(("--window-size", f"{opts.window[0]},{opts.window[1]}"))
    return flags


def dispatcher(job: Job) -> str:
    """Megatron-Core's token dispatcher for the one nestplan costed: the flex dispatcher's backend
    defaults to DeepEP (TransformerConfig.moe_flex_dispatcher_backend)."""
    return "flex" if job.settings.moe_dispatcher is MoeDispatcher.DEEPEP else "alltoall"


def _moe_flags(m: ModelSpec, plan: Plan) -> Flags:
    flags: Flags = [
        ("--num-experts", m.num_experts),
        ("--moe-router-topk", m.experts_per_token),
        ("--moe-ffn-hidden-size", m.moe_ffn_hidden_size),
        ("--moe-token-dispatcher-type", dispatcher(plan.job)),
    ]  # as costed
    if len(m.moe_layers) != m.num_layers and not m.is_hybrid:  # a hybrid's pattern places them (E)
        pattern = ",".join("1" if m.is_moe_layer(i) else "0" for i in range(m.num_layers))
        flags.append(("--moe-layer-freq", f"[{pattern}]"))
    if m.num_shared_experts:
        flags.append(("--moe-shared-expert-intermediate-size", m.num_shared_experts * m.shared_expert_ffn_hidden_size))
    if m.routing_groups > 1:  # node-limited routing (TransformerConfig.moe_router_num_groups / group_topk)
        flags += [
            ("--moe-router-num-groups", m.routing_groups),
            ("--moe-router-group-topk", m.routing_groups_per_token),
        ]
    if m.router_bias and not m.linear_bias:  # DeepSeek-V3's per-expert correction bias, on sigmoid scores
        flags += [("--moe-router-score-function", "sigmoid"), ("--moe-router-enable-expert-bias", None)]
    elif m.router_scores_all_experts:  # a softmax over every expert before the top-k (DeepSeek-V2, Qwen2-MoE)
        flags.append(("--moe-router-pre-softmax", None))
    if m.mtp_layers:
        flags.append(("--mtp-num-layers", m.mtp_layers))
    if plan.job.dtype == "bf16":
        flags.append(("--moe-grouped-gemm", None))
    return flags


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


def check(inp: ExportInput) -> None:
    job, ep = inp.plan.job, inp.plan.dims.ep
    if job.dtype not in ("bf16", "fp16", "fp32"):
        raise refuse(TITLE, f"Megatron-LM trains in bf16, fp16 or fp32, not {job.dtype}", "dtype", job.dtype)
    if ep > 1 and job.dtype == "fp16":
        raise refuse(TITLE, "Megatron-LM does not support expert parallelism with fp16", "ep", ep)
    optimizer = job.optimizer.value
    if optimizer not in OPTIMIZERS:
        raise refuse(
            TITLE,
            f"Megatron-LM's --optimizer takes {' or '.join(OPTIMIZERS)}, not {optimizer}",
            "optimizer",
            optimizer,
            list(OPTIMIZERS),
        )


def all_flags(inp: ExportInput) -> tuple[Flags, list[str]]:
    """Every Megatron-LM flag of the export (checked against the pinned table by the tests)."""
    check(inp)
    check_model(inp.model)
    par, notes = parallel_flags(inp)
    train, train_notes = training_flags(inp.plan)
    framework, framework_notes = framework_flags(inp.plan)
    model_notes = list(attention_options(inp.model).notes) + (hybrid_notes(inp.plan) if inp.model.is_hybrid else [])
    return (
        par + model_flags(inp.model, inp.plan) + train + framework,
        notes + train_notes + framework_notes + model_notes,
    )


def entry_point(m: ModelSpec) -> str:
    """Megatron-LM's training script for ``m``, from its repository root: the hybrid one for a hybrid stack
    (``HYBRID_SCRIPT``; pretrain_mamba.py is its deprecated wrapper), BERT's (moved to examples/bert/), GPT's."""
    if m.is_hybrid:
        return HYBRID_SCRIPT
    return "pretrain_gpt.py" if m.causal else "examples/bert/pretrain_bert.py"


def _environment(plan: Plan) -> str:
    d = plan.dims
    if (d.tp > 1 or d.cp > 1) and d.zero < 2:
        return (
            "# tp or cp > 1: Megatron-LM asserts one CUDA connection (before Blackwell) so that\n"
            "# communication kernels are queued in order with compute\n"
            "export CUDA_DEVICE_MAX_CONNECTIONS=1\n"
        )
    return ""


def export(inp: ExportInput) -> Export:
    p, m = inp.plan, inp.model
    check(inp)
    check_model(m)
    par, notes = parallel_flags(inp)
    train, train_notes = training_flags(p)
    framework, framework_notes = framework_flags(p)
    train += framework
    nodes, ranks = node_order(inp), rank_placement(inp)
    placement = [(rank_order.FILE_NAME, nodes), (rank_order.RANK_FILE_NAME, ranks)]
    notes += [_placement_note(p, name) for name, text in placement if text is not None]
    notes += train_notes + framework_notes + list(attention_options(m).notes)
    notes += hybrid_notes(p) if m.is_hybrid else []
    script = entry_point(m)
    data = [("--tokenizer-type", "NullTokenizer"), ("--vocab-size", m.vocab_size), ("--mock-data", None)]
    text = (
        "#!/usr/bin/env bash\n"
        + sbatch_lines(inp)
        + header(inp, TITLE, PIN, notes)
        + "set -euo pipefail\n"
        + _environment(p)
        + (_node_order_lines() if nodes else "")
        + (_rank_placement_lines(inp.devices_per_node) if ranks else "")
        + torchrun_prologue(inp, 6000)
        + (_one_process_per_task() if ranks else "")
        + 'MEGATRON_LM="${MEGATRON_LM:-/workspace/Megatron-LM}"\n\n'
        + bash_array("PARALLEL_ARGS", flag_pairs(par), "parallelism, as nestplan costed it")
        + bash_array("MODEL_ARGS", flag_pairs(model_flags(m, p)), f"model shape of {m.name}")
        + bash_array("TRAINING_ARGS", flag_pairs(train), "batch, precision, optimizer, overlaps")
        + bash_array(
            "DATA_ARGS",
            flag_pairs(data) + ['--train-iters "${TRAIN_ITERS:-100}"', '--lr "${LR:-1.0e-4}"'],
            "yours to replace: tokenizer, data, schedule (mock data runs as is)",
        )
        + f'\n"${{TORCHRUN[@]}}" "$MEGATRON_LM/{script}" "${{PARALLEL_ARGS[@]}}" "${{MODEL_ARGS[@]}}" \\\n'
        + '    "${TRAINING_ARGS[@]}" "${DATA_ARGS[@]}" "$@"\n'
    )
    files = [ExportFile("launch_megatron.sh", text, executable=True)]
    files += [ExportFile(name, text) for name, text in placement if text is not None]
    return Export(NAME, tuple(files), tuple(notes))
