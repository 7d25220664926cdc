"""Sweeps report runs as well as steps: a spec's tokens (or steps) and prices give each case's run, stored
with it, shown in the report's table and results.csv; a spec without them keeps its cases' keys."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from cli_helpers import run_cli

from nestplan import api
from nestplan.sweep.spec import expand, spec_from_dict

SPEC = """
name = "runs"
models = ["llama2-7b"]
devices = [8, 16]
global_batch_size = [64]
seq_len = [1024]
{run}
[[clusters]]
base = "h100-spine-leaf"
"""


def test_a_sweep_reports_each_cases_run(capsys, tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(run="tokens = 1e10\nprice_per_gpu_hour_usd = 2.5"))
    api.sweep(spec, tmp_path / "out", workers=1)
    code, out, _ = run_cli(capsys, ["sweep", "report", str(tmp_path / "out")])
    assert code == 0 and "GPU-hours" in out and "goodput" in out
    with open(tmp_path / "out" / "results.csv") as fh:
        rows = {int(r["devices"]): r for r in csv.DictReader(fh)}
    steps = math.ceil(1e10 / (64 * 1024))
    for row in rows.values():
        compute_days = steps * float(row["step_time_s"]) / 86400
        assert float(row["days"]) == pytest.approx(compute_days / float(row["goodput"]))
        assert float(row["cost_usd"]) == pytest.approx(float(row["gpu_hours"]) * 2.5)
    assert 0 < float(rows[8]["goodput"]) <= 1


def test_a_spec_without_a_run_keeps_its_keys_and_columns() -> None:
    without = spec_from_dict({"models": ["llama2-7b"], "devices": [8], "clusters": [{"base": "dgx-h100"}]})
    with_run = spec_from_dict(
        {"models": ["llama2-7b"], "devices": [8], "clusters": [{"base": "dgx-h100"}], "steps": 100}
    )
    [plain], [run] = expand(without), expand(with_run)
    assert "run" not in plain.inputs() and run.inputs()["run"] == {"steps": 100}
    assert plain.key != run.key


@pytest.mark.parametrize(
    ("run", "named"),
    [
        ("tokens = 1e9\nsteps = 10", "tokens or as steps, not both"),
        ("tokens = -5", "tokens"),
        ("steps = 2.5", "steps"),
        ("price_per_gpu_hour_usd = 2", "prices need the run's length"),
        ("tokens = 1e9\nprice_per_kwh_usd = -1", "price_per_kwh_usd"),
    ],
)
def test_bad_run_keys_are_one_line_and_exit_2(capsys, tmp_path: Path, run: str, named: str) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(run=run))
    code, _, err = run_cli(capsys, ["sweep", str(spec), "--out", str(tmp_path / "out")])
    assert code == 2 and named in err and len(err.strip().splitlines()) == 1
