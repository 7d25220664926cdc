"""Megatron-Bridge (NeMo's LLM training since nemo-toolkit 3.0): ``run_recipe.py --recipe <name>``
with Hydra-style overrides (``section.field=value``) that make the recipe run the plan.

Validated against Megatron-Bridge 0.6.2 over megatron-core 0.19.2 (tests/unit/test_real_megatron_bridge.py
builds the named recipe's ConfigContainer, applies these overrides with Megatron-Bridge's own parser and
runs its ``runtime_config_update``); keys are its ConfigContainer's field names (``megatron_bridge_keys.txt``).
A recipe brings settings of its own (a virtual pipeline size, split accounting, a sequence length, a
TP-overlap config for its tp): every one that bears on what nestplan costed is overridden, and so is
every model field, so the recipe contributes nothing the plan did not cost. Megatron-Bridge runs
Megatron-core, so parallelism, recomputation and rank order follow the Megatron-LM exporter.
"""

from __future__ import annotations

import re

from nestplan.export import megatron
from nestplan.export.common import (
    stack_notes,
    notes,
    sets,
    REPLICA_MAJOR,
    Export,
    ExportFile,
    bash_array,
    header,
    refuse,
    sbatch_lines,
    shell_word,
    torchrun_prologue,
)
from nestplan.export.nemo_model import GENERIC_MLA_RECIPE, GENERIC_RECIPE, check_model, fact_fields, recipe
from nestplan.export.nemo_model import position_embedding, rotary_percent
from nestplan.export.plan import ExportInput
from nestplan.model.spec import ModelSpec
from nestplan.plan import Plan
from nestplan.settings import CpCommType, Fp8Recipe, OptimizerState, Framework
from nestplan.strategy.enums import Recompute
from nestplan.strategy.legality import saved_activations_distributed

NAME = "megatron-bridge"
ALIASES = ("nemo",)  # the name this export had while it targeted NeMo 2
TITLE = "Megatron-Bridge"
PIN = "Megatron-Bridge 0.6.2 (megatron-core 0.19.2) recipes and ConfigContainer override keys"
COSTED_SCHEDULES = megatron.COSTED_SCHEDULES  # Megatron-core runs the schedules and the exchanges
CP_EXCHANGES = megatron.CP_EXCHANGES
EXPERT_TP = megatron.EXPERT_TP
# What the export does with every run setting (settings.RunSettings) that differs from its default;
# tests/unit/test_export_settings.py checks each declaration against the export itself
SETTINGS = {
    "framework": notes("a plan costed for another framework: the note says so"),
    "attention_kernel": notes("a kernel other than the framework's: the note names both"),
    "grad_dtype": notes("set grad_reduce_in_fp32 in the recipe's mixed_precision"),
    "flash_attention": sets("model.attention_backend"),
    "tp_comm_overlap": sets("comm_overlap, model.tp_comm_overlap"),
    "overlap_grad_reduce": sets("ddp.overlap_grad_reduce"),
    "overlap_param_gather": sets("ddp.overlap_param_gather"),
    "fp8_recipe": sets("mixed_precision (bf16_with_fp8_..._mixed)"),
    "fp8_params": sets("mixed_precision; fp8_param_gather noted"),
    "cp_comm_type": sets("model.cp_comm_type"),
    "cp_a2a_size": sets("model.hierarchical_context_parallel_sizes"),
    "moe_comm_overlap": sets("model.overlap_moe_expert_parallel_comm"),
    "moe_capacity_factor": sets("model.moe_expert_capacity_factor, model.moe_pad_expert_input_to_capacity"),
    "moe_dispatcher": sets("model.moe_token_dispatcher_type"),
    "distribute_saved_activations": sets("model.distribute_saved_activations"),
    "optimizer_state": sets("optimizer.use_precision_aware_optimizer, optimizer.store_param_remainders"),
}
moe_comm_overlap = megatron.moe_comm_overlap  # Megatron-core runs it
__all__ = ["check_model", "recipe"]  # the model's side (nemo_model.py), asked for by name here
# Megatron-Bridge's mixed-precision recipes per FP8 scaling (megatron/bridge/training/mixed_precision.py)
FP8_RECIPES = {
    Fp8Recipe.DELAYED: "with_fp8_delayed_scaling",
    Fp8Recipe.TENSORWISE: "with_fp8_current_scaling",
    Fp8Recipe.BLOCKWISE: "with_fp8_subchannel_scaling",
    Fp8Recipe.MXFP8: "with_mxfp8",
}
_HYDRA_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a string Hydra's override grammar reads unquoted
_HYDRA_QUOTABLE = re.compile(r"[A-Za-z0-9_.*|+()-]*")  # no quote, backslash or $: literal in Hydra's double quotes
Items = list[tuple[str, object]]


def _value(v: object) -> str:
    """An override value in Hydra's grammar: booleans, null and numbers as literals, lists bracketed; other strings
    double-quoted unless a plain identifier (the pipeline layout's '|', '*' and '()' need the quotes)."""
    if isinstance(v, bool) or v is None:
        return "true" if v is True else "false" if v is False else "null"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ",".join(_value(x) for x in v) + "]"
    text = str(v)
    if _HYDRA_WORD.fullmatch(text) and text.lower() not in ("true", "false", "null", "nan", "inf"):
        return text
    assert _HYDRA_QUOTABLE.fullmatch(text), f"override values are nestplan's own words: {text!r}"
    return f'"{text}"'


def check(inp: ExportInput) -> None:
    """What Megatron-Bridge cannot run as costed: Megatron-core's schedules, Megatron-LM's limits, its models,
    fp32 training."""
    megatron.check_schedule(inp.plan, TITLE, NAME)
    megatron.check(inp)
    check_model(inp.model)
    if inp.plan.job.dtype not in ("bf16", "fp16"):
        raise refuse(
            TITLE,
            "Megatron-Bridge's recipes train in mixed precision, bf16 or fp16",
            "dtype",
            inp.plan.job.dtype,
            ["bf16", "fp16"],
        )


def overrides(inp: ExportInput) -> tuple[Items, list[str]]:
    """(key, value) overrides and the notes."""
    check(inp)
    p, d, job = inp.plan, inp.plan.dims, inp.plan.job
    order, notes = megatron.rank_layout(inp, TITLE, "tp-pp-dp mapping")
    out: Items = [
        ("model.tensor_model_parallel_size", d.tp),
        ("model.pipeline_model_parallel_size", d.pp),
        ("model.virtual_pipeline_model_parallel_size", d.virtual_stages if d.virtual_stages > 1 else None),
        ("model.context_parallel_size", d.cp),
        ("model.sequence_parallel", d.sp_active),
        ("model.expert_model_parallel_size", d.expert_parallel),
        ("model.expert_tensor_parallel_size", d.expert_tp if inp.model.is_moe else 1),
        ("model.overlap_moe_expert_parallel_comm", job.settings.moe_comm_overlap),
        ("model.moe_expert_capacity_factor", job.settings.moe_capacity_factor),
        ("model.moe_pad_expert_input_to_capacity", job.settings.moe_capacity_factor is not None),
        ("model.seq_length", job.seq_len),
        ("dataset.seq_length", job.seq_len),
        ("train.global_batch_size", job.global_batch_size),
        ("train.micro_batch_size", d.micro_batch_size),
        ("mixed_precision", _precision_recipe(job)),
    ]
    if d.cp > 1:
        out.append(("model.cp_comm_type", job.settings.cp_comm_type.value))
        if job.settings.cp_comm_type is CpCommType.A2A_P2P:
            out.append(
                (
                    "model.hierarchical_context_parallel_sizes",
                    [job.settings.cp_a2a_size, d.cp // job.settings.cp_a2a_size],
                )
            )
    notes += _model_notes(inp.model, p)
    out += _pipeline_split(p) + model_fields(inp.model, p) + _recompute(p) + _zero(p, notes) + _job(p, notes)
    out += _framework(p, notes)
    if order == REPLICA_MAJOR:  # Megatron-core's tp-cp-ep-pp-dp order (--use-tp-pp-dp-mapping)
        out.append(("dist.use_tp_pp_dp_mapping", True))
    return out, notes


def _pipeline_split(plan: Plan) -> Items:
    """The split as costed, whatever the recipe set: no embedding/loss accounting (nestplan counts
    transformer layers per stage), first/last stage counts when only they differ, else a layout; the
    layout is given (null where unused) so that run_recipe.py does not rebuild the recipe's own."""
    n = plan.dims.layers_per_stage or ()
    first = last = layout = None
    if len(set(n)) > 1:
        if plan.dims.virtual_stages == 1 and len(set(n[1:-1])) <= 1:
            first, last = n[0], n[-1]
        else:
            layout = megatron.layout(plan)
    return [
        ("model.account_for_embedding_in_pipeline_split", False),
        ("model.account_for_loss_in_pipeline_split", False),
        ("model.num_layers_in_first_pipeline_stage", first),
        ("model.num_layers_in_last_pipeline_stage", last),
        ("model.pipeline_model_parallel_layout", layout),
    ]


def model_fields(m: ModelSpec, plan: Plan) -> Items:
    """Every architecture field of Megatron-Bridge's GPTModelProvider (Megatron-core TransformerConfig
    names) and every stated fact (nemo_model.fact_fields), so that the recipe's model is the one nestplan
    costed."""
    items: Items = [
        ("model.num_layers", m.num_layers),
        ("model.hidden_size", m.hidden_size),
        ("model.ffn_hidden_size", m.ffn_hidden_size),
        ("model.num_attention_heads", m.num_heads),
        ("model.num_query_groups", m.num_kv_heads),
        ("model.kv_channels", m.head_dim),
        ("model.share_embeddings_and_output_weights", m.tied_embeddings),
        ("model.position_embedding_type", position_embedding(m)),
        ("model.normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"),
        ("model.layernorm_zero_centered_gamma", m.family == "nemotron"),  # HF NemotronConfig's LayerNorm1p
        ("model.gated_linear_unit", m.gated_mlp),
        ("model.add_bias_linear", m.linear_bias),
        ("model.add_qkv_bias", m.linear_bias or m.qkv_bias),
        # MLA's qk_layernorm is its query and key/value latents' RMSNorms (DeepSeek's q_a/kv_a_layernorm)
        ("model.qk_layernorm", m.is_mla or m.qk_norm in ("head", "full")),
        ("model.qk_l2_norm", m.qk_norm == "l2"),  # Llama 4's weightless QK-norm
        ("model.mtp_num_layers", m.mtp_layers or None),
        ("model.attention_backend", "flash" if plan.job.settings.flash_attention else "unfused"),
    ]
    if not m.learned_position_embeddings:
        items.append(("model.rotary_percent", rotary_percent(m)))
    if not all(block.rope for block in m.blocks):  # 1: a layer without rotary positions
        items.append(("model.no_rope_freq", [0 if block.rope else 1 for block in m.blocks]))
    if m.attention_sinks:  # a learned logit per head in the softmax (gpt-oss)
        items.append(("model.softmax_type", "learnable"))
    if not m.dropout:
        items += [("model.attention_dropout", 0.0), ("model.hidden_dropout", 0.0)]
    return items + fact_fields(m, plan)[0] + _moe_fields(m, plan)


def _model_notes(m: ModelSpec, plan: Plan) -> list[str]:
    """What the recipe builds otherwise, each note naming its fact (stated_facts)."""
    notes = fact_fields(m, plan)[1]
    if m.qk_norm == "full":
        notes.append(
            f"qk_norm: {m.name} normalises the whole query and key width (OLMo 2); Megatron-core's qk_layernorm "
            "normalises per head (the same FLOPs and memory to nestplan's precision, other weights)"
        )
    if recipe(m) in (GENERIC_RECIPE, GENERIC_MLA_RECIPE):
        notes.append(
            f"Megatron-Bridge 0.6.2 has no recipe of the architecture of {m.name}: {recipe(m)} runs with every "
            "model field and stated fact set to nestplan's model; its tokenizer and data stay the recipe's: set yours"
        )
    seq_len = plan.job.seq_len
    if m.learned_position_embeddings and seq_len != m.max_position_embeddings:
        notes.append(
            f"Megatron-Bridge sizes the learned position table by the sequence length ({seq_len}); "
            f"nestplan costed the model's {m.max_position_embeddings} positions"
        )
    return notes


def _moe_fields(m: ModelSpec, plan: Plan) -> Items:
    if not m.is_moe:
        return [("model.num_moe_experts", None)]
    items: Items = [
        ("model.num_moe_experts", m.num_experts),
        ("model.moe_router_topk", m.experts_per_token),
        ("model.moe_ffn_hidden_size", m.moe_ffn_hidden_size),
        ("model.moe_token_dispatcher_type", megatron.dispatcher(plan.job)),  # as costed
        ("model.moe_grouped_gemm", plan.job.dtype == "bf16"),
        ("model.moe_layer_freq", [1 if m.is_moe_layer(i) else 0 for i in range(m.num_layers)]),
    ]
    shared = m.num_shared_experts * m.shared_expert_ffn_hidden_size  # Megatron-core: one MLP of them all
    return items + [("model.moe_shared_expert_intermediate_size", shared or None)]


def _precision_recipe(job) -> str:
    return f"{job.dtype}_{FP8_RECIPES[job.settings.fp8_recipe]}_mixed" if job.fp8 else f"{job.dtype}_mixed"


def _framework(plan: Plan, notes: list[str]) -> Items:
    """The userbuffer tp overlap (with sequence parallelism, as Megatron needs) and what the
    mixed-precision recipe decides that nestplan may have costed otherwise. The recipe's
    comm_overlap section is dropped: its TP-overlap buffers are sized for the recipe's own tp and
    sequence, and it would overwrite the data-parallel overlap settings below with its own."""
    job, d = plan.job, plan.dims
    if job.settings.fp8_recipe is Fp8Recipe.TENSORWISE:
        notes.append(
            "Megatron-Bridge's current-scaling FP8 recipe keeps the first and last transformer layers in "
            "bf16 (first_last_layers_bf16); nestplan costed every block's GEMMs in FP8"
        )
    if job.settings.fp8_params:
        notes.append(
            "nestplan costed parameters kept and all-gathered in FP8: set fp8_param_gather in your "
            "recipe's mixed_precision"
        )
    overlap = job.settings.tp_comm_overlap and d.sp_active
    if job.settings.tp_comm_overlap and not overlap and d.tp > 1:
        notes.append(
            "tp communication overlap needs sequence parallelism: not set, and nestplan costed the tp "
            "collectives exposed"
        )
    return [("comm_overlap", None), ("model.tp_comm_overlap", overlap)]


def _recompute(plan: Plan) -> Items:
    if plan.dims.recompute is Recompute.FULL:
        return [
            ("model.recompute_granularity", "full"),
            ("model.recompute_method", "uniform"),
            ("model.recompute_num_layers", 1),
            ("model.distribute_saved_activations", saved_activations_distributed(plan.job.settings, plan.dims)),
        ]
    if plan.dims.recompute is Recompute.SELECTIVE:  # nestplan's selective: the core attention (Korthikanti)
        return [
            ("model.recompute_granularity", "selective"),
            ("model.recompute_modules", ["core_attn"]),
            ("model.recompute_method", None),
            ("model.recompute_num_layers", None),
        ]
    return [
        ("model.recompute_granularity", None),
        ("model.recompute_method", None),
        ("model.recompute_num_layers", None),
    ]


def _job(plan: Plan, notes: list[str]) -> Items:
    """Optimizer as costed. The gradients' dtype comes with the mixed-precision recipe (bf16_mixed
    reduces in fp32, fp16_mixed in fp16; it overwrites the ddp section's choice): a note where that is
    not the dtype costed."""
    job = plan.job
    recipe_grads = "fp16" if job.dtype == "fp16" else "fp32"
    if job.settings.grad_dtype != recipe_grads:
        notes.append(
            f"Megatron-Bridge's mixed-precision recipe for {job.dtype} keeps gradients in {recipe_grads}; "
            f"nestplan costed {job.settings.grad_dtype} (set grad_reduce_in_fp32 in your recipe's mixed_precision)"
        )
    return [("optimizer.optimizer", job.optimizer.value)] + _optimizer_state(plan, notes)


def _optimizer_state(plan: Plan, notes: list[str]) -> Items:
    """Megatron-core's precision-aware optimizer as Megatron-LM's export sets it
    (``megatron.optimizer_state_flags``); the moments' dtype is a torch dtype, which an override
    cannot write, so a note asks for it."""
    flags, state_notes = megatron.optimizer_state_flags(plan)
    notes += state_notes
    if not flags:  # not costed: off and fp32 state, whatever the recipe set (DeepSeek-V3's keeps bf16)
        fp32 = ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
        return [("optimizer.use_precision_aware_optimizer", False)] + [(f"optimizer.{k}", "float32") for k in fp32]
    if plan.job.settings.optimizer_state is OptimizerState.BF16:
        notes.append(
            "nestplan costed bf16 Adam moments: set optimizer.exp_avg_dtype and optimizer.exp_avg_sq_dtype "
            "to torch.bfloat16 in your recipe"
        )
    return [("optimizer.use_precision_aware_optimizer", True), ("optimizer.store_param_remainders", True)]


def _zero(plan: Plan, notes: list[str]) -> Items:
    zero, job = int(plan.dims.zero), plan.job
    overlaps: Items = [
        ("ddp.overlap_grad_reduce", job.settings.overlap_grad_reduce),
        ("ddp.overlap_param_gather", job.settings.overlap_param_gather and zero > 0),
    ]
    if zero in (0, 1):
        return [
            ("dist.use_megatron_fsdp", False),
            ("ddp.use_megatron_fsdp", False),
            ("ddp.data_parallel_sharding_strategy", "no_shard"),
            ("ddp.use_distributed_optimizer", zero == 1),
            ("optimizer.use_distributed_optimizer", zero == 1),
        ] + overlaps
    notes.append(f"ZeRO {zero} runs as Megatron-FSDP (checkpoints in its fsdp_dtensor format)")
    strategy = "optim_grads" if zero == 2 else "optim_grads_params"
    return [
        ("dist.use_megatron_fsdp", True),
        ("ddp.use_megatron_fsdp", True),
        ("ddp.data_parallel_sharding_strategy", strategy),
        ("checkpoint.ckpt_format", "fsdp_dtensor"),
        ("ddp.use_distributed_optimizer", True),
        ("optimizer.use_distributed_optimizer", True),
    ] + overlaps


def export(inp: ExportInput) -> Export:
    items, notes = overrides(inp)
    lines = [f"{k}={_value(v)}" for k, v in items]
    notes = [*notes, *stack_notes(inp.plan, Framework.NEMO)]
    text = (
        "#!/usr/bin/env bash\n"
        + sbatch_lines(inp)
        + header(inp, TITLE, PIN, notes)
        + "set -euo pipefail\n"
        + torchrun_prologue(inp, 29500)
        + 'RECIPE_SCRIPT="${RECIPE_SCRIPT:-scripts/training/run_recipe.py}"   # in your Megatron-Bridge checkout\n'
        + f"RECIPE={shell_word(recipe(inp.model))}\n\n"
        + bash_array("OVERRIDES", [shell_word(line) for line in lines], "on top of the recipe, as nestplan costed them")
        + '\n"${TORCHRUN[@]}" "$RECIPE_SCRIPT" --recipe "$RECIPE" --mode pretrain "${OVERRIDES[@]}" "$@"\n'
    )
    return Export(
        NAME,
        (
            ExportFile("launch_megatron_bridge.sh", text, executable=True),
            ExportFile("megatron_bridge_overrides.txt", "\n".join(lines) + "\n"),
        ),
        tuple(notes),
    )
