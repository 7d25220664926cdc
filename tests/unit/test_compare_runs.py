"""compare --tokens/--steps: every row with a plan has its run (days, GPU-hours, MWh, cost, goodput), in the
table and the CSV; without them the rows have none."""

from __future__ import annotations

import csv
import math

import pytest
from cli_helpers import run_cli

from nestplan import api
from nestplan.cost.run import RunLength

COMPARE = ["compare", "--model", "llama3-8b", "--cluster", "h100-spine-leaf", "--devices", "16", "--baselines"]
COMPARE += ["manual", "--global-batch-size", "64", "--seq-len", "2048"]


def test_each_plan_has_its_run() -> None:
    [result] = api.compare(
        [api.CompareCase("llama3-8b", "h100-spine-leaf", (16,))], ("manual",), 64, RunLength(tokens=1e11)
    )
    steps = math.ceil(1e11 / (64 * 8192))
    for row in result.rows:
        compute_s = steps * 64 * 8192 / row.tokens_per_s
        assert row.days * 86400 * row.goodput == pytest.approx(compute_s, rel=1e-9)
        assert row.gpu_hours == pytest.approx(16 * row.days * 24, rel=0.05)  # spares aside


def test_the_cli_shows_and_writes_the_run(capsys, tmp_path) -> None:
    target = tmp_path / "compare.csv"
    code, out, _ = run_cli(capsys, COMPARE + ["--tokens", "1e11", "--price-per-gpu-hour", "2", "--csv", str(target)])
    assert code == 0 and "GPU-hours" in out and "goodput" in out
    with open(target) as fh:
        rows = list(csv.DictReader(fh))
    assert all(float(r["cost_usd"]) == pytest.approx(2 * float(r["gpu_hours"]), rel=1e-5) for r in rows)
    code, out, _ = run_cli(capsys, COMPARE + ["--csv", str(target)])
    assert code == 0 and "GPU-hours" not in out
    with open(target) as fh:
        assert all(r["days"] == "" for r in csv.DictReader(fh))
    code, _, err = run_cli(capsys, COMPARE + ["--tokens", "-3"])
    assert code == 2 and "--tokens" in err and len(err.strip().splitlines()) == 1
