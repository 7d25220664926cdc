"""Baselines and `nestplan compare`: nestplan searches a superset, files are written, dashes stay dashes."""

from __future__ import annotations

import csv

import pytest

from cli_helpers import run_cli
from nestplan import api
from nestplan.job import Job
from nestplan.search.baselines import BASELINES
from nestplan.search.compare import compare_case, normalise


@pytest.fixture(scope="module")
def small_case():
    model = api.resolve_model("llama2-7b")
    cluster = api.resolve_cluster("h100-spine-leaf", 64)
    return model, cluster, Job(global_batch_size=256, seq_len=4096)


def test_nestplan_at_least_every_baseline(small_case) -> None:
    model, cluster, job = small_case
    rows = compare_case(model, cluster, job, 1, list(BASELINES))
    ours = next(r for r in rows if r.planner == "nestplan")
    assert ours.feasible
    for r in rows:
        assert ours.tokens_per_s >= r.tokens_per_s * (1 - 1e-9), r
    norm = normalise(rows)
    manual = next(x for r, x in zip(rows, norm) if r.planner == "manual")
    assert manual == pytest.approx(1.0)


def test_mcmc_is_deterministic(small_case) -> None:
    model, cluster, job = small_case
    a = BASELINES["mcmc"](model, cluster, job, 64, 1, chains=2, budget=30)
    b = BASELINES["mcmc"](model, cluster, job, 64, 1, chains=2, budget=30)
    assert a.tokens_per_s == b.tokens_per_s and a.evaluations == b.evaluations <= 60


def test_alpa_reports_a_dash_when_nothing_fits() -> None:
    """GPT-3 on 64 TPUv4-like devices: no equal-submesh plan without recomputation fits (the paper's dash)."""
    model = api.resolve_model("gpt3-175b")
    cluster = api.resolve_cluster("tpuv4-fattree", 64)
    r = BASELINES["alpa"](model, cluster, Job(global_batch_size=4096, seq_len=2048), 64, 1)
    assert not r.feasible and r.tokens_per_s == 0.0 and r.prediction is None


def test_compare_cli_writes_csv_and_plot(capsys, tmp_path) -> None:
    png, table = tmp_path / "c.png", tmp_path / "c.csv"
    code, out, err = run_cli(
        capsys,
        [
            "compare",
            "--model",
            "bert-large",
            "--cluster",
            "v100-spine-leaf",
            "--devices",
            "8,16",
            "--global-batch-size",
            "64",
            "--baselines",
            "manual,alpa",
            "--plot",
            str(png),
            "--csv",
            str(table),
        ],
    )
    assert code == 0, err
    assert png.stat().st_size > 1000
    rows = list(csv.DictReader(open(table)))
    assert [r["planner"] for r in rows] == ["nestplan", "manual", "alpa"] * 2
    assert set(rows[0]) == {
        "model",
        "cluster",
        "devices",
        "micro_batch_size",
        "planner",
        "feasible",
        "tokens_per_s",
        "normalized",
        "solve_time_s",
        "days",  # the run's columns, empty without --tokens or --steps
        "gpu_hours",
        "energy_MWh",
        "cost_usd",
        "goodput",
    }
    assert "normalised" in out


def test_compare_bad_baseline(capsys) -> None:
    code, _, err = run_cli(
        capsys, ["compare", "--model", "bert-large", "--cluster", "v100-spine-leaf", "--baselines", "manual,oracle"]
    )
    assert code == 2 and "unknown baseline 'oracle'" in err
