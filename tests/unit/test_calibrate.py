"""nestplan calibrate: a factor that made the runs slower is found again from their step times; a file too
small to fit is refused in one line; the profile it writes is what --profile reads."""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest
from cli_helpers import run_cli

from nestplan import api
from nestplan.cluster import load_cluster
from nestplan.model import load_model
from nestplan.profile import Profile, apply_profile, read_profile
from nestplan.settings import Framework
from nestplan.strategy.dims import ParallelDims

# (model, gpus, tp, pp, dp, mbs, global batch, seq): plans whose GEMMs dominate, and one that attention does
PLANS = (
    ("llama3-8b", 8, 1, 1, 8, 1, 64, 4096),
    ("llama3-8b", 16, 2, 1, 8, 1, 64, 8192),
    ("llama3-8b", 16, 1, 2, 8, 1, 128, 2048),
    ("qwen3-8b", 8, 1, 1, 8, 2, 64, 4096),
    ("qwen3-8b", 16, 2, 1, 8, 1, 64, 8192),
    ("qwen3-8b", 8, 2, 1, 4, 1, 32, 16384),
)
SLOWER = Profile("truth", "h100-sxm-80gb", Framework.NEMO, MappingProxyType({"gemm": 0.9}), 0.0, 0.0, 0, 0)


def _row(model: str, gpus: int, tp: int, pp: int, dp: int, mbs: int, batch: int, seq: int) -> dict:
    cluster = apply_profile(load_cluster("dgx-h100", gpus), SLOWER)
    job = api.job_for(load_model(model), cluster, batch, seq, framework="nemo")
    dims = ParallelDims(tp=tp, pp=pp, dp=dp, sp=tp > 1, zero=1, micro_batch_size=mbs)
    step = api.evaluate(model, cluster, dims, job, profile="none").step_time_s
    return {
        "id": f"{model}-{gpus}-tp{tp}-pp{pp}-s{seq}",
        "model": model,
        "cluster": "dgx-h100",
        "framework": "nemo",
        **{"gpus": gpus, "tp": tp, "pp": pp, "vp": 1, "cp": 1, "ep": 1, "dp": dp, "sp": tp > 1},
        **{"recompute": "none", "zero": 1, "mbs": mbs, "global_batch": batch, "seq_len": seq},
        "precision": "bf16",
        "axis_order": "tp,cp,ep,dp,pp",
        "published": {"metric": "step_time_s", "value": step},
    }


@pytest.fixture(scope="module")
def runs_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "runs.json"
    path.write_text(json.dumps({"rows": [_row(*plan) for plan in PLANS]}))
    return path


def test_a_slower_gemm_is_found_again(runs_file) -> None:
    fit = api.calibrate_runs(runs_file)
    factors = {f.factor.name: f for f in fit.fits}
    assert factors["gemm"].informative and factors["gemm"].value == pytest.approx(0.9, abs=0.02)
    assert not factors["fp8_gemm"].informative  # no FP8 row: left at 1
    assert max(abs(e) for e in fit.error_before) > 0.05  # the published figures miss the slower runs
    assert max(abs(e) for e in fit.error_after) < 0.01 and max(abs(e) for e in fit.error_held_out) < 0.02
    assert fit.profile.rows == len(PLANS) and fit.profile.models == 2


def test_calibrate_writes_the_profile_that_profile_reads(runs_file, tmp_path, capsys) -> None:
    out = tmp_path / "ours.toml"
    code, printed, err = run_cli(capsys, ["calibrate", str(runs_file), "--out", str(out)])
    assert code == 0, err
    assert "gemm" in printed and "leave one model out" in printed
    profile = read_profile(out)
    assert profile.accelerator == "h100-sxm-80gb" and profile.framework is Framework.NEMO
    plan = ParallelDims(tp=1, pp=1, dp=8, zero=1)
    job = api.job_for(load_model("llama3-8b"), load_cluster("dgx-h100", 8), 64, 4096, framework="nemo")
    calibrated = api.evaluate("llama3-8b", "dgx-h100", plan, job, profile=str(out)).step_time_s
    published = api.evaluate("llama3-8b", "dgx-h100", plan, job, profile="none").step_time_s
    assert calibrated > published * 1.05


def test_a_file_too_small_is_refused_in_one_line(tmp_path, capsys) -> None:
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"rows": [_row(*PLANS[0]), _row(*PLANS[3])]}))
    code, _, err = run_cli(capsys, ["calibrate", str(small), "--out", str(tmp_path / "p.toml")])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "at least 4 runs" in err
    assert not (tmp_path / "p.toml").exists()
