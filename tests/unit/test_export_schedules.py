"""Schedules a framework cannot run (issue 16's decision, issue 27): an export runs what was costed or
refuses in one line that names the schedule the framework would run and nestplan's prediction of that
plan; ``plan --export F`` never picks a schedule F does not run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from dataclasses import replace

import pytest
from cli_helpers import run_cli

from nestplan import api
from nestplan.cost.evaluator import evaluate_plan
from nestplan.errors import ConfigError
from nestplan.export import FRAMEWORKS, framework_schedules, megatron
from nestplan.job import Job
from nestplan.plan import Plan
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Schedule

JOB = Job(global_batch_size=512, seq_len=4096)
V_SPLIT = (16, 22, 22, 20)  # Llama 3 70B's 80 layers over 4 stages, unevenly
PLANS = {
    Schedule.ZB_H1: ParallelDims(tp=8, sp=True, pp=4, dp=4, zero=1, schedule="zb-h1"),
    Schedule.ZBV: ParallelDims(
        tp=8, sp=True, pp=4, dp=4, zero=1, schedule="zbv", virtual_stages=2, layers_per_stage=V_SPLIT
    ),
    Schedule.DUALPIPEV: ParallelDims(
        tp=8, sp=True, pp=4, dp=4, zero=1, schedule="dualpipev", virtual_stages=2, layers_per_stage=V_SPLIT
    ),
    Schedule.GPIPE: ParallelDims(tp=8, sp=True, pp=4, dp=4, zero=1, schedule="gpipe"),
    Schedule.INTERLEAVED: ParallelDims(tp=8, sp=True, pp=4, dp=4, zero=1, schedule="interleaved", virtual_stages=2),
}
# what each framework would run instead: Megatron-core 1F1B with the plan's chunks per stage, DeepSpeed's
# pipeline engine 1F1B on one chunk, torchtitan 1F1B for the single-chunk ZB-H1; each stage keeps its layers
RUNS_INSTEAD = {
    "megatron": lambda plan: megatron.runs_instead(plan),
    "megatron-bridge": lambda plan: megatron.runs_instead(plan),
    "deepspeed": lambda plan: replace(
        plan.dims,
        schedule=Schedule.ONE_F_ONE_B,
        virtual_stages=1,
        layers_per_stage=plan.dims.stage_layers(plan.model.num_layers),
    ),
    "torchtitan": lambda plan: replace(plan.dims, schedule=Schedule.ONE_F_ONE_B),
}
REFUSED = [(f, s) for f in FRAMEWORKS for s in PLANS if s not in framework_schedules(f)]


@pytest.fixture(scope="module")
def plans() -> dict[Schedule, Plan]:
    return {s: api.evaluate_full("llama3-70b", "dgx-h100", d, JOB, devices=128).plan for s, d in PLANS.items()}


def test_every_framework_refuses_some_schedule_and_the_zero_bubble_ones_are_among_them() -> None:
    refused = {f: {s for g, s in REFUSED if g == f} for f in FRAMEWORKS}
    for framework in ("megatron", "megatron-bridge", "deepspeed"):
        assert {Schedule.ZB_H1, Schedule.ZBV, Schedule.DUALPIPEV} <= refused[framework]
    assert refused["torchtitan"] == {Schedule.ZB_H1}


@pytest.mark.parametrize("framework,schedule", REFUSED)
def test_refusal_names_what_runs_instead_and_its_prediction(plans, framework, schedule, tmp_path) -> None:
    plan = plans[schedule]
    runs = RUNS_INSTEAD[framework](plan)
    other = evaluate_plan(plan.model, plan.cluster, runs, plan.job, plan.axis_order)
    with pytest.raises(ConfigError) as caught:
        api.export_plan(plan, framework, tmp_path / "out")
    text = str(caught.value)
    assert f"no {schedule.value} schedule and would run {runs.schedule.value}" in text
    assert f"predicts step {other.step_time_s:.3f} s" in text
    assert f"plan's is {plan.predicted.step_time_s:.3f} s" in text and "\n" not in text
    assert caught.value.field == "schedule" and caught.value.value == schedule.value
    assert not (tmp_path / "out").exists()


def test_the_cli_refuses_in_one_line_exit_2_and_writes_nothing(capsys, plans, tmp_path) -> None:
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(plans[Schedule.ZBV].to_dict()))
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, ["export", str(saved), "--framework", "megatron", "--out", str(out)])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert re.search(r"would run interleaved with 2 chunks per stage .* predicts step \d+\.\d{3} s", err)
    assert not out.exists()


def test_the_replacement_keeps_the_degrees_and_each_stages_layers(plans) -> None:
    plan = plans[Schedule.DUALPIPEV]
    runs = megatron.runs_instead(plan)
    assert (runs.tp, runs.pp, runs.dp, runs.zero, runs.virtual_stages) == (8, 4, 4, 1, 2)
    assert runs.schedule is Schedule.INTERLEAVED and runs.stage_layers(80) == V_SPLIT


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_plan_export_searches_only_what_the_framework_runs(framework) -> None:
    space = api.search_space(model=api.resolve_model("llama3-70b"), export=framework)
    assert set(space.schedules) <= set(framework_schedules(framework))


def test_plan_export_megatron_picks_a_schedule_megatron_runs(capsys, tmp_path) -> None:
    """Llama 3 70B on 64 H100: the planner's best is a ZB-H1 plan, which the Megatron-LM export refuses;
    planned with --export megatron it is one Megatron-LM runs, and exported."""
    args = ["plan", "--model", "llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--global-batch-size", "128"]
    code, out, _ = run_cli(capsys, args + ["--top", "0", "--json"])
    assert code == 0 and json.loads(out)["parallel"]["schedule"] == "zb-h1"
    saved = tmp_path / "plan.json"
    saved.write_text(out)
    code, _, err = run_cli(capsys, ["export", str(saved), "--framework", "megatron", "--out", str(tmp_path / "a")])
    assert code == 2 and "no zb-h1 schedule and would run 1f1b" in err
    code, out, _ = run_cli(
        capsys, args + ["--top", "0", "--export", "megatron", "--out", str(tmp_path / "b"), "--json"]
    )
    assert code == 0 and (tmp_path / "b" / "launch_megatron.sh").exists()
    assert json.loads(out)["parallel"]["schedule"] in {s.value for s in framework_schedules("megatron")}


def test_the_workflow_table_says_which_framework_runs_which_schedule() -> None:
    """docs/workflow.md's schedule table agrees with each exporter's COSTED_SCHEDULES."""
    text = (Path(__file__).parents[2] / "docs" / "workflow.md").read_text()
    columns = ("megatron", "megatron-bridge", "torchtitan", "deepspeed")
    for schedule in Schedule:
        row = re.search(rf"^\| `{re.escape(schedule.value)}` \|(.*)\|$", text, re.MULTILINE)
        assert row is not None, schedule
        cells = [cell.strip() for cell in row.group(1).split("|")]
        for framework, cell in zip(columns, cells, strict=True):
            assert cell.startswith("runs") == (schedule in framework_schedules(framework)), (schedule, framework)
