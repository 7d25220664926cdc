"""A run counts the cluster's hosts, not its NVLink domains: a GB200 NVL72 job's failures, spares and
storage per host come from its compute trays of 4 GPUs, and a device range takes whole trays."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from nestplan import api
from nestplan.cost.reliability import StateBytes, checkpoint_costs, job_failure_rate
from nestplan.cost.run import RunLength, estimate_run, ranks_per_host
from nestplan.hardware.facility import facility_from_dict
from nestplan.job import Job
from nestplan.search.sizes import range_sizes

STATE = StateBytes(weights=(2e9,), optimizer=(6e9,), weight_replicas=8, stage_ranks=512)


def test_gb200_hosts_are_trays_of_four_not_racks() -> None:
    cluster = api.resolve_cluster("gb200-nvl72")
    assert ranks_per_host(cluster, 512) == 4
    assert ranks_per_host(cluster, 2) == 2  # a job within one host
    assert ranks_per_host(api.resolve_cluster("dgx-h100"), 512) == 8


def test_failures_spares_and_storage_count_trays() -> None:
    facility = facility_from_dict({"spare_hosts": 3, "storage_aggregate_write_GBps": 1e6})
    cluster = replace(api.resolve_cluster("gb200-nvl72"), facility=facility)
    run = estimate_run(STATE, 5.0, Job(global_batch_size=512, seq_len=4096), 512, cluster, RunLength(steps=10_000))
    assert run.reliability.failure_rate_per_s == pytest.approx(job_failure_rate(512, 128, facility))
    assert run.spare_devices == 3 * 4
    assert run.gpu_hours == pytest.approx((512 + 12) * run.wall_s / 3600)
    assert run.reliability.checkpoint.write_s == pytest.approx(checkpoint_costs(STATE, 4, facility).write_s)
    per_tray = (2e9 / 8 + 6e9) * 4 / facility.storage_write_Bps
    assert run.reliability.checkpoint.write_s == pytest.approx(per_tray)


def test_gb200_range_takes_whole_trays_as_devices_does() -> None:
    cluster = api.resolve_cluster("gb200-nvl72")
    sizes = range_sizes(64, 16384, cluster)
    assert sizes == [64 << k for k in range(8)]  # 64 in one rack, 128 = 2 racks x 64, ... 8192 = 128 x 64
    assert all(cluster.truncate(n).devices == n for n in sizes)
    assert all(math.log2(n).is_integer() and n % 4 == 0 for n in sizes)
