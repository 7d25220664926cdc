"""A run's floor (cost/run.py run_floor) bounds every plan's run from below, and a device range that skips
the sizes whose floor cannot win chooses what planning every size chooses."""

from __future__ import annotations

import pytest

from nestplan import api
from nestplan.cost.run import RunLength, gemm_flops_per_step, predicted_run, run_floor
from nestplan.search.planner import plan_job
from nestplan.search.sizes import Limits, Objective, objective_value, plan_sizes
from nestplan.search.space import SearchSpace

LENGTH = RunLength(tokens=1e11)


@pytest.mark.parametrize(
    ("model", "cluster", "devices", "fp8"),
    [
        ("llama3-8b", "h100-spine-leaf", 16, False),
        ("llama3-8b", "dgx-h100", 32, True),
        ("mixtral-8x7b", "h100-spine-leaf", 64, False),
        ("deepseek-v2-lite", "gb200-nvl72", 64, False),
    ],
)
def test_the_floor_is_below_the_best_plans_run(model, cluster, devices, fp8) -> None:
    spec, full = api.resolve_model(model), api.resolve_cluster(cluster)
    job = api.job_for(spec, full, 128, 2048, fp8=fp8)
    part = full.truncate(devices)
    result = plan_job(spec, part, job, SearchSpace(), top=3)
    floor = run_floor(gemm_flops_per_step(spec, result.job), result.job, devices, full, LENGTH)
    for pred in (result.best, *result.runners_up):
        run = predicted_run(pred, result.job, full, LENGTH)
        assert floor.step_time_s <= pred.step_time_s
        assert floor.wall_s <= run.wall_s and floor.gpu_hours <= run.gpu_hours
        assert floor.energy_J <= run.energy_J


@pytest.mark.parametrize("objective", list(Objective))
def test_skipping_sizes_that_cannot_win_chooses_as_planning_all(objective) -> None:
    spec, cluster = api.resolve_model("llama3-8b"), api.resolve_cluster("h100-spine-leaf")
    job = api.job_for(spec, cluster, 64, 2048)
    sizes = [8, 16, 32, 64]
    choice = plan_sizes(spec, cluster, job, SearchSpace(), sizes, LENGTH, objective, Limits())
    every = {}
    for n in sizes:
        result = plan_job(spec, cluster.truncate(n), job, SearchSpace())
        every[n] = objective_value(predicted_run(result.best, result.job, cluster, LENGTH), objective)
    assert choice.chosen.devices == min(sizes, key=lambda n: (every[n], n))
    if objective in (Objective.STEP, Objective.TIME):  # the largest size's run rules the smaller out
        assert [row.devices for row in choice.rows if row.run is None] == [8, 16, 32]
    for row in choice.rows:
        if row.run is None:
            assert row.note.startswith("not planned") and every[row.devices] > every[choice.chosen.devices]


def test_sizes_sharing_the_memory_answers_plan_as_each_alone() -> None:
    spec, cluster = api.resolve_model("deepseek-v2-lite"), api.resolve_cluster("dgx-h100")  # dense and MoE blocks
    job = api.job_for(spec, cluster, 128, 2048)
    sizes = [16, 32, 64]
    choice = plan_sizes(spec, cluster, job, SearchSpace(), sizes, LENGTH, Objective.COST, Limits(), top=2)
    for row in choice.rows:
        alone = plan_job(spec, cluster.truncate(row.devices), job, SearchSpace(), top=2)
        shared = (row.result.best, *row.result.runners_up)
        assert [(p.plan, p.step_time_s) for p in shared] == [
            (p.plan, p.step_time_s) for p in (alone.best, *alone.runners_up)
        ]
