"""Every exporter declares, for every run setting of the field table (nestplan.settings), whether it sets
the framework's own flag or key, notes what the framework runs instead, or refuses the plan; and each
declaration is checked against the export itself: a setting moved off its default changes the exported
flags (sets), adds a note (notes) or makes the export refuse (refuses). A new setting without a
declaration, or an exporter that drops one silently, fails here."""

from __future__ import annotations

import re
from functools import lru_cache

import pytest

from nestplan import api
from nestplan.errors import ConfigError
from nestplan.export import EXPORTERS, build
from nestplan.export.common import Export, Handling
from nestplan.job import Job
from nestplan.settings import (
    SETTING_NAMES,
    AttentionKernel,
    Framework,
    CpCommType,
    Fp8Recipe,
    MoeDispatcher,
    OptimizerState,
)
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute

# one value off the default per setting (with what it needs: FP8 parameters need a recipe, a2a+p2p a size)
EXAMPLES = {
    "framework": {"framework": Framework.FSDP},
    "attention_kernel": {"attention_kernel": AttentionKernel.FLASH1},
    "grad_dtype": {"grad_dtype": "bf16"},
    "flash_attention": {"flash_attention": False},
    "tp_comm_overlap": {"tp_comm_overlap": True},
    "overlap_grad_reduce": {"overlap_grad_reduce": False},
    "overlap_param_gather": {"overlap_param_gather": False},
    "fp8_recipe": {"fp8_recipe": Fp8Recipe.TENSORWISE},
    "fp8_params": {"fp8_recipe": Fp8Recipe.TENSORWISE, "fp8_params": True},
    "cp_comm_type": {"cp_comm_type": CpCommType.ALLGATHER},
    "cp_a2a_size": {"cp_comm_type": CpCommType.A2A_P2P, "cp_a2a_size": 2},
    "moe_comm_overlap": {"moe_comm_overlap": True},
    "moe_capacity_factor": {"moe_capacity_factor": 1.5},
    "moe_dispatcher": {"moe_dispatcher": MoeDispatcher.DEEPEP},
    "distribute_saved_activations": {"distribute_saved_activations": True},
    "optimizer_state": {"optimizer_state": OptimizerState.BF16},
}
# the plans a setting needs to matter, each framework's first one it exports with default settings
MOE_PLANS = ("mixtral-8x7b", (ParallelDims(tp=2, sp=True, ep=4, zero=1), ParallelDims(ep=8, zero=1)))
CP_PLANS = ("llama3-8b", (ParallelDims(cp=4, dp=2, zero=1), ParallelDims(tp=2, sp=True, cp=4, zero=1)))
DENSE_PLANS = (
    "llama3-8b",
    (
        ParallelDims(tp=2, sp=True, pp=2, dp=2, zero=1),
        ParallelDims(tp=2, sp=True, dp=4, zero=1),
        ParallelDims(dp=8, zero=1),
    ),
)
# the saved inputs split over tp: full recomputation, tp > 1, no sequence parallelism (where Megatron runs it)
FULL_RECOMPUTE_PLANS = ("llama3-8b", (ParallelDims(tp=2, dp=4, zero=1, recompute=Recompute.FULL),))
NUMBER = re.compile(r"[0-9][0-9.,]*")


def _plans_for(setting: str) -> tuple[str, tuple[ParallelDims, ...]]:
    if setting == "distribute_saved_activations":
        return FULL_RECOMPUTE_PLANS
    if setting.startswith("moe_"):
        return MOE_PLANS
    return CP_PLANS if setting.startswith("cp_") else DENSE_PLANS


def _export(model: str, dims: ParallelDims, job: Job, framework: str) -> Export:
    return build(api.evaluate_full(model, "dgx-h100", dims, job, devices=8).plan, framework, "test")


@lru_cache(maxsize=None)
def _base(framework: str, setting: str) -> tuple[str, ParallelDims, Export]:
    model, candidates = _plans_for(setting)
    for dims in candidates:
        try:
            return model, dims, _export(model, dims, Job(64, 4096), framework)
        except ConfigError:
            continue
    raise AssertionError(f"{framework} exports none of the test plans for {setting}")


def _launch_lines(export: Export) -> list[str]:
    """The files' lines that launch the job: comments and quoted predictions left out."""
    return [
        line.strip()
        for f in export.files
        for line in f.text.splitlines()
        if not line.strip().startswith("#") and "predict" not in line.lower()
    ]


def _notes(export: Export) -> set[str]:
    return {NUMBER.sub("#", note) for note in export.notes}  # a prediction's numbers are not a new note


def test_every_exporter_declares_every_setting() -> None:
    assert set(EXAMPLES) == set(SETTING_NAMES), "a new setting needs an example value here"
    for name, exporter in EXPORTERS.items():
        assert set(exporter.SETTINGS) == set(SETTING_NAMES), f"{name} declares {sorted(exporter.SETTINGS)}"
        assert all(support.how for support in exporter.SETTINGS.values())


@pytest.mark.parametrize("framework", sorted(EXPORTERS))
@pytest.mark.parametrize("setting", SETTING_NAMES)
def test_the_export_does_what_it_declares(framework: str, setting: str) -> None:
    declared = EXPORTERS[framework].SETTINGS[setting].handling
    model, dims, plain = _base(framework, setting)
    job = Job(64, 4096).with_settings(**EXAMPLES[setting])
    if declared is Handling.REFUSES:
        with pytest.raises(ConfigError):
            _export(model, dims, job, framework)
        return
    changed = _export(model, dims, job, framework)
    if declared is Handling.SETS:
        assert _launch_lines(changed) != _launch_lines(plain), f"{framework} writes nothing for {setting}"
    else:
        assert _notes(changed) - _notes(plain), f"{framework} notes nothing for {setting}"
