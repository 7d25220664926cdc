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
What torchtitan runs differently (all-gathered K/V for context parallelism, ZB-H1 as 1F1B, rowwise
FP8, another architecture as a Llama-architecture stand-in) is noted with nestplan's prediction for it.
"""

from __future__ import annotations

from dataclasses import replace

from nestplan.cost.evaluator import evaluate_plan
from nestplan.export import rank_order
from nestplan.export.common import (
    STAGE_MAJOR,
    Export,
    ExportFile,
    bash_array,
    comment_text,
    counts_text,
    expert_group_note,
    flag_pairs,
    header,
    rank_order_note,
    refuse,
    sbatch_lines,
    torchrun_prologue,
)
from nestplan.export.megatron import hybrid_stack
from nestplan.export.plan import ExportInput
from nestplan.job import Job
from nestplan.model.spec import ModelSpec
from nestplan.plan import Plan
from nestplan.settings import CpCommType, Fp8Recipe, MoeDispatcher, OptimizerState
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, Schedule

NAME = "torchtitan"
TITLE = "torchtitan"
PIN = "torchtitan 0.3.0 command-line flags"
# torch.distributed.pipelining's schedule names (get_schedule_class); it has no single-chunk ZB-H1, which runs
# as its closest, 1F1B (the same microbatch order with the backward whole)
SCHEDULES = {
    Schedule.ONE_F_ONE_B: "1F1B",
    Schedule.GPIPE: "GPipe",
    Schedule.INTERLEAVED: "Interleaved1F1B",
    Schedule.ZB_H1: "1F1B",
    Schedule.ZBV: "ZBVZeroBubble",
    Schedule.DUALPIPEV: "DualPipeV",
}
RUNS_AS = {Schedule.ZB_H1: Schedule.ONE_F_ONE_B}
COSTED_SCHEDULES = tuple(s for s in Schedule if s not in RUNS_AS)  # what it runs as nestplan costs it
CP_EXCHANGES = (CpCommType.ALLGATHER,)  # 0.3.0's context parallelism all-gathers K/V (FlexAttention)
EXPERT_TP = (1,)  # 0.3.0's experts have no tensor parallelism: expert parallelism borrows the tp ranks
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}  # TrainingConfig.mixed_precision_param's choices
# catalog model: (torchtitan's config_registry function lending the run settings, its model flavor, its
# Hugging Face assets folder); the 405B takes the 70B's settings: torchtitan's llama3_405b builds FP8
# linears and compiles (torchtitan/models/llama3/config_registry.py)
MODEL_CONFIGS = {
    "llama3-8b": ("llama3_8b", "8B", "./assets/hf/Llama-3.1-8B"),
    "llama3-70b": ("llama3_70b", "70B", "./assets/hf/Llama-3.1-70B"),
    "llama3.1-405b": ("llama3_70b", "405B", "./assets/hf/Llama-3.1-405B"),
}
SWIGLU_MULTIPLE = 256  # Llama's FFN sizes are multiples of 256 (Touvron et al. 2023, Llama 2's multiple_of)
CONFIG_MODULE = "nestplan_torchtitan"  # the config module the export writes next to its launch script
CONFIG_FUNCTION = "nestplan_plan"
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


def _layers_per_stage_flag(target: list[int], weights: tuple[int, int]) -> int | None:
    """torchtitan's --parallelism.pipeline-parallel-layers-per-stage that makes ``len(target)`` stages
    (it makes ceil(effective layers / layers-per-stage)), or None where none does."""
    lps = max(target)
    return lps if -(-(sum(target) + sum(weights)) // lps) == len(target) else None


def listed_split(plan: Plan) -> list[int] | None:
    """The layers per (virtual) stage where torchtitan's split flags cannot give the costed split, which
    the config module then lists module by module (``module_fqns_per_model_part``); None where the
    flags give it."""
    d = plan.dims
    if d.pp == 1:
        return None
    target = list(d.virtual_stage_layers(plan.model.num_layers))  # virtual stage i runs on rank i % pp
    weights = _stage_weights(target)
    if weights is None or (
        d.virtual_stages > 1 and _layers_per_stage_flag(target, weights) is None and d.virtual_stages != 2
    ):
        return target
    return None


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
    weights = _stage_weights(target)
    assert weights is not None, "listed_split lists every split the weights cannot give"
    lps = _layers_per_stage_flag(target, weights)
    if d.virtual_stages > 1 and lps is not None:
        flags.append(("--parallelism.pipeline-parallel-layers-per-stage", lps))
    flags += [
        ("--parallelism.pipeline-parallel-first-stage-less-layers", weights[0]),
        ("--parallelism.pipeline-parallel-last-stage-less-layers", weights[1]),
    ]
    return flags, []


def _stages_source(counts: list[int]) -> tuple[str, str]:
    """(the function listing each stage's modules, the line that sets it) for a listed split."""
    function = (
        f"STAGE_LAYERS = [{', '.join(str(int(c)) for c in counts)}]   # per (virtual) stage, as costed\n\n\n"
        "def nestplan_stages():\n"
        '    """Each (virtual) stage\'s modules: the embedding first, the norm and head last."""\n'
        "    parts, first = [], 0\n"
        "    for count in STAGE_LAYERS:\n"
        '        parts.append([f"layers.{i}" for i in range(first, first + count)])\n'
        "        first += count\n"
        '    parts[0].insert(0, "tok_embeddings")\n'
        '    parts[-1] += ["norm", "lm_head"]\n'
        "    return parts\n\n\n"
    )
    return function, "    config.parallelism.module_fqns_per_model_part = nestplan_stages()\n"


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
    can cost, and what differs: a model of another architecture is built as a Llama-architecture one
    of its sizes (``run_model``); without pp, ZeRO 1 runs as ZeRO 2 (FSDP2 reduce-scatters gradients each
    microbatch; with pp, torch's pipeline stages defer that to the last one, as ZeRO 1); ZB-H1 runs as 1F1B (torch.distributed.pipelining has no single-chunk zero
    bubble schedule); its context parallelism all-gathers K/V (FlexAttention with ``flex_cp_allgather``;
    0.3.0 has no ring or all-to-all option); its float8 linears (torchao) scale from the current amax
    (rowwise; nestplan's closest recipe is tensorwise current scaling) and keep parameters in the
    training dtype."""
    model, dims, job, changes = run_model(plan.model), plan.dims, plan.job, []
    if model != plan.model:
        changes.append(
            f"torchtitan 0.3.0 has no {plan.model.family} architecture "
            f"({', '.join(_differences(plan.model))}): it builds a Llama-architecture decoder of "
            f"{plan.model.name}'s sizes (SwiGLU hidden {model.ffn_hidden_size}, untied head, no dropout)"
        )
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
    if dims.pp > 1 and dims.schedule in RUNS_AS:
        changes.append(
            "torch.distributed.pipelining has no single-chunk zero-bubble schedule: torchtitan runs "
            f"the {dims.schedule.value} plan as {SCHEDULES[RUNS_AS[dims.schedule]]}"
        )
        dims = replace(dims, schedule=RUNS_AS[dims.schedule])
    if dims.cp > 1 and job.settings.cp_comm_type not in CP_EXCHANGES:
        changes.append(
            f"torchtitan 0.3.0's context parallelism all-gathers K/V (FlexAttention); it has no "
            f"{job.settings.cp_comm_type.value} exchange, which nestplan costed"
        )
        job = job.with_settings(cp_comm_type=CP_EXCHANGES[0], cp_a2a_size=1)
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
    return model, dims, job, changes


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


def _job_notes(plan: Plan) -> list[str]:
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
    return notes + _run_note(plan)


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
    if inp.model.name not in MODEL_CONFIGS:
        notes.append(
            f"torchtitan ships no tokenizer for {inp.model.name}: give --hf-assets-path the folder of its "
            f"Hugging Face tokenizer ({inp.model.vocab_size} tokens); the config's default is Llama 3.1's"
        )
    return flags, ckpt, notes + ep_notes + dp_notes + pipe_notes + ckpt_notes + compile_notes + _job_notes(p)


def _differences(m: ModelSpec) -> list[str]:
    """How ``m`` differs from what torchtitan 0.3.0 builds: Llama-architecture decoders (RMSNorm, SwiGLU,
    rotary positions, no biases, no dropout, untied head) and, for MoE, Qwen3-MoE blocks (every layer
    MoE, no shared experts)."""
    checks = [
        (m.norm != "rmsnorm", m.norm),
        (not m.gated_mlp, "a non-gated MLP"),
        (m.linear_bias, "linear biases"),
        (m.learned_position_embeddings, "learned position embeddings"),
        (m.rotary_fraction != 1.0, "partial rotary embeddings"),
        (m.tied_embeddings, "tied embeddings"),
        (m.dropout, "dropout"),
        (m.qkv_bias, "query/key/value biases"),
        (m.qk_norm != "none", "query/key norms"),
        (m.block_norms != 2, f"{m.block_norms} norms per block"),
        (any(m.window_of(i) is not None for i in range(m.num_layers)), "sliding-window attention"),
        (m.attention_sinks, "attention sinks"),
        (m.router_bias, "a router bias"),
        (m.parallel_block, "attention and MLP in parallel"),
    ]
    return [what for bad, what in checks if bad]


def check_model(m: ModelSpec) -> None:
    """A model torchtitan 0.3.0 has nothing close to (``run_model``): refused."""
    run_model(m)


def run_model(m: ModelSpec) -> ModelSpec:
    """The model torchtitan 0.3.0 builds for ``m``: ``m`` itself where it is of torchtitan's architecture,
    else a Llama-architecture decoder of ``m``'s sizes (a non-gated MLP's parameters kept by a SwiGLU of
    2/3 its hidden size, rounded to a multiple of 256 as Llama's sizes are, so tp degrees still divide it). Refused where torchtitan has nothing close: an encoder, MoE with shared experts
    or dense layers between, heads that do not tile the hidden size, latent or chunked attention, a hybrid
    stack of Mamba layers (Nemotron-H, Jamba: torchtitan has no Mamba mixer)."""
    blockers = [
        (not m.causal, "bidirectional attention"),
        (m.num_shared_experts > 0, "shared experts"),
        (m.is_moe and len(m.moe_layers) != m.num_layers, "dense layers between MoE layers"),
        (not m.is_moe and m.head_dim * m.num_heads != m.hidden_size, "a head size other than hidden / heads"),
        (m.is_mla, "multi-head latent attention"),
        (bool(m.chunked_attention_layers), "chunked attention"),
        (m.is_hybrid, hybrid_stack(m)),
    ]
    missing = [what for bad, what in blockers if bad]
    if missing:
        raise refuse(
            TITLE,
            f"torchtitan 0.3.0 builds Llama-architecture decoders and Qwen3-MoE blocks; {m.name} "
            f"has {', '.join(missing)}",
            "model",
            m.name,
        )
    if not _differences(m):
        return m
    ffn = m.ffn_hidden_size if m.gated_mlp else SWIGLU_MULTIPLE * round(2 * m.ffn_hidden_size / 3 / SWIGLU_MULTIPLE)
    return replace(
        m,
        name=f"{m.name} as llama",
        norm="rmsnorm",
        gated_mlp=True,
        ffn_hidden_size=ffn,
        linear_bias=False,
        learned_position_embeddings=False,
        rotary_fraction=1.0,
        tied_embeddings=False,
        dropout=False,
        qkv_bias=False,
        qk_norm="none",
        block_norms=2,
        sliding_window=None,
        sliding_window_layers=(),
        attention_sinks=False,
        router_bias=False,
        parallel_block=False,
    )


def _model_source(m: ModelSpec, fp8: bool, compiled: bool) -> tuple[str, str]:
    """(imports, body of ``nestplan_model``) for torchtitan 0.3.0 building ``m``: its own Llama 3 flavor
    where it ships one, else its Llama 3 (dense) or Qwen3-MoE (MoE, query/key norms removed) layers
    at ``m``'s sizes, resized from a shipped flavor that lends the initialisation and rotary settings."""
    converter = f'Float8LinearConverter.Config(filter_fqns=["lm_head"], model_compile_enabled={compiled})'
    imports = "from torchtitan.components.quantization import Float8LinearConverter\n" if fp8 else ""
    if m.name in MODEL_CONFIGS:
        _, flavor, _ = MODEL_CONFIGS[m.name]
        return imports, f'    return model_registry("{flavor}"{f", converters=[{converter}]" if fp8 else ""})\n'
    imports = "from dataclasses import replace\n\n" + imports
    sizes = (
        f"n_layers={int(m.num_layers)}, dim={int(m.hidden_size)}, n_heads={int(m.num_heads)}, "
        f"n_kv_heads={int(m.num_kv_heads)}"
    )
    if m.is_moe:
        imports += (
            "from torchtitan.models.qwen3 import _build_qwen3_moe_layers\n"
            "from torchtitan.models.qwen3 import model_registry as qwen3_registry\n"
        )
        layers = (
            f"    layers = _build_qwen3_moe_layers(\n        {sizes}, head_dim={int(m.head_dim)},\n"
            f"        moe_hidden_dim={int(m.moe_ffn_hidden_size)}, num_experts={int(m.num_experts)}, "
            f"top_k={int(m.experts_per_token)},\n"
            '        attn_backend="flex", moe_comm_backend="standard", rope=replace(rope, '
            f"dim={int(m.head_dim)}))\n"
            "    layers = [replace(b, attention=replace(b.attention, qk_norm=None)) for b in layers]\n"
        )
        spec = '    spec = qwen3_registry("30B-A3B")   # Qwen3-MoE blocks: softmax top-k router, renormalised\n'
    else:
        imports += "from torchtitan.models.llama3 import _build_llama3_layers\n"
        layers = (
            f"    layers = _build_llama3_layers(\n        {sizes},\n        hidden_dim={int(m.ffn_hidden_size)}, "
            f'attn_backend="flex", rope=replace(rope, dim={int(m.head_dim)}))\n'
        )
        spec = '    spec = model_registry("8B")   # Llama 3 blocks\n'
    vocab, dim = int(m.vocab_size), int(m.hidden_size)
    body = (
        spec
        + "    base = spec.model\n    rope = base.layers[0].attention.rope\n"
        + layers
        + f"    model = replace(base, dim={dim}, vocab_size={vocab}, layers=layers,\n"
        f"                    tok_embeddings=replace(base.tok_embeddings, num_embeddings={vocab}, "
        f"embedding_dim={dim}),\n"
        f"                    norm=replace(base.norm, normalized_shape={dim}),\n"
        f"                    lm_head=replace(base.lm_head, in_features={dim}, out_features={vocab}))\n"
        + (f"    model = {converter}.build().convert(model)\n" if fp8 else "")
        + '    return replace(spec, flavor="nestplan", model=model)\n'
    )
    return imports, body


def config_module(inp: ExportInput, compiled: bool) -> str:
    """The text of ``nestplan_torchtitan.py``: torchtitan 0.3.0's config for the plan (the model nestplan
    costed, FP8 linears only where it costed them), read by ``--module nestplan_torchtitan --config
    nestplan_plan``. Every value in it is an integer of the validated model or a fixed name."""
    m, job = run_model(inp.model), inp.plan.job
    imports, body = _model_source(m, job.fp8, compiled)
    base, _, assets = MODEL_CONFIGS.get(m.name, ("llama3_70b", "", ""))
    assets_line = f'    config.hf_assets_path = "{assets}"\n' if assets else ""
    listed = listed_split(inp.plan)
    stages, stages_line = _stages_source(listed) if listed is not None else ("", "")
    return (
        '"""torchtitan 0.3.0 config written by nestplan: the model it builds for the plan and its precision.'
        "\n\nThe launch script puts this folder on PYTHONPATH and passes --module "
        f'{CONFIG_MODULE} --config {CONFIG_FUNCTION};\nits flags set the parallelism, batch and sequence."""\n'
        f"# nestplan {comment_text(inp.version)}\n# model: {comment_text(m.name)}, {int(m.num_layers)} layers, hidden {int(m.hidden_size)}"
        f"{f', {int(m.num_experts)} experts (top {int(m.experts_per_token)})' if m.is_moe else ''}"
        f"; FP8 linears: {'yes' if job.fp8 else 'no'}\n\n"
        + imports
        + "from torchtitan.models.common.config_utils import decoder_vocab_size\n"
        "from torchtitan.models.llama3 import config_registry, model_registry\n\n\n"
        "def nestplan_model():\n" + body + "\n\n" + stages + f"def {CONFIG_FUNCTION}():\n"
        f"    config = config_registry.{base}()   # torchtitan's run settings (data, optimizer, checkpoints)\n"
        "    config.model_spec = nestplan_model()\n"
        "    config.loss.loss_fn.global_vocab_size = decoder_vocab_size(config.model_spec)\n"
        + assets_line
        + stages_line
        + "    return config\n"
    )


def export(inp: ExportInput) -> Export:
    flags, ckpt, notes = all_flags(inp)
    remap = node_order(inp)
    module = config_module(inp, ("--compile.enable", None) in flags)
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
