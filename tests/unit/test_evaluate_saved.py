"""``nestplan evaluate --plan PLAN.json --set KEY=VALUE,...`` (issue 27, item 3): a saved plan evaluated
again with changes, each read as its option or run setting is, unknown keys refused by name; ``--json``
prints the new plan file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_helpers import run_cli

from nestplan import api
from nestplan.job import Job
from nestplan.strategy.dims import ParallelDims

BASE = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--global-batch-size", "128"]
DEGREES = ["--tp", "8", "--sp", "--pp", "4", "--dp", "2", "--zero", "1"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    job = Job(global_batch_size=128, seq_len=8192)
    dims = ParallelDims(tp=8, sp=True, pp=4, dp=2, zero=1)
    path = tmp_path_factory.mktemp("saved") / "plan.json"
    path.write_text(json.dumps(api.evaluate_full("llama3-70b", "dgx-h100", dims, job, devices=64).to_dict()))
    return path


def _json(capsys, argv: list[str]) -> dict:
    code, out, err = run_cli(capsys, argv + ["--json"])
    assert code == 0, err
    return json.loads(out)


def test_changes_give_what_the_flags_give(capsys, saved) -> None:
    changed = _json(
        capsys,
        ["evaluate", "--plan", str(saved), "--set", "tp=4,pp=8,mbs=2,recompute=selective,overlap_grad_reduce=false"],
    )
    flags = ["--tp", "4", "--sp", "--pp", "8", "--dp", "2", "--zero", "1", "--mbs", "2", "--recompute", "selective"]
    direct = _json(capsys, ["evaluate", *BASE, *flags, "--no-overlap-grad-reduce"])
    assert changed["parallel"] == direct["parallel"] and changed["job"] == direct["job"]
    assert changed["prediction"] == direct["prediction"]


def test_no_change_evaluates_the_saved_plan_again(capsys, saved) -> None:
    again = _json(capsys, ["evaluate", "--plan", str(saved)])
    assert again["prediction"] == json.loads(saved.read_text())["prediction"]


def test_a_new_schedule_takes_its_own_chunks(capsys, saved) -> None:
    zbv = _json(capsys, ["evaluate", "--plan", str(saved), "--set", "schedule=zbv"])
    assert (zbv["parallel"]["schedule"], zbv["parallel"]["virtual_stages"]) == ("zbv", 2)
    interleaved = _json(capsys, ["evaluate", "--plan", str(saved), "--set", "virtual_stages=2"])
    assert (interleaved["parallel"]["schedule"], interleaved["parallel"]["virtual_stages"]) == ("interleaved", 2)


def test_the_layers_keep_a_comma_list(capsys, saved) -> None:
    split = _json(capsys, ["evaluate", "--plan", str(saved), "--set", "layers_per_stage=19,21,21,19,zero=0"])
    assert split["parallel"]["layers_per_stage"] == [19, 21, 21, 19] and split["parallel"]["zero_stage"] == 0


@pytest.mark.parametrize(
    "argv,named",
    [
        (["--set", "tpp=4"], "unknown key 'tpp'"),
        (["--set", "tp=x"], "--tp 'x'"),
        (["--set", "tp=4,tp=8"], "'tp' twice"),
        (["--set", "cp_comm_type=ring"], "cp comm type 'ring'"),
        (["--set", "flash_attention=maybe"], "not true or false"),
        (["--set", "moe_capacity_factor=x"], "moe capacity factor"),
        (["--set", "schedule=zb"], "not one of 1f1b"),
        (["--set", "4"], "KEY=VALUE"),
        (["--tp", "4"], "not --tp"),
        (["--framework", "nemo"], "not --framework"),
    ],
)
def test_bad_changes_one_line_exit_2(capsys, saved, argv, named) -> None:
    code, _, err = run_cli(capsys, ["evaluate", "--plan", str(saved), *argv])
    assert code == 2 and len(err.strip().splitlines()) == 1 and named in err


def test_set_needs_a_plan_and_evaluate_needs_a_job(capsys) -> None:
    code, _, err = run_cli(capsys, ["evaluate", "--set", "tp=4"])
    assert code == 2 and "--plan" in err
    code, _, err = run_cli(capsys, ["evaluate", "--model", "llama3-8b", *DEGREES[:2]])
    assert code == 2 and "needs --cluster, --global-batch-size" in err


def test_a_refused_schedules_line_names_the_set_that_predicts_it(capsys, tmp_path) -> None:
    """The export refusal's --set re-evaluates the plan the framework would run, to the millisecond."""
    job = Job(global_batch_size=128, seq_len=8192)
    dims = ParallelDims(
        tp=8, sp=True, pp=4, dp=2, zero=1, schedule="zbv", virtual_stages=2, layers_per_stage=(16, 22, 22, 20)
    )
    path = tmp_path / "zbv.json"
    path.write_text(json.dumps(api.evaluate_full("llama3-70b", "dgx-h100", dims, job, devices=64).to_dict()))
    code, _, err = run_cli(capsys, ["export", str(path), "--framework", "megatron", "--out", str(tmp_path / "o")])
    assert code == 2
    changes = re.search(r"--set (\S+),", err).group(1)
    step = re.search(r"predicts step (\d+\.\d{3}) s", err).group(1)
    again = _json(capsys, ["evaluate", "--plan", str(path), "--set", changes])
    assert f"{again['prediction']['step_time_s']:.3f}" == step and again["parallel"]["schedule"] == "interleaved"
