"""The planner's memory margin: plans leave a fraction of device memory free; evaluate judges fit
against the whole device and reports the headroom."""

from __future__ import annotations

import pytest

from nestplan import api
from nestplan.errors import ConfigError, InfeasibleError
from nestplan.job import Job
from nestplan.search.space import DEFAULT_MEMORY_MARGIN, SearchSpace

JOB = Job(global_batch_size=128, seq_len=8192)


def _peak(report) -> float:
    return report.best.peak_memory_bytes_per_device


def test_plans_leave_the_margin_free() -> None:
    hbm = 80 * 2**30
    for margin in (0.0, DEFAULT_MEMORY_MARGIN, 0.2):
        report = api.plan("llama3-70b", "dgx-h100", JOB, devices=64, top=3, space=SearchSpace(memory_margin=margin))
        for pred in (report.best, *report.runners_up):
            assert pred.peak_memory_bytes_per_device <= hbm * (1 - margin)
    # a job whose fastest plan needs more than 80% of the device, so that a 20% margin binds
    large = Job(global_batch_size=256, seq_len=8192)
    tight = api.plan("llama3-70b", "dgx-h100", large, devices=64, top=0, space=SearchSpace(memory_margin=0.0))
    loose = api.plan("llama3-70b", "dgx-h100", large, devices=64, top=0, space=SearchSpace(memory_margin=0.2))
    assert loose.best.step_time_s >= tight.best.step_time_s
    assert _peak(loose) <= 0.8 * hbm < _peak(tight)


def test_a_margin_that_leaves_too_little_is_infeasible_and_says_so() -> None:
    with pytest.raises(InfeasibleError) as err:
        api.plan("llama3-70b", "dgx-h100", JOB, devices=8, top=0, space=SearchSpace(memory_margin=0.45))
    assert "45% margin kept free of 80.00 GiB" in str(err.value)


@pytest.mark.parametrize("bad", [-0.1, 0.5, 1.0, True, "0.1"])
def test_margin_out_of_range_is_refused(bad) -> None:
    with pytest.raises(ConfigError) as err:
        SearchSpace(memory_margin=bad)
    assert err.value.field == "memory_margin"


def test_cli_memory_margin(capsys) -> None:
    from cli_helpers import run_cli

    args = [
        "plan",
        "--model",
        "llama3-70b",
        "--cluster",
        "dgx-h100",
        "--devices",
        "64",
        "--global-batch-size",
        "128",
        "--top",
        "0",
    ]
    code, out, _ = run_cli(capsys, args + ["--memory-margin", "0.2"])
    assert code == 0 and "headroom" in out
    headroom = float(out.split("headroom")[0].rsplit(",", 1)[1].strip().rstrip("%"))
    assert headroom >= 20.0 - 1e-9
    code, _, err = run_cli(capsys, args + ["--memory-margin", "lots"])
    assert code == 2 and "--memory-margin must be a number" in err
    code, _, err = run_cli(capsys, args + ["--memory-margin", "0.9"])
    assert code == 2 and "memory margin must be a fraction" in err
