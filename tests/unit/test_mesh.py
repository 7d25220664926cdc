"""Issue 15, item 5: collectives over a full mesh of direct links (8 MI300X on Infinity Fabric) use all the links
they can, the graph builder finds such meshes, and the mi300x accelerator, link kind and cluster. Published
figures are stated with their source."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from nestplan import api, units
from nestplan.cluster import interconnect_bus_efficiency, load_cluster
from nestplan.errors import ConfigError
from nestplan.hardware import load_accelerator
from nestplan.network import (
    Level,
    Topology,
    all_gather,
    all_reduce,
    all_to_all,
    bus_bandwidth,
    from_graph,
    hierarchical,
    reduce_scatter,
    send_recv,
)
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, ZeroStage

GB = units.GB
US = units.US
LINK = 64 * GB  # MI300X data sheet: one Infinity Fabric link, 128 GB/s both directions
NBYTES = 2 * units.GiB
COLLECTIVES = [all_reduce, reduce_scatter, all_gather, all_to_all]


def _mesh_edges(devices: int = 8, first: int = 0, latency: float = 0.0) -> list[tuple[int, int, float, float]]:
    return [(first + a, first + b, LINK, latency) for a, b in itertools.combinations(range(devices), 2)]


def _mesh_node(latency: float = 0.0, aggregate: float = 7 * LINK) -> Topology:
    return hierarchical(
        "mesh", [dict(name="node", size=8, bandwidth_Bps=aggregate, latency_s=latency, mesh_link_Bps=LINK)]
    )


def _one_link_node(latency: float = 0.0) -> Topology:
    """The mesh as the graph builder read it before issue 15: one level of one link's bandwidth."""
    return hierarchical("link", [dict(name="node", size=8, bandwidth_Bps=LINK, latency_s=latency)])


# ---------------------------------------------------------------- collectives over a mesh


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("members", [2, 4, 8])
def test_a_collective_over_g_gpus_of_the_mesh_uses_g_minus_1_links(collective, members) -> None:
    fanout = (members,)
    on_mesh = collective(_mesh_node(), fanout, NBYTES)
    on_one_link = collective(_one_link_node(), fanout, NBYTES)
    assert on_one_link / on_mesh == pytest.approx(members - 1)


def test_tp8_all_reduce_on_the_graph_built_mesh_is_seven_links_faster() -> None:
    mesh = from_graph("mi300x-node", 8, _mesh_edges()).topology
    assert all_reduce(_one_link_node(), (8,), NBYTES) / all_reduce(mesh, (8,), NBYTES) == pytest.approx(7)
    assert bus_bandwidth(mesh, (8,)) == pytest.approx(7 * LINK)


def test_point_to_point_on_the_mesh_gets_one_link() -> None:
    assert send_recv(_mesh_node(), 0, NBYTES) == pytest.approx(NBYTES / LINK)
    assert send_recv(_mesh_node(), 0, NBYTES) == pytest.approx(send_recv(_one_link_node(), 0, NBYTES))


def test_the_gpus_aggregate_bandwidth_bounds_the_links() -> None:
    capped = _mesh_node(aggregate=4 * LINK)  # a device whose links together carry 4 links' worth
    assert bus_bandwidth(capped, (8,)) == pytest.approx(4 * LINK)
    assert bus_bandwidth(capped, (4,)) == pytest.approx(3 * LINK)


def test_latency_terms_are_unchanged_by_the_mesh() -> None:
    assert all_reduce(_mesh_node(latency=1 * US), (8,), 1.0) == pytest.approx(
        all_reduce(_mesh_node(), (8,), 1.0) + 2 * 7 * US
    )


def test_a_mesh_node_under_a_fabric_bounds_by_the_slowest_level() -> None:
    topo = hierarchical(
        "two",
        [
            dict(name="node", size=8, bandwidth_Bps=7 * LINK, latency_s=0.0, mesh_link_Bps=LINK),
            dict(name="fabric", size=4, bandwidth_Bps=50 * GB, latency_s=0.0),
        ],
    )
    # 2 GPUs per node: one link (64 GB/s) is slower than 2 x 50 GB/s of NICs
    assert bus_bandwidth(topo, (2, 4)) == pytest.approx(LINK)
    # 8 GPUs per node: the NICs of the node, 8 x 50 GB/s, are slower than 7 links
    assert bus_bandwidth(topo, (8, 4)) == pytest.approx(8 * 50 * GB)


@pytest.mark.parametrize("members", [1, 2, 8, 64])
def test_switched_levels_do_not_depend_on_the_group(members) -> None:
    level = Level("node", 8, 450 * GB, 1 * US, oversubscription=2.0, bus_efficiency=0.8)
    assert level.group_bandwidth_Bps(members) == level.effective_bandwidth_Bps


def test_mesh_link_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"mesh_link_Bps must be None or a number in \(0, bandwidth_Bps"):
        Level("node", 8, 100 * GB, 0.0, mesh_link_Bps=200 * GB)
    with pytest.raises(ConfigError, match="mesh_link_Bps"):
        hierarchical("bad", [dict(name="node", size=8, bandwidth_Bps=100 * GB, latency_s=0.0, mesh_link_Bps=0)])


# ---------------------------------------------------------------- the graph builder finds meshes


def test_from_graph_reads_a_full_mesh_as_its_links() -> None:
    level = from_graph("mesh", 8, _mesh_edges(latency=1 * US)).topology.levels[0]
    assert (level.size, level.mesh_link_Bps, level.bandwidth_Bps, level.latency_s) == (8, LINK, 7 * LINK, 1 * US)


def test_from_graph_mesh_nodes_on_rails() -> None:
    """Two MI300X nodes, GPU k of each on rail switch 16 + k: a mesh node level under a 50 GB/s fabric."""
    edges = _mesh_edges() + _mesh_edges(first=8) + [(d, 16 + d % 8, 50 * GB, 1.5 * US) for d in range(16)]
    node, fabric = from_graph("rails", 16, edges).topology.levels
    assert (node.size, node.mesh_link_Bps) == (8, LINK)
    assert (fabric.size, fabric.mesh_link_Bps, fabric.bandwidth_Bps) == (2, None, 50 * GB)


@pytest.mark.parametrize(
    "edges, devices",
    [
        ([(a, (a + 1) % 4, LINK, 0.0) for a in range(4)], 4),  # a ring: not every pair has its link
        ([(d, 8, LINK, 0.0) for d in range(8)], 8),  # a switch: no direct link at all
        ([(0, 1, LINK, 0.0), (2, 3, LINK, 0.0)] + [(d, 4, 10 * GB, 0.0) for d in range(4)], 4),  # pairs: one link
    ],
    ids=["ring", "switch", "pairs"],
)
def test_from_graph_keeps_other_networks_switched(edges, devices) -> None:
    assert from_graph("g", devices, edges).topology.levels[0].mesh_link_Bps is None


# ---------------------------------------------------------------- mi300x catalog


def test_mi300x_datasheet_figures() -> None:
    mi300x = load_accelerator("mi300x")
    # ROCm docs, MI300 microarchitecture, peak-performance table: BF16/FP16 1307.4, FP8 2614.9 TFLOPS (dense)
    assert mi300x.peak("bf16") == pytest.approx(1307.4e12) and mi300x.peak("fp8") == pytest.approx(2614.9e12)
    # MI300X data sheet: 192 GB HBM3 (rocm-smi: 205822885888 B = 191.7 GiB), 5.3 TB/s
    assert mi300x.hbm_bytes == 192 * units.GiB and mi300x.hbm_bandwidth_Bps == pytest.approx(5.3e12)
    # ROCm blog, Measuring Max-Achievable FLOPs part 2: hipBLASLt BF16 708, FP8 1273 TFLOPS on a 750 W MI300X
    assert mi300x.matmul_efficiency == pytest.approx(708 / 1307.4, abs=0.005)
    assert mi300x.fp8_matmul_efficiency == pytest.approx(1273 / 2614.9, abs=0.005)


def test_infinity_fabric_efficiency_is_rccls_8_gpu_all_reduce() -> None:
    # ROCm docs, training prerequisite validation: rccl-tests all_reduce_perf on 8 MI300X, busbw 317 GB/s
    assert interconnect_bus_efficiency("infinity-fabric") == pytest.approx(317 / 448, abs=1e-3)


def test_mi300x_cluster() -> None:
    cluster = load_cluster("mi300x")
    node, fabric = cluster.topology.levels
    assert cluster.accelerator.name == "mi300x" and cluster.devices == 1024
    assert (node.size, node.mesh_link_Bps, node.bandwidth_Bps) == (8, LINK, 448 * GB)  # 7 links of 64 GB/s
    assert (fabric.size, fabric.mesh_link_Bps, fabric.bandwidth_Bps) == (128, None, 50 * GB)  # 400 Gb/s NIC per GPU
    assert cluster.device_order is None  # [[levels]]: ranks in device order
    # tp 8 on one node: 7 links x 64 GB/s x 317 / 448 = the 317 GB/s busbw RCCL measures
    assert bus_bandwidth(cluster.topology, (8, 1)) == pytest.approx(317 * GB, rel=1e-3)


def test_llama3_70b_tp8_on_mi300x_with_and_without_the_mesh() -> None:
    """The issue's case: tp 8 on the mesh read as one 64 GB/s link spends most of the step in tp collectives."""
    mesh = api.resolve_cluster("mi300x", 64)
    one_link = dataclasses.replace(
        mesh,
        topology=dataclasses.replace(
            mesh.topology,
            levels=(
                dataclasses.replace(mesh.topology.levels[0], bandwidth_Bps=LINK, mesh_link_Bps=None),
                mesh.topology.levels[1],
            ),
        ),
    )
    plan = ParallelDims(tp=8, dp=8, sp=True, zero=ZeroStage.OPTIMIZER, recompute=Recompute.SELECTIVE)
    job = api.job_for(api.resolve_model("llama3-70b"), mesh, 128, 8192)
    fast, slow = (api.evaluate("llama3-70b", c, plan, job) for c in (mesh, one_link))
    assert slow.breakdown_s["tp_comm"] / fast.breakdown_s["tp_comm"] == pytest.approx(7, rel=0.02)
    assert fast.mfu > 2 * slow.mfu
