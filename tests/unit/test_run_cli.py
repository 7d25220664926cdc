"""The whole run on the command line and in the plan JSON: --tokens and prices on evaluate and plan,
the run section read back unchanged, a cluster file's [facility] table, a range of device counts
chosen by objective, and bad input refused in one line with exit 2."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run_cli

from nestplan.cluster import cluster_data, cluster_from_dict, cluster_to_dict
from nestplan.plan import Plan

EVALUATE = ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--tp", "2", "--pp", "2", "--dp", "2"]
EVALUATE += ["--global-batch-size", "16", "--seq-len", "2048"]
RANGE = ["plan", "--model", "llama3-8b", "--cluster", "h100-spine-leaf", "--global-batch-size", "64"]
RANGE += ["--seq-len", "2048", "--tokens", "1e11", "--top", "0", "--price-per-gpu-hour", "2"]


def test_evaluate_prints_the_run_and_its_json_reads_back_unchanged(capsys) -> None:
    code, out, _ = run_cli(capsys, EVALUATE + ["--tokens", "1e11", "--price-per-gpu-hour", "2.5"])
    assert code == 0 and "run: 3,051,758 steps" in out and "goodput" in out
    code, out, _ = run_cli(capsys, EVALUATE + ["--tokens", "1e11", "--price-per-gpu-hour", "2.5", "--json"])
    data = json.loads(out)
    run = data["run"]["estimate"]
    assert run["steps"] == 3051758
    assert run["cost_usd"] == pytest.approx(run["gpu_hours"] * 2.5)
    assert run["days"] == pytest.approx(run["compute_s"] / run["reliability"]["goodput"] / 86400)
    assert data["run"]["assumptions"]["pue"]["source"].startswith("Google")
    assert Plan.from_dict(data).to_dict() == data


def test_steps_give_the_run_as_well(capsys) -> None:
    code, out, _ = run_cli(capsys, EVALUATE + ["--steps", "1000", "--json"])
    assert code == 0 and json.loads(out)["run"]["estimate"]["steps"] == 1000


def test_a_cluster_files_facility_table_is_read_and_written_back() -> None:
    data = cluster_data("dgx-h100") | {"facility": {"pue": 1.3, "spare_hosts": 2, "price_per_kwh_usd": 0.1}}
    cluster = cluster_from_dict(data)
    assert cluster.facility.pue == 1.3 and cluster.facility.spare_hosts == 2
    assert cluster_from_dict(cluster_to_dict(cluster)) == cluster


@pytest.mark.parametrize(
    ("facility", "needle"),
    [
        ({"pue": 0.5}, "facility.pue"),
        ({"device_failures_per_day": -1}, "facility.device_failures_per_day"),
        ({"price_per_gpu_hour_usd": 1e9}, "facility.price_per_gpu_hour_usd"),
        ({"storage_write_GBps": 0}, "facility.storage_write_GBps"),
        ({"colour": "red"}, "unknown field 'facility.colour'"),
    ],
)
def test_absurd_facility_figures_are_refused_by_name(facility, needle) -> None:
    from nestplan.errors import ConfigError

    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        cluster_from_dict(cluster_data("dgx-h100") | {"facility": facility})


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--tokens", "-1"], "--tokens -1 is not a number"),
        (["--tokens", "1e30"], "--tokens 1e30 is not a number"),
        (["--tokens", "1e9", "--steps", "10"], "tokens or as steps, not both"),
        (["--tokens", "1e9", "--price-per-gpu-hour", "-3"], "--price-per-gpu-hour -3"),
        (["--tokens", "1e9", "--spare-hosts", "-1"], "--spare-hosts"),
    ],
)
def test_bad_run_input_is_one_line_and_exit_2(capsys, extra, needle) -> None:
    code, out, err = run_cli(capsys, EVALUATE + extra)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_a_range_with_no_valid_size_is_refused(capsys) -> None:
    code, _, err = run_cli(capsys, RANGE + ["--devices-range", "9..15"])
    assert code == 2 and "holds no power of two" in err and len(err.strip().splitlines()) == 1


def test_a_range_plans_the_sizes_that_can_win_and_chooses_by_objective(capsys) -> None:
    chosen = {}
    for objective in ("time", "cost"):
        code, out, _ = run_cli(capsys, RANGE + ["--devices-range", "8..64", "--objective", objective, "--json"])
        assert code == 0
        data = json.loads(out)
        table = data["devices_range"]
        assert [row["devices"] for row in table["sizes"]] == [8, 16, 32, 64]
        sizes = {row["devices"]: row["run"] for row in table["sizes"] if row["run"]}
        skipped = [row for row in table["sizes"] if not row["run"]]
        assert all(row["note"].startswith("not planned: at least") for row in skipped)
        key = "wall_s" if objective == "time" else "cost_usd"
        assert table["chosen_devices"] == min(sizes, key=lambda n: (sizes[n][key], n))
        assert data["devices_used"] == table["chosen_devices"]
        chosen[objective] = table["chosen_devices"]
    assert chosen["time"] >= chosen["cost"]


def test_limits_that_no_size_meets_exit_3(capsys) -> None:
    code, _, err = run_cli(capsys, RANGE + ["--devices-range", "8..16", "--max-days", "0.001"])
    assert code == 3 and "within the limits" in err
