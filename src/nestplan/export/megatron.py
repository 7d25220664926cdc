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

from dataclasses import replace

from nestplan.cost.schedules import named as named_schedule
from nestplan.export import rank_order
from nestplan.export.common import (
    notes,
    stack_notes,
    sets,
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
    schedule_refusal,
    sbatch_lines,
    torchrun_prologue,
)
from nestplan.export.megatron_facts import fact_flags, moe_bias_refusal
from nestplan.export.megatron_hybrid import (
    FP8_IN_PROJ_MULTIPLE,
    HYBRID_SCRIPT,
    HYBRID_SPEC,
    PIPE,
    hybrid_layers,
    hybrid_notes,
    hybrid_unbuildable,
    unbuildable,
)
from nestplan.export.megatron_model import (
    Flags,
    attention_flags,
    attention_options,
    mla_flags,
    moe_flags,
    position_embedding_type,
)
from nestplan.export.megatron_placement import (
    node_order_lines,
    one_process_per_task,
    placement_note,
    rank_placement_lines,
)
from nestplan.export.megatron_training import framework_flags, training_flags
from nestplan.export.plan import ExportInput
from nestplan.job import Job
from nestplan.settings import CpCommType, Framework
from nestplan.model.spec import ModelSpec
from nestplan.plan import Plan
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, Schedule
from nestplan.strategy.legality import saved_activations_distributed

# re-exported: the Megatron-Bridge export reads them from here
from nestplan.export.megatron_model import dispatcher as dispatcher
from nestplan.export.megatron_training import optimizer_state_flags as optimizer_state_flags

NAME = "megatron"
TITLE = "Megatron-LM"
PIN = (
    "flags of NVIDIA/Megatron-LM megatron/training/arguments.py at commit 000c4ac2; accepted by "
    "megatron-core 0.19.2's parse_args and validate_args"
)
ORDERS = {STAGE_MAJOR: (), REPLICA_MAJOR: (("--use-tp-pp-dp-mapping", None),)}
OPTIMIZERS = ("adam", "sgd")  # --optimizer's choices that nestplan costs (nestplan.job.Optimizer)


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
# and interleaved 1F1B, no GPipe, zero-bubble or DualPipe schedule; a plan under one it lacks is refused
# (``check_schedule``), naming what it would run instead (``runs_instead``) and nestplan's prediction of that.
COSTED_SCHEDULES = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)
CP_EXCHANGES = tuple(CpCommType)  # --cp-comm-type takes every exchange
EXPERT_TP = None  # --expert-tensor-parallel-size takes any divisor of tp (parallel folding): no restriction
# What the export does with every run setting (settings.RunSettings) that differs from its default;
# tests/unit/test_export_settings.py checks each declaration against the export itself
SETTINGS = {
    "framework": notes("a plan costed for another framework: the note says so"),
    "attention_kernel": notes("a kernel other than the framework's: the note names both"),
    "grad_dtype": sets("--grad-reduce-in-bf16 / --accumulate-allreduce-grads-in-fp32"),
    "flash_attention": sets("--attention-backend flash | unfused"),
    "tp_comm_overlap": sets("--tp-comm-overlap (with sequence parallelism; noted without)"),
    "overlap_grad_reduce": sets("--overlap-grad-reduce"),
    "overlap_param_gather": sets("--overlap-param-gather"),
    "fp8_recipe": sets("--fp8-format hybrid --fp8-recipe"),
    "fp8_params": sets("--fp8-param-gather"),
    "cp_comm_type": sets("--cp-comm-type"),
    "cp_a2a_size": sets("--hierarchical-context-parallel-sizes"),
    "moe_comm_overlap": sets("--overlap-moe-expert-parallel-comm (GPT models; noted for hybrids)"),
    "moe_capacity_factor": sets("--moe-expert-capacity-factor --moe-pad-expert-input-to-capacity"),
    "moe_dispatcher": sets("--moe-token-dispatcher-type alltoall | flex"),
    "distribute_saved_activations": sets("--distribute-saved-activations (full recomputation, tp > 1, no sp)"),
    "optimizer_state": sets("--use-precision-aware-optimizer --exp-avg-dtype --exp-avg-sq-dtype"),
}


def moe_comm_overlap(m: ModelSpec) -> bool:
    """Whether Megatron-LM runs ``m``'s expert all-to-alls under another microbatch's compute
    (--overlap-moe-expert-parallel-comm, Megatron-Core's combined 1F1B schedule): a GPTModel's, not a
    HybridModel's (it has no build_schedule_plan, which that schedule asks of the model)."""
    return not m.is_hybrid


def runs_instead(plan: Plan) -> ParallelDims:
    """The plan as Megatron-core would run it under its own schedule where it lacks the costed one: 1F1B
    with the plan's chunks per stage (cost/schedules ``named``), each stage keeping its costed layers (a V
    schedule's stage s holds virtual stages s and 2 pp - 1 - s; under interleaving its two chunks would be
    virtual stages s and pp + s, each half the stage's layers)."""
    d = plan.dims
    split = d.stage_layers(plan.model.num_layers) if d.layers_per_stage is not None else None
    return replace(d, schedule=named_schedule(Schedule.ONE_F_ONE_B, d.virtual_stages), layers_per_stage=split)


def check_schedule(plan: Plan, title: str, name: str) -> None:
    """Refuse a plan whose schedule Megatron-core does not run (export ``name``, shown as ``title``)."""
    if plan.dims.schedule not in COSTED_SCHEDULES:
        raise schedule_refusal(title, name, plan, runs_instead(plan), COSTED_SCHEDULES)


def _pipeline_split(plan: Plan) -> Flags:
    """Virtual stages and uneven splits: first/last counts when the middle is even, else a layout; none
    for a hybrid stack, whose layer pattern carries its split (``hybrid_pattern``: Megatron-core's
    validate_args refuses the layout, virtual stages and, with pipes, first/last counts beside it)."""
    if plan.model.is_hybrid:
        return []
    n, v = plan.dims.layers_per_stage or (), plan.dims.virtual_stages
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
    (megatron/core/transformer/pipeline_parallel_layer_layout.py, parse_str_to_list)."""
    counts = plan.dims.virtual_stage_layers(plan.model.num_layers)
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


def _recompute(plan: Plan) -> Flags:
    if plan.dims.recompute is Recompute.FULL:  # every layer's input kept, the layer re-run in backward
        flags: Flags = [("--recompute-granularity", "full"), ("--recompute-method", "uniform")]
        split = saved_activations_distributed(plan.job.settings, plan.dims)  # the input split over tp
        return flags + [("--recompute-num-layers", 1)] + ([("--distribute-saved-activations", None)] if split else [])
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
    return flags + _pipeline_split(inp.plan) + zero + _recompute(inp.plan), notes + zero_notes


def expert_note(inp: ExportInput) -> str | None:
    """Megatron-core lays expert layers out on their own grid, etp-ep-edp-pp (cp folded into ep and
    edp): its expert-parallel groups are ep x tp / etp ranks etp apart."""
    return expert_group_note("Megatron-core", inp, inp.plan.dims.expert_tp, inp.plan.dims.expert_parallel)


def check_model(m: ModelSpec) -> None:
    """A model Megatron-core cannot build (``unbuildable`` for a GPT, ``hybrid_unbuildable`` for a
    hybrid stack): refused."""
    missing = hybrid_unbuildable(m) if m.is_hybrid else unbuildable(m)
    if missing:
        raise refuse(TITLE, f"Megatron-core cannot build {missing} of {m.name}", "model", m.name)


def hybrid_pattern(plan: Plan) -> str:
    """Megatron-core's --hybrid-layer-pattern for the plan: one symbol per block (``hybrid_symbol``),
    and with pp > 1 the costed split as pipe-separated segments, one per virtual stage in model order
    (segment v pp + k is chunk v of pipeline rank k, as Megatron-core's select_pipeline_segment reads
    it; validate_args then derives the virtual pipeline size from their number)."""
    m = plan.model
    symbols = hybrid_layers(m)
    if plan.dims.pp == 1:
        return symbols
    segments, start = [], 0
    for count in plan.dims.virtual_stage_layers(m.num_layers):
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
        flags += mla_flags(m)
    elif m.head_dim * m.num_heads != m.hidden_size:
        flags.append(("--kv-channels", m.head_dim))
    flags += [
        ("--seq-length", job.seq_len),
        ("--max-position-embeddings", max(m.max_position_embeddings, job.seq_len)),
        ("--position-embedding-type", position_embedding_type(m)),
        ("--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"),
        ("--attention-backend", "flash" if job.settings.flash_attention else "unfused"),
    ]
    flags += model_facts(m, plan)[0]  # norm epsilon, activation, rotary base and scaling, vocabulary padding
    if m.family == "nemotron":  # LayerNorm with a zero-centred gamma (HF NemotronConfig)
        flags.append(("--apply-layernorm-1p", None))
    if position_embedding_type(m) in ("rope", "yarn") and m.rotary_fraction < 1 and not m.is_mla:
        flags.append(("--rotary-percent", m.rotary_fraction))
    if not m.linear_bias:
        flags.append(("--disable-bias-linear", None))
    flags += attention_flags(m)
    if not m.tied_embeddings:
        flags.append(("--untie-embeddings-and-output-weights", None))
    if not m.dropout:
        flags += [("--attention-dropout", 0.0), ("--hidden-dropout", 0.0)]
    if m.is_moe:
        flags += moe_flags(m, plan)
    if m.is_hybrid:
        flags += hybrid_flags(plan)
    return flags


def model_facts(m: ModelSpec, plan: Plan) -> tuple[Flags, list[str]]:
    """The model's facts as flags (export.megatron_facts), and the notes on those Megatron-LM builds otherwise."""
    return fact_flags(m, plan.dims.tp, position_embedding_type(m) in ("rope", "yarn"))


def model_notes(plan: Plan) -> list[str]:
    """What Megatron-core builds otherwise of the model: attention, facts and, for a hybrid, the stack."""
    m = plan.model
    notes = list(attention_options(m, per_layer=True).notes) + model_facts(m, plan)[1]
    return notes + (hybrid_notes(plan) if m.is_hybrid else [])


def check(inp: ExportInput) -> None:
    check_schedule(inp.plan, TITLE, NAME)
    moe_bias_refusal(inp.model, inp.plan.dims.expert_tp)
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
    return (
        par + model_flags(inp.model, inp.plan) + train + framework,
        notes + train_notes + framework_notes + model_notes(inp.plan),
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
    order = choose_order(p, orders(p))
    notes += [placement_note(p, order, name) for name, text in placement if text is not None]
    notes += train_notes + framework_notes + model_notes(p)
    script = entry_point(m)
    data = [("--tokenizer-type", "NullTokenizer"), ("--vocab-size", m.vocab_size), ("--mock-data", None)]
    notes = [*notes, *stack_notes(inp.plan, Framework.MEGATRON)]
    text = (
        "#!/usr/bin/env bash\n"
        + sbatch_lines(inp)
        + header(inp, TITLE, PIN, notes)
        + "set -euo pipefail\n"
        + _environment(p)
        + (node_order_lines() if nodes else "")
        + (rank_placement_lines(inp.devices_per_node) if ranks else "")
        + torchrun_prologue(inp, 6000)
        + (one_process_per_task() if ranks else "")
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
