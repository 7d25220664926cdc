"""DeepSpeed: the JSON config (batch arithmetic, ZeRO stage, precision, optimizer, gradient
accumulation dtype, activation checkpointing, AutoTP width, Ulysses mesh) and a launch script that
states what the user's code must pass.

What DeepSpeed 0.19 derives from the config on the paths ``deepspeed.initialize`` really runs (no
mpu of the user's making):

- pp > 1: the user's ``PipelineModule`` brings its topology (pipe-data-model, model fastest:
  tp-dp-pp); the config is checked against that topology's data axis, devices / (pp x tp). That
  topology has no sequence axis: Ulysses ranks would count as data parallel, so pp > 1 with cp > 1
  is refused. AutoTP does not shard a ``PipelineModule``: the tensor parallelism is the user's
  layers' (the topology's model axis), and the config names no AutoTP width.
- pp = 1 with cp > 1: DeepSpeed's own Ulysses process groups for Hugging Face models
  (``UlyssesSPAttentionHF.register_with_transformers``, whose mpu is
  ``deepspeed.runtime.sequence_parallel.parallel_state_sp``): the config is checked against devices
  / cp, ZeRO and gradients go over the cp x dp ranks as nestplan costed them. Those groups leave no
  room for tensor ranks (sequence groups of consecutive ranks, data = the rest), so cp > 1 with
  tp > 1 is refused. (``data_parallel_size`` with ``sequence_parallel_size`` would build a mesh
  instead whose ZeRO and gradient group is the data axis alone: not exported.)
- pp = 1 otherwise: the data-parallel world checked is all devices, AutoTP's tensor ranks included;
  where tp > 1 the config leaves ``train_batch_size`` out and DeepSpeed derives it (tp times the
  samples a step trains; the export says so).

The expert-parallel width comes from ``deepspeed.moe.layer.MoE(ep_size=...)``, not from the config;
the launch script says it. ZeRO 2 and 3 cannot run under the pipeline engine, nor any schedule but 1F1B
(no interleaving, no zero-bubble or V schedule): such plans are refused.
"""

from __future__ import annotations

import json
from dataclasses import replace

from nestplan.cost.evaluator import evaluate_plan
from nestplan.export.common import (
    stack_notes,
    notes,
    refuses,
    sets,
    STAGE_MAJOR,
    Export,
    ExportFile,
    comment_text,
    header,
    rank_order_note,
    refuse,
    schedule_refusal,
    sbatch_lines,
    shell_word,
)
from nestplan.export.plan import ExportInput
from nestplan.job import Job
from nestplan.strategy.legality import cp_exchange_conflict, saved_activations_distributed
from nestplan.settings import CpCommType, MoeDispatcher, OptimizerState, Framework
from nestplan.errors import ConfigError
from nestplan.model.config import config_dict
from nestplan.model.spec import ModelSpec
from nestplan.plan import Plan
from nestplan.strategy.enums import Recompute, Schedule, ZeroStage
from nestplan.units import GiB

NAME = "deepspeed"
TITLE = "DeepSpeed"
PIN = "DeepSpeed >= 0.16.4 JSON config (AutoTP training); validated against deepspeed 0.19.8"
COSTED_SCHEDULES = (Schedule.ONE_F_ONE_B,)  # its pipeline engine's (deepspeed/runtime/pipe/schedule.py)
CP_EXCHANGES = (CpCommType.A2A,)  # its sequence parallelism is Ulysses (all-to-alls)
EXPERT_TP = (None,)  # its MoE layer (deepspeed.moe.layer.MoE) takes ep_size from the data-parallel ranks only
# what its export refuses (_layout_refusals, _refusals), kept out of the search (search.space.SearchSpace):
# Ulysses beside neither AutoTP nor a pipeline, the pipeline engine with ZeRO 0 and 1 only
SEARCH_LIMITS = {"cp_alone": True, "pipeline_zero": (ZeroStage.NONE, ZeroStage.OPTIMIZER)}
# What the export does with every run setting (settings.RunSettings) that differs from its default;
# tests/unit/test_export_settings.py checks each declaration against the export itself
SETTINGS = {
    "framework": notes("a plan costed for another framework: the note says so"),
    "attention_kernel": notes("a kernel other than the framework's: the note names both"),
    "grad_dtype": sets("data_types.grad_accum_dtype"),
    "flash_attention": notes("the attention is the user's model code"),
    "tp_comm_overlap": notes("AutoTP has no overlap of its collectives"),
    "overlap_grad_reduce": sets("zero_optimization.overlap_comm"),
    "overlap_param_gather": notes("ZeRO 1 and 2 all-gather the updated parameters after the step, stage 3 prefetches"),
    "fp8_recipe": notes("no FP8 setting"),
    "fp8_params": notes("no FP8 parameters"),
    "cp_comm_type": notes("its sequence parallelism is Ulysses (a2a)"),
    "cp_a2a_size": notes("Ulysses over the whole cp group"),
    "moe_comm_overlap": refuses("its MoE layer runs the all-to-alls exposed"),
    "moe_capacity_factor": notes("capacity_factor on the user's MoE layer"),
    "moe_dispatcher": refuses("its MoE layer dispatches with all-to-alls"),
    "distribute_saved_activations": sets("activation_checkpointing.partition_activations"),
    "optimizer_state": notes("its bf16 optimizer keeps fp32 master weights and moments"),
}
OPTIMIZERS = {"adam": "Adam", "sgd": "SGD"}  # DeepSpeed's FusedAdam; torch.optim.SGD
ZERO_TESTED = ("adam",)  # ZeRO refuses other optimizers unless allowed


def moe_comm_overlap(m: ModelSpec) -> bool:
    """Whether it runs ``m``'s expert all-to-alls under another microbatch's compute: never
    (deepspeed.moe has no cross-microbatch all-to-all overlap)."""
    return False


def config(plan: Plan) -> dict:
    """The DeepSpeed config. DeepSpeed checks train_batch_size = micro batch x accumulation x its
    data-parallel world (:func:`batch_world`); where that world is not nestplan's dp x ep the key is
    left out and DeepSpeed derives it."""
    d, job = plan.dims, plan.job
    cfg: dict = {}
    if batch_world(plan) == d.dp * d.ep:
        cfg["train_batch_size"] = job.global_batch_size
    cfg.update(
        {
            "train_micro_batch_size_per_gpu": d.micro_batch_size,
            "gradient_accumulation_steps": plan.num_microbatches,
            "zero_optimization": {
                "stage": int(d.zero),
                "overlap_comm": job.settings.overlap_grad_reduce,
                "contiguous_gradients": True,
            },
            "gradient_clipping": 1.0,
            "steps_per_print": 10,
            "wall_clock_breakdown": False,
        }
    )
    if job.dtype in ("bf16", "fp16"):
        cfg[job.dtype] = {"enabled": True}
    cfg["optimizer"] = {"type": OPTIMIZERS[job.optimizer.value]}
    if job.optimizer.value not in ZERO_TESTED and d.zero:
        cfg["zero_allow_untested_optimizer"] = True
    if _grad_accumulation_expressible(plan):
        cfg["data_types"] = {"grad_accum_dtype": job.settings.grad_dtype}
    if d.tp > 1 and d.pp == 1:
        cfg["tensor_parallel"] = {"autotp_size": d.tp}
    if d.cp > 1:
        cfg["sequence_parallel_size"] = d.cp
    if d.recompute is not Recompute.NONE:
        cfg["activation_checkpointing"] = {
            "partition_activations": saved_activations_distributed(job.settings, d),
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
            "synchronize_checkpoint_boundary": False,
        }
    return cfg


def batch_world(plan: Plan) -> int:
    """The data-parallel world DeepSpeed 0.19's ``DeepSpeedConfig`` checks the batch against
    (``_batch_assertion``) for this plan's config: the data axis of PipelineModule's topology,
    devices / (pp x tp), where pp > 1; else the world over the Ulysses mpu's sequence-parallel size,
    tensor ranks included."""
    d = plan.dims
    if d.pp > 1:
        return d.devices // (d.pp * d.tp)
    return d.devices // d.cp


def derived_train_batch(plan: Plan) -> int:
    """The train_batch_size DeepSpeed derives (and reports) when the config leaves it out."""
    return plan.dims.micro_batch_size * plan.num_microbatches * batch_world(plan)


def _model_dtype(plan: Plan) -> str:
    return plan.job.dtype if plan.job.dtype in ("bf16", "fp16") else "fp32"


def _grad_accumulation_expressible(plan: Plan) -> bool:
    """DeepSpeed accumulates gradients in ``data_types.grad_accum_dtype`` (fp32, fp16 or bf16); without
    ZeRO only in the model's own dtype (DeepSpeedEngine._do_optimizer_sanity_check)."""
    grad = plan.job.settings.grad_dtype
    return grad in ("fp32", "fp16", "bf16") and (plan.dims.zero >= 1 or grad == _model_dtype(plan))


def check_model(m: ModelSpec) -> None:
    """DeepSpeed trains the user's own model code (the export names no architecture): every model is taken."""


def check(plan: Plan, heads: int) -> None:
    """Refuse a plan DeepSpeed cannot run as costed (``heads``: its model's query heads): a schedule its
    pipeline engine does not run (it would run 1F1B on the stages costed), then the first of ``_refusals``
    that applies."""
    d = plan.dims
    if d.schedule not in COSTED_SCHEDULES:
        split = d.stage_layers(plan.model.num_layers) if d.layers_per_stage is not None else None
        one_f_one_b = replace(d, schedule=Schedule.ONE_F_ONE_B, virtual_stages=1, layers_per_stage=split)
        raise schedule_refusal(TITLE, NAME, plan, one_f_one_b, COSTED_SCHEDULES)
    for bad, what, field, value, limit in _refusals(plan, heads):
        if bad:
            raise refuse(TITLE, what, field, value, limit)


Refusal = tuple[bool, str, str, object, object]  # (whether the plan has it, why not, the field, its value, the limit)


def _refusals(plan: Plan, heads: int) -> list[Refusal]:
    """What DeepSpeed cannot run, in the order ``check`` asks."""
    d, optimizer = plan.dims, plan.job.optimizer.value
    first = (
        optimizer not in OPTIMIZERS,
        f"the optimizers exported are {' and '.join(OPTIMIZERS)}, not {optimizer}",
        "optimizer",
        optimizer,
        list(OPTIMIZERS),
    )
    last = (
        d.zero >= 2 and d.pp > 1,
        f"DeepSpeed's pipeline engine supports ZeRO 0 and 1 only, the plan has ZeRO {int(d.zero)} with pp {d.pp}",
        "zero_stage",
        int(d.zero),
        1,
    )
    return [first, *_layout_refusals(plan, heads), *_moe_refusals(plan), last]


def _layout_refusals(plan: Plan, heads: int) -> list[Refusal]:
    """Ulysses beside a pipeline, beside AutoTP, or over heads it cannot split."""
    d, kv_heads = plan.dims, plan.model.num_kv_heads
    return [
        (
            d.cp > 1 and d.pp > 1,
            f"DeepSpeed's pipeline topology (pipe, data, model) has no sequence axis: Ulysses of "
            f"cp {d.cp} cannot run with pp {d.pp} (its ranks would count as data parallel)",
            "cp",
            d.cp,
            1,
        ),
        (
            d.cp > 1 and d.tp > 1,
            f"DeepSpeed's Ulysses groups (parallel_state_sp) and AutoTP's each put their group on "
            f"consecutive ranks and count the rest as data parallel: cp {d.cp} with tp {d.tp} would share "
            "ranks between the sequence and the tensor groups",
            "cp",
            d.cp,
            1,
        ),
        (
            cp_exchange_conflict(_ulysses(plan.job).settings, d.cp, heads, kv_heads) is not None,
            f"cp {d.cp} runs as DeepSpeed-Ulysses, whose all-to-all splits the {heads} query and "
            f"{kv_heads} key/value heads over the {d.cp} ranks: they must divide both",
            "cp",
            d.cp,
            None,
        ),
    ]


def _moe_refusals(plan: Plan) -> list[Refusal]:
    """The MoE settings DeepSpeed's MoE layer cannot run: another dispatcher, overlapped all-to-alls,
    experts folded over tp."""
    d, job = plan.dims, plan.job
    return [
        (
            job.settings.moe_dispatcher is not MoeDispatcher.ALLTOALL,
            f"DeepSpeed's MoE layer dispatches with all-to-alls, not the {job.settings.moe_dispatcher.value} "
            "dispatcher the plan costed",
            "moe_dispatcher",
            job.settings.moe_dispatcher.value,
            "alltoall",
        ),
        (
            job.settings.moe_comm_overlap,
            "DeepSpeed's MoE layer runs each microbatch's all-to-alls exposed: the plan's overlap of "
            "them with another microbatch's compute cannot run",
            "moe_comm_overlap",
            True,
            False,
        ),
        (
            d.etp is not None,
            f"DeepSpeed's MoE layer draws expert parallelism from the data-parallel ranks only: the "
            f"plan's experts folded over tp (etp {d.etp} below tp {d.tp}) cannot run",
            "etp",
            d.etp,
            d.tp,
        ),
    ]


def notes_for(inp: ExportInput) -> list[str]:
    d = inp.plan.dims
    notes = [n for n in [rank_order_note(TITLE, inp, STAGE_MAJOR)] if n]
    if d.pp > 1:
        notes += _pipeline_notes(inp.plan)
    elif d.tp > 1:
        notes.append(
            f"AutoTP shards the model over tp {d.tp}; DeepSpeed counts its tensor ranks as data parallel "
            f"in the batch arithmetic, so ds_config.json leaves train_batch_size out: DeepSpeed derives "
            f"and reports {derived_train_batch(inp.plan)}, while each step trains the global batch "
            f"{inp.plan.job.global_batch_size} ({d.dp * d.ep} data-parallel ranks x micro batch "
            f"{d.micro_batch_size} x {inp.plan.num_microbatches} accumulation steps)"
        )
    if d.cp > 1:
        notes.append(_ulysses_note(inp.plan))
    if d.ep > 1:
        capacity = inp.plan.job.settings.moe_capacity_factor
        extra = "" if capacity is None else f", capacity_factor={capacity}, drop_tokens=True"
        notes.append(f"your code must build its MoE layers with deepspeed.moe.layer.MoE(ep_size={d.ep}{extra}, ...)")
    if d.recompute is Recompute.SELECTIVE:
        notes.append(
            "selective recomputation (the attention core only) is up to your model code: wrap the "
            "attention core in deepspeed.checkpointing.checkpoint"
        )
    elif d.recompute is Recompute.FULL:
        notes.append(
            "full recomputation: PipelineModule(activation_checkpoint_interval=1), or wrap each layer in "
            "deepspeed.checkpointing.checkpoint"
        )
    if d.zero == 1 and d.pp == 1:
        notes.append("ZeRO 1 shards optimizer state over the data-parallel ranks as nestplan costed")
    return notes + _job_notes(inp.plan)


def _pipeline_notes(plan: Plan) -> list[str]:
    d = plan.dims
    split = ",".join(map(str, d.layers_per_stage or ()))
    notes = [
        f"your code must build PipelineModule(num_stages={d.pp}, topology=PipeModelDataParallelTopology("
        f"num_pp={d.pp}, num_mp={d.tp}, num_dp={d.dp * d.ep}), partition_method=...) with the transformer "
        f"layers split {split} (embedding on the first stage, head on the last)"
    ]
    if d.tp > 1:
        notes.append(
            f"AutoTP does not shard a PipelineModule: your layers must be tensor-parallel over the "
            f"topology's model axis ({d.tp} ranks, e.g. Megatron-DeepSpeed's), so the config names no "
            "autotp_size"
        )
    return notes


def _ulysses_note(plan: Plan) -> str:
    d, job = plan.dims, plan.job
    note = (
        f"cp {d.cp} runs as DeepSpeed-Ulysses (ALST): your code must call mpu = deepspeed.runtime.sequence_"
        f"parallel.ulysses_sp.UlyssesSPAttentionHF.register_with_transformers(model, core_attn_implementation="
        f"..., sequence_parallel_size={d.cp}, micro_batch_size={d.micro_batch_size}, seq_length={job.seq_len}, "
        "seq_length_is_variable=False), pass deepspeed.initialize(..., mpu=mpu) and wrap its DataLoader in "
        "ulysses_sp.UlyssesSPDataLoaderAdapter (which shards each sequence over the group): DeepSpeed's own "
        f"sequence-parallel groups, ZeRO and gradients over the {d.cp * d.dp * d.ep} cp x dp ranks"
    )
    if job.settings.cp_comm_type in CP_EXCHANGES:
        return note + " (the all-to-all nestplan costed)"
    return (
        note + f"; it exchanges heads by all-to-all where nestplan costed {job.settings.cp_comm_type.value}: under "
        f"a2a {_prediction_under(plan, _ulysses(job))}"
    )


def _ulysses(job: Job) -> Job:
    """The job with context parallelism's exchange as DeepSpeed-Ulysses runs it (all-to-alls over the cp ranks)."""
    return job.with_settings(cp_comm_type=CP_EXCHANGES[0], cp_a2a_size=1)


def _prediction_under(plan: Plan, job: Job) -> str:
    """nestplan's prediction of the plan with DeepSpeed's ``job`` in place of the costed one."""
    pred = evaluate_plan(plan.model, plan.cluster, plan.dims, job, plan.axis_order)
    text = (
        f"nestplan predicts step {pred.step_time_s:.3f} s ({pred.tokens_per_s:,.0f} tokens/s) instead of "
        f"{plan.predicted.step_time_s:.3f} s"
    )
    if not pred.fits:
        text += (
            f", and {pred.peak_memory_bytes_per_device / GiB:.1f} GiB per device that does not fit in "
            f"{pred.memory_capacity_bytes / GiB:.1f}"
        )
    return text


def _job_notes(plan: Plan) -> list[str]:
    """The job settings ds_config.json cannot carry (the config names the optimizer, which an optimizer
    the user's code passes to deepspeed.initialize replaces)."""
    notes = []
    if not _grad_accumulation_expressible(plan):
        notes.append(
            f"DeepSpeed accumulates gradients in fp32, fp16 or bf16, without ZeRO in the model's "
            f"{_model_dtype(plan)} only: not in {plan.job.settings.grad_dtype} as nestplan costed"
        )
    if not plan.job.settings.overlap_param_gather and plan.dims.zero:
        notes.append(
            "nestplan costed ZeRO's parameter all-gather exposed: DeepSpeed's ZeRO 1 and 2 all-gather the updated "
            "parameters after the optimizer step, exposed, and ZeRO 3 prefetches parameters under the forward "
            "(stage3_prefetch_bucket_size), which can make the run faster than predicted"
        )
    if not plan.job.settings.flash_attention:
        notes.append(
            "nestplan costed attention without a fused kernel (the score matrices stored): your model "
            "code decides which attention runs"
        )
    job = plan.job
    if job.fp8:
        notes.append(
            f"nestplan costed FP8 GEMMs ({job.settings.fp8_recipe.value} scaling): DeepSpeed has no FP8 setting; "
            "your model code must run its linear layers in FP8 (Transformer Engine's fp8_autocast)"
        )
    if job.settings.tp_comm_overlap and plan.dims.tp > 1:
        notes.append(
            "nestplan costed tp collectives overlapped with their GEMMs: your model code's tensor-parallel "
            "layers decide whether they are"
        )
    if job.settings.optimizer_state is not OptimizerState.FP32:
        notes.append(
            f"nestplan costed the {job.settings.optimizer_state.value} optimizer state: DeepSpeed's bf16 optimizer and "
            f"ZeRO keep fp32 master weights and moments"
        )
    return notes


def _launcher_line(inp: ExportInput) -> str:
    """The deepspeed launcher over exactly the plan's devices: its hostfile's first nodes, every slot of
    a full node (``--num_gpus``), or where the last node is partly used the slots the hostfile gives
    (the launcher's ``apply_num_nodes_and_gpus`` keeps a host's hostfile slots without --num_gpus)."""
    per_node, used, nodes = inp.devices_per_node, inp.plan.devices_used, inp.nodes
    last = used - (nodes - 1) * per_node
    if nodes == 1 or last == per_node:
        slots, gpus = f"slots={last}", f"--num_gpus {shell_word(last)} "
    else:
        slots, gpus = f"slots={per_node}, the last with slots={last}", ""
    return (
        f"# {comment_text(f'{nodes} nodes x {per_node} GPUs, {used} used')}: the hostfile lists the nodes in "
        f"network order, one line each (<host> {comment_text(slots)})\n"
        f'deepspeed --hostfile "${{HOSTFILE:-hostfile}}" --num_nodes {shell_word(nodes)} {gpus}'
        '"${TRAIN_SCRIPT:-train.py}" --deepspeed --deepspeed_config ds_config.json "$@"\n'
    )


MODEL_FILE = "config.json"


def model_file(m: ModelSpec) -> tuple[ExportFile | None, str]:
    """DeepSpeed trains the model the user's script builds, not one ds_config.json describes: the model as
    nestplan read it (``config_dict``, a Hugging Face config.json) for that script to build, and the note
    saying so; where nestplan cannot write the model as its family's config.json, the note says that."""
    try:
        text = json.dumps(config_dict(m), indent=2) + "\n"
    except ConfigError as why:
        return None, f"{MODEL_FILE}: not written ({why}); the training script must build {m.name} as costed"
    return ExportFile(MODEL_FILE, text), (
        f"{MODEL_FILE} is {m.name} as nestplan costed it: the training script builds the model from it "
        f"(transformers: AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(<this folder>)))"
    )


def export(inp: ExportInput) -> Export:
    p = inp.plan
    check(p, inp.model.num_heads)
    notes = notes_for(inp)
    text = json.dumps(config(p), indent=2) + "\n"
    model, model_note = model_file(inp.model)
    notes = [*notes, model_note, *stack_notes(inp.plan, Framework.DEEPSPEED)]
    launch = (
        "#!/usr/bin/env bash\n"
        + sbatch_lines(inp)
        + header(inp, TITLE, PIN, notes)
        + "set -euo pipefail\n"
        + _launcher_line(inp)
    )
    files = (ExportFile("ds_config.json", text), ExportFile("launch_deepspeed.sh", launch, True))
    return Export(NAME, files + ((model,) if model else ()), tuple(notes))
