"""Hosts apart from network levels (issue 27, item 1): GPUs per host, GPUs used per NVLink domain,
whole-host jobs, and costs that do not depend on how a level is drawn."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace

import pytest
from cli_helpers import run_cli

from nestplan import api
from nestplan.api.resolve import resolve_cluster
from nestplan.cluster import cluster_data, cluster_from_dict, cluster_to_dict, load_cluster
from nestplan.errors import ConfigError
from nestplan.export import FRAMEWORKS, export
from nestplan.export.plan import ExportInput
from nestplan.job import Job
from nestplan.plan import Plan
from nestplan.strategy.dims import ParallelDims


def _node_as_two_quads(name: str) -> dict:
    """A catalog cluster's table with its 8-GPU node drawn as two levels of 4 with the same links (its hosts
    then those of the innermost level: a host lies inside one unit of it)."""
    data = copy.deepcopy(cluster_data(name))
    del data["gpus_per_host"]
    node = data["levels"][0]
    data["levels"] = [dict(node, name="quad", size=4), dict(node, name="node", size=2)] + data["levels"][1:]
    return data


def test_mixtral_step_does_not_depend_on_how_the_node_is_drawn() -> None:
    """Issue 27: drawing a DGX H100 node as two levels of 4 cut Mixtral's expert all-to-all by 44%;
    the step, its communication terms included, is now the same on both drawings."""
    spec = api.resolve_model("mixtral-8x7b")
    plan = ParallelDims(tp=2, pp=2, dp=2, ep=8, sp=True)
    steps = []
    for data in (cluster_data("dgx-h100"), _node_as_two_quads("dgx-h100")):
        cluster = cluster_from_dict(data).truncate(64)
        job = api.job_for(spec, cluster, 256, 4096)
        prediction = api.evaluate(spec, cluster, plan, job)
        steps.append((prediction.step_time_s, dict(prediction.stages[0].components_s)))
    assert steps[0][1]["ep_comm"] > 0 and steps[0][1]["tp_comm"] > 0
    assert steps[0] == steps[1]


# ---------------------------------------------------------------- whole hosts, equally many per domain
@pytest.mark.parametrize(
    "devices, levels",
    [(128, [64, 2]), (256, [64, 4]), (512, [64, 8]), (144, [72, 2]), (72, [72]), (64, [64]), (4, [4]), (2, [2])],
)
def test_gb200_jobs_take_the_most_whole_trays_per_rack_that_divide_them(devices, levels) -> None:
    """NVIDIA's GB200 launcher asks Slurm for the greatest node count per NVLink domain that divides the
    job (network/hosts.py): 128 GPUs = 32 trays = 2 racks x 16 trays of 4."""
    cluster = load_cluster("gb200-nvl72", devices)
    assert [level.size for level in cluster.topology.levels] == levels
    assert cluster.host_devices == min(4, devices) and cluster.devices == devices


@pytest.mark.parametrize(
    "cluster, devices, needle",
    [
        ("gb200-nvl72", 130, "--devices 130 is not a multiple of 4 (GPUs per host of cluster 'gb200-nvl72'"),
        ("gb200-nvl72", 130, "nearest valid counts: 128, 132"),
        ("gb200-nvl72", 6, "nearest valid counts: 4, 8"),
        ("gb200-nvl72", 20000, "outside 1..9216 for cluster 'gb200-nvl72'; nearest valid count: 9216"),
        (
            "dgx-h100",
            12,
            "is not a multiple of 8 (GPUs per host of cluster 'dgx-h100'; a job takes whole hosts); "
            "nearest valid counts: 8, 16",
        ),
    ],
)
def test_an_impossible_count_names_the_nearest_valid_ones(cluster, devices, needle) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)) as err:
        load_cluster(cluster, devices)
    assert err.value.field == "devices" and "\n" not in str(err.value)


def test_gpus_per_domain_places_the_job_as_the_user_says() -> None:
    assert [lv.size for lv in resolve_cluster("gb200-nvl72", 128, gpus_per_domain=32).topology.levels] == [32, 4]
    assert [lv.size for lv in resolve_cluster("gb200-nvl72", 144, gpus_per_domain=72).topology.levels] == [72, 2]
    with pytest.raises(ConfigError, match=re.escape("not a multiple of the 48 GPUs used per rack")) as err:
        resolve_cluster("gb200-nvl72", 128, gpus_per_domain=48)
    assert err.value.limit == [96, 144]
    with pytest.raises(ConfigError, match="must be a multiple of its 4 GPUs per host up to 72, got 6"):
        resolve_cluster("gb200-nvl72", 128, gpus_per_domain=6)


def test_cluster_file_hosts_fields_are_read_checked_and_written_back() -> None:
    data = copy.deepcopy(cluster_data("gb200-nvl72")) | {"gpus_per_domain": 48}
    cluster = cluster_from_dict(data)
    assert (cluster.gpus_per_host, cluster.gpus_per_domain, cluster.host_devices) == (4, 48, 4)
    assert cluster_from_dict(cluster_to_dict(cluster)) == cluster
    assert [lv.size for lv in cluster.truncate(96).topology.levels] == [48, 2]
    assert cluster_data("dgx-h100")["gpus_per_host"] == 8 and load_cluster("v100-spine-leaf").host_devices == 2
    for key, value, needle in (
        ("gpus_per_host", 5, "gpus_per_host must divide the 72 devices of its innermost level 'rack'"),
        ("gpus_per_host", 0, "an integer in 1.."),
        ("gpus_per_domain", 73, "must be a multiple of its 4 GPUs per host up to 72"),
    ):
        with pytest.raises(ConfigError, match=re.escape(needle)):
            cluster_from_dict(copy.deepcopy(cluster_data("gb200-nvl72")) | {key: value})


def test_a_graph_clusters_device_order_follows_the_devices_a_job_takes() -> None:
    """The first ``per_domain`` devices of each domain used, in the graph's device order."""
    whole = load_cluster("gb200-nvl72")
    order = tuple(reversed(range(whole.devices)))
    cluster = replace(whole, device_order=order).truncate(128)
    assert cluster.device_order == order[:64] + order[72:136]


# ---------------------------------------------------------------- plans and launch scripts count hosts
@pytest.fixture(scope="module")
def gb200_plan() -> Plan:
    job = Job(global_batch_size=256, seq_len=4096)
    dims = ParallelDims(tp=4, sp=True, pp=4, dp=8, zero=1)
    return api.evaluate_full("llama3-70b", "gb200-nvl72", dims, job, devices=128).plan


def test_the_plan_json_keeps_the_hosts_and_the_racks_it_used(gb200_plan) -> None:
    assert gb200_plan.to_dict()["cluster_definition"]["gpus_per_host"] == 4
    again = Plan.from_dict(json.loads(json.dumps(gb200_plan.to_dict())))
    assert again.cluster == gb200_plan.cluster
    assert [lv.size for lv in again.cluster.topology.levels] == [64, 2]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_launch_scripts_count_hosts_of_4_not_racks_of_72(gb200_plan, framework) -> None:
    files = export(framework, ExportInput(gb200_plan, "test")).files
    launcher = next(f.text for f in files if f.name.endswith(".sh"))
    assert "128 devices = 32 nodes x 4" in launcher
    assert "each 16 consecutive nodes share a rack" in launcher
    assert "#SBATCH --nodes=32\n" in launcher and "#SBATCH --gpus-per-node=4\n" in launcher
    assert "#SBATCH --segment=16\n" in launcher
    per_node = "--num_nodes 32 --num_gpus 4 " if framework == "deepspeed" else "GPUS_PER_NODE=4\n"
    assert per_node in launcher


def test_dgx_launch_scripts_ask_for_no_segment() -> None:
    job = Job(global_batch_size=256, seq_len=4096)
    plan = api.evaluate_full("llama3-8b", "dgx-h100", ParallelDims(tp=8, dp=2), job, devices=16).plan
    launcher = export("megatron", ExportInput(plan, "test")).files[0].text
    assert "#SBATCH --nodes=2\n" in launcher and "--segment" not in launcher
    assert "one fabric holds them all" in launcher


def test_cli_gpus_per_domain(capsys) -> None:
    base = [
        "evaluate",
        "--model",
        "llama3-70b",
        "--cluster",
        "gb200-nvl72",
        "--devices",
        "128",
        "--tp",
        "4",
        "--sp",
        "--pp",
        "4",
        "--dp",
        "8",
        "--global-batch-size",
        "256",
        "--seq-len",
        "4096",
        "--json",
    ]
    code, out, err = run_cli(capsys, base + ["--gpus-per-domain", "32"])
    assert code == 0, err
    assert [lv["size"] for lv in json.loads(out)["cluster_definition"]["levels"]] == [32, 4]
    code, out, err = run_cli(capsys, base + ["--gpus-per-domain", "48"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "nearest valid counts: 96, 144" in err
