"""Megatron-Bridge's own code on nestplan's Megatron-Bridge exports (issue 18): the recipe the launch script
names builds its ConfigContainer, the exported overrides go on top through Megatron-Bridge's own Hydra
override parser (``process_config_with_overrides``, what ``run_recipe.py``'s ``apply_cli_overrides`` calls),
then the two synchronisations ``run_recipe.py`` does before it runs (the recipe's pipeline layout rebuilt
after pp/vp overrides unless the layout is overridden too; ``model.seq_length`` reset to
``dataset.seq_length``) and ``runtime_config_update`` (mixed precision, data-parallel size, comm overlap,
``ConfigContainer.validate``: Megatron-core's TransformerConfig and DDP/optimizer checks). The resulting
config must equal the plan.

Megatron-Bridge here is 0.6.2 over megatron-core 0.19.2, the wheels from PyPI. Both declare Python >= 3.12
(megatron-core's wheel is tagged cp312), so they are unpacked, not installed (``pip download --no-deps
--python-version 3.12 --only-binary=:all:`` then unzip, the folder on PYTHONPATH: see .ci/run); their
Python code runs on 3.11 with the stand-ins below. ``run_recipe.py`` is in Megatron-Bridge's repository
(scripts/training), not in its wheel: the two synchronisations it does are restated here from v0.6.0's
``scripts/training/recipe_runner.py``. Without the wheels every test here skips; the key-table test in
test_export.py stays as the fast check.

Stand-ins, for what needs a GPU, a process group, the network or Python 3.12:
- ``typing.override`` (new in Python 3.12, a decorator that only marks a method) is
  ``typing_extensions.override`` where Python lacks it;
- Transformer Engine (not installed: it needs CUDA): while Megatron-Bridge is imported, a module whose
  attributes are empty classes stands in for ``transformer_engine`` (two Megatron-Bridge modules, LoRA
  layers and a TE layer spec, import it unconditionally; nothing of it is called here), with version
  2.17.1 (the one Megatron-Bridge 0.6.2's uv.lock pins); it is taken out of ``sys.modules`` afterwards.
  For a plan costed with Megatron-core's precision-aware optimizer, whose config check imports TE's
  FusedAdam and reads its signature, a module holding a FusedAdam of that signature stands in for one test.
  Where the config checks TE (``is_te_min_version``, ``get_te_version`` in transformer_config.py and
  optimizer_config.py) it answers as TE 2.17.1, and its fused RoPE kernel (``rope_utils.fused_apply_rotary_pos_emb``, whose
  presence the recipes' ``apply_rope_fusion`` needs) and its fused MoE permutations (``moe_utils.fused_permute``
  and the four beside it, which ``moe_permute_fusion`` needs) are a function never called here;
- the recipes' model configs from the Hugging Face hub (``AutoBridge.from_hf_pretrained("meta-llama/...")``,
  no network here) are nestplan's catalog config.json of that model, from a local folder;
- ``megatron.bridge.recipes``' ``__init__`` (which imports every model family's recipes, diffusion
  models included) is not run: its folder is the package, and the recipe modules are imported from it;
- the process group: none is made; ``WORLD_SIZE`` is the plan's device count, as torchrun sets it.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import sys
import types
import typing
from pathlib import Path

import pytest
import typing_extensions
from planned_cases import CASES, planned_plans
from planned_cases import evaluated as _evaluated
from planned_cases import issue_plans as planned_issue_plans

from nestplan import api
from nestplan.catalog import entry_path
from nestplan.errors import ConfigError
from nestplan.export import check_framework, megatron, nemo, nemo_model
from nestplan.export.plan import ExportInput
from nestplan.job import Job
from nestplan.plan import Plan
from nestplan.settings import CpCommType, Fp8Recipe, OptimizerState
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute

if not hasattr(typing, "override"):  # stand-in: Python 3.12's typing.override (see the docstring)
    typing.override = typing_extensions.override

pytest.importorskip(
    "megatron.core", reason="megatron-core 0.19.2 unpacked on PYTHONPATH (and triton) is needed: see .ci/run"
)
if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip("Megatron-Bridge 0.6.2 unpacked on PYTHONPATH is needed: see .ci/run", allow_module_level=True)

# Transformer Engine's fused MoE permutations, whose presence TransformerConfig checks (moe_utils.py)
FUSED_PERMUTATION = (
    "fused_permute",
    "fused_permute_with_probs",
    "fused_sort_chunks_by_index",
    "fused_sort_chunks_by_index_with_probs",
    "fused_unpermute",
)
TE_VERSION = "2.17.1"  # Megatron-Bridge 0.6.2's uv.lock: transformer-engine 2.17.1+4329ff84
BRIDGE_VERSION = "Megatron-Bridge 0.6.2 over megatron-core 0.19.2"
# the Hugging Face ids the recipes nestplan names load (megatron/bridge/recipes/*/h100/*.py) -> nestplan's catalog
HF_MODELS = {
    "meta-llama/Llama-2-7b-hf": "llama2-7b",
    "meta-llama/Meta-Llama-3-8B": "llama3-8b",
    "meta-llama/Meta-Llama-3-70B": "llama3-70b",
    "meta-llama/Meta-Llama-3.1-8B": "llama3.1-8b",
    "meta-llama/Meta-Llama-3.1-70B": "llama3.1-70b",
    "meta-llama/Meta-Llama-3.1-405B": "llama3.1-405b",
    "Qwen/Qwen3-8B": "qwen3-8b",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "Qwen/Qwen3-235B-A22B": "qwen3-235b-a22b",
    "openai/gpt-oss-20b": "gpt-oss-20b",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "deepseek-ai/DeepSeek-V2-Lite": "deepseek-v2-lite",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3",
    "moonshotai/Kimi-K2-Instruct": "kimi-k2",
}
FP8_RECIPE_NAMES = {
    Fp8Recipe.DELAYED: "delayed",
    Fp8Recipe.TENSORWISE: "tensorwise",
    Fp8Recipe.BLOCKWISE: "blockwise",
    Fp8Recipe.MXFP8: "mxfp8",
}


class _Anything(type):
    """A class whose every attribute is another such class: what Transformer Engine's modules look like
    to code that only names them at import time (base classes, annotations)."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(name, (), {})


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(name, (), {})


def _import_bridge() -> types.SimpleNamespace:
    """Megatron-Bridge's modules used here, imported with Transformer Engine stood in (then taken out)."""
    import megatron.core.utils as core_utils

    engine, engine_torch = _StandInModule("transformer_engine"), _StandInModule("transformer_engine.pytorch")
    engine.__version__, engine.pytorch = TE_VERSION, engine_torch
    saved = {name: sys.modules.get(name) for name in (engine.__name__, engine_torch.__name__)}
    sys.modules.update({engine.__name__: engine, engine_torch.__name__: engine_torch})
    try:
        recipes = importlib.util.find_spec("megatron.bridge.recipes")
        package = types.ModuleType("megatron.bridge.recipes")
        package.__path__ = list(recipes.submodule_search_locations)
        sys.modules.setdefault("megatron.bridge.recipes", package)
        from megatron.bridge import AutoBridge
        from megatron.bridge.recipes.deepseek import deepseek_v2, deepseek_v3
        from megatron.bridge.recipes.gpt import gpt3_175b, vanilla_gpt
        from megatron.bridge.recipes.gpt_oss import gpt_oss
        from megatron.bridge.recipes.kimi import kimi_k2
        from megatron.bridge.recipes.llama import llama2, llama3
        from megatron.bridge.recipes.qwen import qwen3, qwen3_moe
        from megatron.bridge.training import config
        from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides
        from megatron.core.models.common.embeddings import rope_utils
        from megatron.core.transformer.moe import moe_utils
        from megatron.core.optimizer import optimizer_config
        from megatron.core.transformer import transformer_config
        from megatron.core.transformer.enums import LayerType
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        core_utils._te_version = None  # cached from the stand-in; asked again below through the monkeypatch
    return types.SimpleNamespace(
        AutoBridge=AutoBridge,
        recipe_modules=(
            llama2,
            llama3,
            vanilla_gpt,
            gpt3_175b,
            qwen3,
            qwen3_moe,
            gpt_oss,
            deepseek_v2,
            deepseek_v3,
            kimi_k2,
        ),
        config=config,
        override=process_config_with_overrides,
        rope_utils=rope_utils,
        moe_utils=moe_utils,
        optimizer_config=optimizer_config,
        transformer_config=transformer_config,
        decoder=LayerType.decoder,
    )


BRIDGE = _import_bridge()


@pytest.fixture
def bridge(monkeypatch, tmp_path_factory) -> types.SimpleNamespace:
    """Megatron-Bridge with the stand-ins of the docstring in place for one test."""
    from packaging.version import Version

    version = Version(TE_VERSION)

    def at_least(v: str, check_equality: bool = True) -> bool:
        return version >= Version(v) if check_equality else version > Version(v)

    monkeypatch.setattr(BRIDGE.transformer_config, "is_te_min_version", at_least)
    monkeypatch.setattr(BRIDGE.transformer_config, "get_te_version", lambda: version)
    monkeypatch.setattr(BRIDGE.rope_utils, "fused_apply_rotary_pos_emb", _fused_rope_stand_in)
    for name in FUSED_PERMUTATION:  # the MoE recipes' moe_permute_fusion checks that TE has them
        monkeypatch.setattr(BRIDGE.moe_utils, name, _fused_rope_stand_in)
    monkeypatch.setattr(BRIDGE.optimizer_config, "is_te_min_version", at_least)
    folders = tmp_path_factory.mktemp("hf")
    original = BRIDGE.AutoBridge.from_hf_pretrained.__func__

    def from_catalog(cls, path, **kwargs):
        folder = folders / HF_MODELS[path]
        folder.mkdir(exist_ok=True)
        config = json.loads(entry_path("model", HF_MODELS[path]).read_text())
        (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if not k.startswith("_")}))
        return original(cls, str(folder), **kwargs)

    monkeypatch.setattr(BRIDGE.AutoBridge, "from_hf_pretrained", classmethod(from_catalog))
    return BRIDGE


def _fused_rope_stand_in(*args, **kwargs):
    raise AssertionError("Transformer Engine's fused kernels are stand-ins: nothing here runs a model")


def _stand_in_fused_adam(monkeypatch) -> None:
    """Transformer Engine's optimizers module, holding the FusedAdam stand-in, importable for one test
    (a plan costed with Megatron-core's precision-aware optimizer, whose config check imports it)."""
    names = ("transformer_engine", "transformer_engine.pytorch", "transformer_engine.pytorch.optimizers")
    modules = [types.ModuleType(name) for name in names]
    modules[0].pytorch, modules[1].optimizers, modules[2].FusedAdam = modules[1], modules[2], _fused_adam_stand_in
    for module in modules:
        monkeypatch.setitem(sys.modules, module.__name__, module)


def _fused_adam_stand_in(
    params,
    master_weight_dtype=None,
    exp_avg_dtype=None,
    exp_avg_sq_dtype=None,
    use_decoupled_grad=False,
    store_param_remainders=False,
):
    """Transformer Engine's FusedAdam, whose signature the precision-aware optimizer's config check reads
    (megatron/core/optimizer/optimizer_config.py); nothing here builds an optimizer."""
    raise AssertionError("Transformer Engine's FusedAdam is a stand-in: nothing here builds an optimizer")


# ---------------------------------------------------------------- what run_recipe.py does with the export
def launch_arguments(plan: Plan, folder: Path) -> tuple[str, list[str]]:
    """The recipe and overrides the exported launch script hands ``run_recipe.py``."""
    export = nemo.export(ExportInput(plan, "test"))
    export.write(folder)
    script = (folder / "launch_megatron_bridge.sh").read_text()
    assert '"$RECIPE_SCRIPT" --recipe "$RECIPE" --mode pretrain "${OVERRIDES[@]}"' in script
    recipe = shlex.split(re.search(r"^RECIPE=(.*)$", script, re.M).group(1))[0]
    overrides = (folder / "megatron_bridge_overrides.txt").read_text().splitlines()
    array = re.search(r"^OVERRIDES=\((.*?)^\)", script, re.M | re.S).group(1)
    assert shlex.split(array, comments=True) == overrides
    return recipe, overrides


def recipe_config(bridge, name: str):
    functions = [getattr(module, name) for module in bridge.recipe_modules if hasattr(module, name)]
    assert len(functions) == 1, name
    return functions[0]()


def run_recipe(bridge, recipe: str, overrides: list[str], world_size: int, monkeypatch):
    """``run_recipe.py --recipe <recipe> --mode pretrain <overrides>`` up to the training loop: the recipe,
    the overrides by Megatron-Bridge's parser, run_recipe.py's pipeline-layout and sequence-length
    synchronisations, then ``runtime_config_update`` as ``pretrain`` runs it."""
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    cfg = bridge.override(recipe_config(bridge, recipe), cli_overrides=overrides)
    _rebuild_recipe_layout(cfg, overrides)
    _reset_sequence_length(cfg)
    for name, value in cfg.env_vars.items():  # what runtime_config_update sets, undone after the test
        monkeypatch.setenv(name, str(value))
    bridge.config.runtime_config_update(cfg)
    return cfg


def _rebuild_recipe_layout(cfg, overrides: list[str]) -> None:
    """run_recipe.py (recipe_runner.sync_model_pipeline_layout): after a pp or vp override the recipe's
    own layout builder, where it has one, lays the pipeline out again, unless the layout is overridden."""
    keys = {item.lstrip("+~").split("=", 1)[0] for item in overrides}
    pipeline = {"model.pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size"}
    builder = getattr(cfg.model, "_pipeline_model_parallel_layout_builder", None)
    if keys & pipeline and "model.pipeline_model_parallel_layout" not in keys and builder is not None:
        cfg.model.pipeline_model_parallel_layout = builder(
            cfg.model.pipeline_model_parallel_size, cfg.model.virtual_pipeline_model_parallel_size
        )


def _reset_sequence_length(cfg) -> None:
    """run_recipe.py (recipe_runner.sync_model_dataset_sequence_length): the dataset owns the sequence
    length; the model's is set to it."""
    cfg.model.seq_length = cfg.dataset.seq_length


# ---------------------------------------------------------------- the config against the plan
def segment_layers(bridge, model) -> list[int]:
    """Transformer layers per virtual pipeline segment in model order (segment v*pp + k: chunk v of rank k),
    as Megatron-core splits them: its parsed layout, else first/last stage counts, else even."""
    pp, vp = model.pipeline_model_parallel_size, model.virtual_pipeline_model_parallel_size or 1
    layout = model.pipeline_model_parallel_layout
    if layout is not None:
        return [layout.layout[k][v].count(bridge.decoder) for v in range(vp) for k in range(pp)]
    first, last = model.num_layers_in_first_pipeline_stage, model.num_layers_in_last_pipeline_stage
    if first is None and last is None:
        return [model.num_layers // (pp * vp)] * (pp * vp)
    middle = (model.num_layers - first - last) // (pp - 2) if pp > 2 else None
    return [first] + [middle] * (pp - 2) + [last]


def assert_config_is_the_plan(bridge, cfg, plan: Plan) -> None:
    """The parsed config equals the plan as costed (an export runs the costed schedule or refuses:
    test_export_schedules.py), each stage keeping its costed layers."""
    d, job, m, model = plan.dims, plan.job, plan.model, cfg.model
    degrees = (
        model.tensor_model_parallel_size,
        model.pipeline_model_parallel_size,
        model.virtual_pipeline_model_parallel_size or 1,
        model.context_parallel_size,
        model.expert_model_parallel_size,
        model.sequence_parallel,
        cfg.data_parallel_size,
    )
    assert degrees == (d.tp, d.pp, d.virtual_stages, d.cp, d.expert_parallel, d.sp_active, d.dp * d.ep)
    assert d.stage_layers(m.num_layers) == plan.dims.stage_layers(m.num_layers)  # each stage's costed layers
    if m.is_moe:
        assert model.expert_tensor_parallel_size == d.expert_tp
    assert (cfg.train.micro_batch_size, cfg.train.global_batch_size) == (d.micro_batch_size, job.global_batch_size)
    assert job.global_batch_size % (d.micro_batch_size * cfg.data_parallel_size) == 0
    assert (model.seq_length, cfg.dataset.seq_length) == (job.seq_len, job.seq_len)
    assert segment_layers(bridge, model) == list(d.virtual_stage_layers(m.num_layers))
    assert not model.account_for_embedding_in_pipeline_split and not model.account_for_loss_in_pipeline_split
    architecture = (
        model.num_layers,
        model.hidden_size,
        model.ffn_hidden_size,
        model.num_attention_heads,
        model.num_query_groups,
        model.kv_channels,
        model.gated_linear_unit,
    )
    assert architecture == (
        m.num_layers,
        m.hidden_size,
        m.ffn_hidden_size,
        m.num_heads,
        m.num_kv_heads,
        m.head_dim,
        m.gated_mlp,
    )
    assert (model.vocab_size, model.share_embeddings_and_output_weights, model.add_bias_linear) == (
        nemo_model.padded_vocab(m, d.tp),  # the model's own, padded only where tp does not divide it
        m.tied_embeddings,
        m.linear_bias,
    )
    assert model.normalization == ("RMSNorm" if m.norm == "rmsnorm" else "LayerNorm")
    assert model.position_embedding_type == ("learned_absolute" if m.learned_position_embeddings else "rope")
    _assert_recompute(model, d.recompute)
    assert (model.bf16, model.fp16) == (job.dtype == "bf16", job.dtype == "fp16")
    if job.fp8:
        assert model.fp8 is not None and model.fp8_recipe == FP8_RECIPE_NAMES[job.settings.fp8_recipe]
    else:
        assert model.fp8 is None
    zero = int(d.zero)
    assert cfg.ddp.use_distributed_optimizer == cfg.optimizer.use_distributed_optimizer == (zero > 0)
    assert cfg.ddp.use_megatron_fsdp == cfg.dist.use_megatron_fsdp == (zero > 1)
    if zero > 1:
        assert cfg.checkpoint.ckpt_format == "fsdp_dtensor"
    assert cfg.ddp.data_parallel_sharding_strategy == {2: "optim_grads", 3: "optim_grads_params"}.get(zero, "no_shard")
    assert cfg.ddp.overlap_grad_reduce == job.settings.overlap_grad_reduce
    assert cfg.ddp.overlap_param_gather == (job.settings.overlap_param_gather and zero > 0)
    assert model.tp_comm_overlap == (job.settings.tp_comm_overlap and d.sp_active)
    aware = job.settings.optimizer_state is not OptimizerState.FP32 and zero > 0
    assert cfg.optimizer.use_precision_aware_optimizer == aware
    assert cfg.optimizer.store_param_remainders or not aware
    if m.is_moe:
        assert (model.num_moe_experts, model.moe_router_topk, model.moe_ffn_hidden_size) == (
            m.num_experts,
            m.experts_per_token,
            m.moe_ffn_hidden_size,
        )
        assert model.moe_token_dispatcher_type == "alltoall"
    else:
        assert model.num_moe_experts is None
    if d.cp > 1:
        assert model.cp_comm_type == job.settings.cp_comm_type.value
        if job.settings.cp_comm_type is CpCommType.A2A_P2P:
            assert list(model.hierarchical_context_parallel_sizes) == [
                job.settings.cp_a2a_size,
                d.cp // job.settings.cp_a2a_size,
            ]


def _assert_recompute(model, recompute: Recompute) -> None:
    if recompute is Recompute.FULL:
        assert (model.recompute_granularity, model.recompute_method, model.recompute_num_layers) == (
            "full",
            "uniform",
            1,
        )
    elif recompute is Recompute.SELECTIVE:
        assert model.recompute_granularity == "selective" and model.recompute_modules == ["core_attn"]
    else:
        assert model.recompute_granularity is None


def check_export(bridge, plan: Plan, folder: Path, monkeypatch) -> None:
    recipe, overrides = launch_arguments(plan, folder)
    assert recipe == nemo.recipe(plan.model)
    if plan.job.settings.optimizer_state is not OptimizerState.FP32:
        _stand_in_fused_adam(monkeypatch)
    cfg = run_recipe(bridge, recipe, overrides, plan.cluster.devices, monkeypatch)
    assert_config_is_the_plan(bridge, cfg, plan)


# ---------------------------------------------------------------- the issue's three plans
@pytest.fixture(scope="module")
def issue_plans() -> dict[str, Plan]:
    """The issue's three plans (planned_cases.issue_plans)."""
    return planned_issue_plans()


@pytest.mark.parametrize("name", ["llama3-70b-256", "mixtral-8x7b-128", "llama3.1-405b-2048"])
def test_megatron_bridge_runs_the_issue_plans_as_costed(bridge, issue_plans, name, tmp_path, monkeypatch) -> None:
    check_export(bridge, issue_plans[name], tmp_path, monkeypatch)


def test_the_recipes_named_are_the_models_own_or_the_generic_gpt(issue_plans) -> None:
    assert nemo.recipe(issue_plans["llama3-70b-256"].model) == "llama3_70b_pretrain_config"
    assert nemo.recipe(issue_plans["llama3.1-405b-2048"].model) == "llama31_405b_pretrain_config"
    assert nemo.recipe(issue_plans["mixtral-8x7b-128"].model) == "vanilla_gpt_pretrain_config"


def _without(overrides: list[str], key: str) -> list[str]:
    kept = [item for item in overrides if not item.startswith(key + "=")]
    assert len(kept) == len(overrides) - 1, key
    return kept


def test_regression_the_recipes_virtual_pipeline_size_left_alone_is_refused(
    bridge, issue_plans, tmp_path, monkeypatch
) -> None:
    """The issue: Llama 3 70B's recipe sets a virtual pipeline size of 5; an export that leaves it alone
    fails Megatron-core's check on the plan's uneven first stage (19 layers)."""
    plan = issue_plans["llama3-70b-256"]
    recipe, overrides = launch_arguments(plan, tmp_path)
    assert recipe_config(bridge, recipe).model.virtual_pipeline_model_parallel_size == 5
    assert "model.virtual_pipeline_model_parallel_size=null" in overrides
    with pytest.raises(ValueError, match="virtual pipeline"):
        run_recipe(
            bridge,
            recipe,
            _without(overrides, "model.virtual_pipeline_model_parallel_size"),
            plan.cluster.devices,
            monkeypatch,
        )


def test_regression_the_dataset_sequence_length_is_the_plans(bridge, issue_plans, tmp_path, monkeypatch) -> None:
    """The issue: run_recipe.py sets the model's sequence length to the dataset's, and Llama 3.1 405B's
    recipe reads 131,072-token samples; without the dataset override the run would train at that length."""
    plan = issue_plans["llama3.1-405b-2048"]
    recipe, overrides = launch_arguments(plan, tmp_path)
    monkeypatch.setenv("WORLD_SIZE", str(plan.cluster.devices))
    cfg = BRIDGE.override(recipe_config(bridge, recipe), cli_overrides=_without(overrides, "dataset.seq_length"))
    _reset_sequence_length(cfg)
    assert cfg.model.seq_length == 131072 != plan.job.seq_len
    assert run_recipe(bridge, recipe, overrides, plan.cluster.devices, monkeypatch).model.seq_length == plan.job.seq_len


@pytest.mark.parametrize(
    "settings",
    [
        {"tp_comm_overlap": True},
        {"cp_comm_type": "a2a+p2p", "cp_a2a_size": 2},
        {"cp_comm_type": "allgather"},
        {"fp8_recipe": Fp8Recipe.TENSORWISE},
        {"fp8_recipe": Fp8Recipe.MXFP8},
        {"fp8_recipe": Fp8Recipe.BLOCKWISE},
        {"dtype": "fp16", "grad_dtype": "fp16"},
        {"overlap_grad_reduce": False, "overlap_param_gather": False},
    ],
    ids=lambda settings: ",".join(f"{k}={getattr(v, 'value', v)}" for k, v in settings.items()),
)
def test_job_settings_reach_the_config(bridge, settings, tmp_path, monkeypatch) -> None:
    """The job's overlap, cp exchange and precision as Megatron-Bridge parses them (Llama 3 70B's recipe,
    whose own comm_overlap section turns tp overlap on for its tp 4)."""
    job = Job.from_flat(512, 16384, **settings)
    cluster = "dgx-b200" if settings.get("fp8_recipe") is Fp8Recipe.MXFP8 else "dgx-h100"  # MXFP8: Blackwell
    plan = api.evaluate_full(
        "llama3-70b", cluster, ParallelDims(tp=4, sp=True, cp=4, pp=4, dp=2, zero=1), job, devices=128
    ).plan
    check_export(bridge, plan, tmp_path, monkeypatch)


def test_the_replica_major_order_is_megatrons_tp_pp_dp_mapping(bridge, tmp_path, monkeypatch) -> None:
    """A plan costed with data parallelism outermost runs with Megatron-core's tp-cp-ep-pp-dp order."""
    job = Job(global_batch_size=512, seq_len=4096)
    plan = api.evaluate_full(
        "llama2-7b",
        "dgx-a100",
        ParallelDims(tp=2, pp=4, dp=8),
        job,
        devices=64,
        axis_order=("tp", "cp", "ep", "pp", "dp"),
    ).plan
    recipe, overrides = launch_arguments(plan, tmp_path)
    assert recipe == "llama2_7b_pretrain_config"
    cfg = run_recipe(bridge, recipe, overrides, plan.cluster.devices, monkeypatch)
    assert cfg.dist.use_tp_pp_dp_mapping
    assert_config_is_the_plan(bridge, cfg, plan)


def test_what_a_refused_v_plan_would_run_is_a_plan_the_bridge_runs(bridge, tmp_path, monkeypatch) -> None:
    """Megatron-core (under Megatron-Bridge) has no DualPipeV: the export refuses such a plan and names
    interleaved 1F1B with two chunks per stage, each stage keeping its costed uneven layers. That plan,
    evaluated and exported, runs through a layout the recipe accepts."""
    dims = ParallelDims(
        tp=8, sp=True, pp=4, dp=4, zero=1, schedule="dualpipev", virtual_stages=2, layers_per_stage=(16, 22, 22, 20)
    )
    refused = _evaluated("llama3-70b", "dgx-h100", 128, dims, 512, 4096)
    plan = _evaluated("llama3-70b", "dgx-h100", 128, megatron.runs_instead(refused), 512, 4096)
    _, overrides = launch_arguments(plan, tmp_path)
    assert any(item.startswith("model.pipeline_model_parallel_layout=") and "null" not in item for item in overrides)
    check_export(bridge, plan, tmp_path / "again", monkeypatch)


def test_nemo_is_an_alias_of_megatron_bridge(issue_plans, tmp_path) -> None:
    assert check_framework("nemo") == check_framework("Megatron-Bridge") == "megatron-bridge"
    files, _ = api.export_plan(issue_plans["llama3-70b-256"], "nemo", tmp_path)
    assert sorted(p.name for p in files) == ["launch_megatron_bridge.sh", "megatron_bridge_overrides.txt"]


def test_an_encoder_is_refused(bridge) -> None:
    job = Job(global_batch_size=256, seq_len=512)
    plan = api.evaluate_full("bert-large", "dgx-a100", ParallelDims(tp=1, dp=16), job, devices=16).plan
    with pytest.raises(ConfigError, match="no encoder"):
        nemo.export(ExportInput(plan, "test"))


# ---------------------------------------------------------------- every planned case
@pytest.mark.slow
@pytest.mark.parametrize("case", [c.name for c in CASES])
def test_megatron_bridge_runs_every_planned_case_as_costed(bridge, case, tmp_path, monkeypatch) -> None:
    plan = planned_plans("megatron-bridge")[case]
    if not plan.model.causal:
        with pytest.raises(ConfigError, match="no encoder"):
            nemo.export(ExportInput(plan, "test"))
        return
    check_export(bridge, plan, tmp_path, monkeypatch)
