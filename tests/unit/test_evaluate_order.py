"""``evaluate`` without --axis-order lays ranks out as the job's framework does (issue 27, item 3):
Megatron-LM's and NeMo's tp-cp-ep-dp-pp, each exporter's own default for its framework, nestplan's own
for plain FSDP, which has no export; the Python API the same."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run_cli

from nestplan import api
from nestplan.api.resolve import FRAMEWORK_EXPORTS
from nestplan.export import default_order, framework_orders
from nestplan.job import Job
from nestplan.settings import Framework, RunSettings
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.placement import DEFAULT_AXIS_ORDER, STAGE_MAJOR

ARGS = ["evaluate", "--model", "llama2-7b", "--cluster", "h100-spine-leaf", "--devices", "64", "--tp", "2"]
ARGS += ["--pp", "4", "--dp", "8", "--global-batch-size", "256", "--seq-len", "4096", "--json"]


def _evaluated(capsys, extra: list[str]) -> dict:
    code, out, _ = run_cli(capsys, ARGS + extra)
    assert code == 0
    return json.loads(out)


@pytest.mark.parametrize("framework", ["megatron", "nemo", "torchtitan", "deepspeed"])
def test_the_default_is_the_frameworks_order(capsys, framework) -> None:
    given = _evaluated(capsys, ["--framework", framework, "--axis-order", "tp,cp,ep,dp,pp"])
    default = _evaluated(capsys, ["--framework", framework])
    assert tuple(default["placement"]["axis_order"]) == STAGE_MAJOR
    assert default["prediction"] == given["prediction"]


def test_plain_fsdp_keeps_nestplans_own_order(capsys) -> None:
    assert tuple(_evaluated(capsys, ["--framework", "fsdp"])["placement"]["axis_order"]) == DEFAULT_AXIS_ORDER


def test_an_order_given_is_kept(capsys) -> None:
    given = _evaluated(capsys, ["--axis-order", "tp,cp,ep,pp,dp"])
    assert tuple(given["placement"]["axis_order"]) == ("tp", "cp", "ep", "pp", "dp")


def test_the_order_matters_here_so_the_default_is_tested() -> None:
    """On this spine-leaf cluster the two orders put dp and pp groups on different switches."""
    job = Job(global_batch_size=256, seq_len=4096)
    dims = ParallelDims(tp=2, pp=4, dp=8)
    ours = api.evaluate("llama2-7b", "h100-spine-leaf", dims, job, axis_order=DEFAULT_AXIS_ORDER)
    theirs = api.evaluate("llama2-7b", "h100-spine-leaf", dims, job)
    assert ours.step_time_s != theirs.step_time_s


@pytest.mark.parametrize("framework", list(Framework))
def test_the_api_default_is_the_first_order_the_export_runs(framework) -> None:
    job = Job(global_batch_size=256, seq_len=4096, settings=RunSettings(framework=framework))
    plan = api.evaluate_full("llama2-7b", "h100-spine-leaf", ParallelDims(tp=2, pp=4, dp=8), job, devices=64).plan
    expected = api.framework_order(framework)
    assert plan.axis_order == expected
    export = FRAMEWORK_EXPORTS.get(framework)
    if export is not None:
        assert expected == default_order(export) == framework_orders(export, plan)[0]
