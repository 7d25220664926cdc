"""``plan --export F`` searches only what F runs (issue 27): DeepSpeed's Ulysses context parallelism beside
neither AutoTP nor a pipeline, its pipeline engine with ZeRO 0 and 1 only; the issue's 256-H100 Llama 3 70B
job at 8k tokens plans a plan the DeepSpeed export writes."""

from __future__ import annotations

import pytest

from nestplan import api
from nestplan.errors import PlannerError
from nestplan.export import build, deepspeed
from nestplan.job import Job
from nestplan.model.config import load_model
from nestplan.search.space import SearchSpace, deepest_pipeline
from nestplan.strategy.enums import ZeroStage
from nestplan.strategy.subgraph import SubGraph


def test_deepspeeds_space_keeps_ulysses_alone_and_its_pipeline_to_zero_1() -> None:
    space = api.search_space(export="deepspeed", model=load_model("llama3-70b"))
    assert space.cp_alone and space.pipeline_zero == (ZeroStage.NONE, ZeroStage.OPTIMIZER)
    ulysses = SubGraph(1, False, 4, 1, None, 1, "none")
    plain = SubGraph(4, True, 1, 1, None, 1, "none")
    assert deepest_pipeline(space, ulysses, ZeroStage.OPTIMIZER, 80) == 1
    assert deepest_pipeline(space, plain, ZeroStage.GRADIENTS, 80) == 1
    assert deepest_pipeline(space, plain, ZeroStage.OPTIMIZER, 80) == 80
    assert deepest_pipeline(SearchSpace(), ulysses, ZeroStage.PARAMETERS, 80) == 80  # other frameworks: any


@pytest.mark.parametrize("export", ["megatron", "megatron-bridge", "torchtitan"])
def test_other_frameworks_keep_the_whole_layout_space(export) -> None:
    space = api.search_space(export=export, model=load_model("llama3-70b"))
    assert not space.cp_alone and space.pipeline_zero is None


def test_the_issues_deepspeed_job_plans_what_deepspeed_runs() -> None:
    """Llama 3 70B, 8,192 tokens, batch 512 on 256 H100s (the issue's case: cp 4 with pp 4 was picked and
    its export refused): the plan found is one the export accepts, and so is every runner-up."""
    model = load_model("llama3-70b")
    space = api.search_space(export="deepspeed", model=model)
    result = api.plan(model, "dgx-h100", Job(global_batch_size=512, seq_len=8192), devices=256, top=5, space=space)
    for d in (result.plan.dims, *(runner_up.plan for runner_up in result.runners_up)):
        assert not (d.cp > 1 and (d.pp > 1 or d.tp > 1)) and not (d.pp > 1 and int(d.zero) >= 2)
    files = {f.name for f in build(result.plan, deepspeed.NAME, "test").files}
    assert files >= {"ds_config.json", "launch_deepspeed.sh"}


CASES = [
    ("llama3-8b", "dgx-a100", 16, 128, 32768),
    ("mixtral-8x7b", "dgx-h100", 64, 256, 4096),
    ("gpt-oss-20b", "dgx-h100", 16, 128, 8192),
    ("nemotron-h-8b", "dgx-h100", 16, 256, 8192),
]


@pytest.mark.slow
@pytest.mark.parametrize("export", ["megatron", "megatron-bridge", "torchtitan", "deepspeed"])
@pytest.mark.parametrize(("model", "cluster", "devices", "batch", "seq"), CASES)
def test_plan_for_an_export_is_one_the_export_writes(export, model, cluster, devices, batch, seq) -> None:
    """Whatever ``plan --export F`` picks, F's export writes (a model F cannot build is refused before)."""
    spec = load_model(model)
    try:
        api.check_exportable(spec, export)
    except PlannerError as refused:
        pytest.skip(f"{export} builds no {model}: {refused}")
    space = api.search_space(export=export, model=spec)
    result = api.plan(spec, cluster, Job(global_batch_size=batch, seq_len=seq), devices=devices, top=0, space=space)
    assert build(result.plan, export, "test").files


def test_a_schedule_the_framework_does_not_run_is_said_with_the_way_out() -> None:
    """Megatron-LM's plain search keeps every schedule nestplan costs; a zero-bubble plan says Megatron-LM
    does not run it and how to plan for what it runs; a 1F1B plan says nothing."""
    from dataclasses import replace

    from nestplan.export import exports_running, schedule_caveat
    from nestplan.strategy.dims import ParallelDims
    from nestplan.strategy.enums import Schedule

    dims = ParallelDims(tp=8, pp=2, dp=1, zero=1, schedule=Schedule.ZB_H1)
    plan = api.evaluate_full("llama3-8b", "dgx-h100", dims, Job(global_batch_size=64, seq_len=4096), devices=16).plan
    assert "megatron" not in exports_running(Schedule.ZB_H1) and "megatron" in exports_running(Schedule.INTERLEAVED)
    caveat = schedule_caveat(plan)
    assert "does not run the zb-h1 schedule" in caveat and "--export megatron" in caveat
    one_f_one_b = api.evaluate_full(
        "llama3-8b",
        "dgx-h100",
        replace(dims, schedule=Schedule.ONE_F_ONE_B),
        Job(global_batch_size=64, seq_len=4096),
        devices=16,
    ).plan
    assert schedule_caveat(one_f_one_b) == ""
