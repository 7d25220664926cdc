"""Topology, builders, cluster files and collective-cost properties."""

from __future__ import annotations

import json
import math

import pytest

from nestplan import units
from nestplan.cluster import (
    Cluster,
    cluster_from_dict,
    cluster_names,
    interconnect_bus_efficiency,
    interconnect_kinds,
    load_cluster,
)
from nestplan.errors import ConfigError, UnknownNameError
from nestplan.hardware import accelerator_names, load_accelerator
from nestplan.network import (
    GraphTopology,
    Level,
    Topology,
    all_gather,
    all_reduce,
    all_to_all,
    fat_tree,
    from_graph,
    hierarchical,
    reduce_scatter,
    send_recv,
    spine_leaf,
    torus,
)

GB = units.GB
US = units.US


def _three_level(oversub: float = 1.0, latency: float = 0.0, spine_GBps: float = 25.0) -> Topology:
    return hierarchical(
        "t",
        [
            dict(name="node", size=8, bandwidth_Bps=400 * GB, latency_s=latency),
            dict(name="leaf", size=4, bandwidth_Bps=50 * GB, latency_s=2 * latency),
            dict(name="spine", size=4, bandwidth_Bps=spine_GBps * GB, latency_s=3 * latency, oversubscription=oversub),
        ],
    )


# ---------------------------------------------------------------------------
# Topology: truncate, fanout, span_level


def test_truncate_keeps_inner_units_whole():
    topo = _three_level()
    assert topo.devices == 128
    assert [lv.size for lv in topo.truncate(64).levels] == [8, 4, 2]
    assert [lv.size for lv in topo.truncate(16).levels] == [8, 2]
    assert [lv.size for lv in topo.truncate(4).levels] == [4]
    assert topo.truncate(128) == topo


@pytest.mark.parametrize("devices", [12, 20])
def test_truncate_refuses_partial_nodes(devices):
    with pytest.raises(ConfigError, match=rf"{devices} is not a multiple of 8"):
        _three_level().truncate(devices)


@pytest.mark.parametrize("devices", [0, 129])
def test_truncate_refuses_out_of_range(devices):
    with pytest.raises(ConfigError, match="outside 1..128"):
        _three_level().truncate(devices)


def test_fanout_and_span_level():
    topo = _three_level()
    assert topo.fanout(range(8)) == (8, 1, 1)
    assert topo.span_level((8, 1, 1)) == 0
    assert topo.fanout([0, 8, 16, 24]) == (1, 4, 1)
    assert topo.span_level((1, 4, 1)) == 1
    assert topo.fanout([0, 32, 64, 96]) == (1, 1, 4)
    assert topo.span_level((1, 1, 4)) == 2
    assert topo.fanout(range(128)) == (8, 4, 4)
    assert topo.fanout([5]) == (1, 1, 1)
    assert topo.span_level((1, 1, 1)) == 0
    assert math.prod(topo.fanout(range(0, 64, 2))) == 32


# ---------------------------------------------------------------------------
# builders


def test_hierarchical_from_dicts_and_levels():
    topo = hierarchical(
        "h",
        [
            Level("node", 4, 100 * GB, 1 * US, bus_efficiency=0.5),
            dict(name="rack", size=3, bandwidth_Bps=10 * GB, latency_s=2 * US, oversubscription=2.0),
        ],
    )
    assert topo.devices == 12
    assert topo.levels[0].effective_bandwidth_Bps == pytest.approx(50 * GB)
    assert topo.levels[1].effective_bandwidth_Bps == pytest.approx(5 * GB)
    assert topo.levels[1].bus_efficiency == 1.0


def test_hierarchical_rejects_unknown_and_missing_keys():
    with pytest.raises(ConfigError, match=r"unknown field 'levels\[0\].bandwidth_GBps'"):
        hierarchical("h", [dict(name="n", size=2, bandwidth_GBps=1, latency_s=0)])
    with pytest.raises(ConfigError, match=r"missing field 'levels\[0\].latency_s'"):
        hierarchical("h", [dict(name="n", size=2, bandwidth_Bps=1)])
    with pytest.raises(ConfigError, match=r"levels\[0\].size' must be an integer"):
        hierarchical("h", [dict(name="n", size=2.5, bandwidth_Bps=1, latency_s=0)])


def test_fat_tree_is_non_blocking():
    topo = fat_tree("ft", 8, 450 * GB, 1 * US, [4, 16], [50 * GB, 50 * GB], [3 * US, 4 * US])
    assert [lv.name for lv in topo.levels] == ["node", "leaf", "spine"]
    assert [lv.size for lv in topo.levels] == [8, 4, 16]
    assert all(lv.oversubscription == 1.0 for lv in topo.levels)
    assert topo.levels[2].latency_s == pytest.approx(4 * US)
    with pytest.raises(ConfigError, match="bandwidths has 1"):
        fat_tree("ft", 8, 450 * GB, 1 * US, [4, 16], [50 * GB], [3 * US, 4 * US])


def test_spine_leaf_oversubscribes_the_spine():
    topo = spine_leaf("sl", 8, 4, 32, 900 * GB, 12.5 * GB, 50 * GB, [1 * US, 3 * US, 4 * US], 3.0)
    assert [lv.name for lv in topo.levels] == ["node", "leaf", "spine"]
    assert topo.devices == 1024
    assert [lv.oversubscription for lv in topo.levels] == [1.0, 1.0, 3.0]
    assert topo.levels[2].effective_bandwidth_Bps == pytest.approx(50 * GB / 3)
    with pytest.raises(ConfigError, match="latencies needs 3 values"):
        spine_leaf("sl", 8, 4, 32, 900 * GB, 12.5 * GB, 50 * GB, [1 * US], 1.0)


def test_torus_2d():
    topo = torus("t2", [4, 8], 50 * GB, 1 * US, bus_efficiency=0.8)
    assert [lv.name for lv in topo.levels] == ["x", "y"]
    assert [lv.size for lv in topo.levels] == [4, 8]
    assert topo.devices == 32
    # two directions of the ring per dimension
    assert all(lv.bandwidth_Bps == pytest.approx(100 * GB) for lv in topo.levels)
    # largest hop distance inside a ring: dims // 2
    assert [lv.latency_s for lv in topo.levels] == pytest.approx([2 * US, 4 * US])
    assert all(lv.bus_efficiency == 0.8 and lv.oversubscription == 1.0 for lv in topo.levels)
    # first dimension fastest: ranks 0..3 are one x-ring, ranks 0, 4, 8, ... one y-ring
    assert topo.fanout(range(4)) == (4, 1)
    assert topo.fanout(range(0, 32, 4)) == (1, 8)


def test_torus_3d():
    topo = torus("t3", (2, 3, 5), 25 * GB, 0.5 * US)
    assert [lv.name for lv in topo.levels] == ["x", "y", "z"]
    assert topo.devices == 30
    assert [lv.latency_s for lv in topo.levels] == pytest.approx([0.5 * US, 0.5 * US, 1.0 * US])
    assert topo.fanout([0, 2, 4]) == (1, 3, 1)
    with pytest.raises(ConfigError, match="dims"):
        torus("bad", [4, 0], 25 * GB, 0.5 * US)


def _two_nodes_of_four(nvlink_latency: float = 1 * US) -> list[tuple[int, int, float, float]]:
    """Devices 0-3 and 4-7 fully meshed at 100 GB/s; every device on switch 8 at 25 GB/s."""
    edges = []
    for node in (range(0, 4), range(4, 8)):
        members = list(node)
        for a in members:
            for b in members:
                if a < b:
                    edges.append((a, b, 100 * GB, nvlink_latency))
    edges += [(d, 8, 25 * GB, 2 * US) for d in range(8)]
    return edges


def test_from_graph_derives_levels():
    built = from_graph("g", 8, _two_nodes_of_four())
    assert isinstance(built, GraphTopology)
    topo = built.topology
    assert [lv.size for lv in topo.levels] == [4, 2]
    # each node is a full mesh of direct 100 GB/s links: 3 links per device together (issue 15)
    assert [lv.bandwidth_Bps for lv in topo.levels] == pytest.approx([300 * GB, 25 * GB])
    assert [lv.mesh_link_Bps for lv in topo.levels] == [100 * GB, None]
    # device -> switch -> device: 2 + 2 us
    assert [lv.latency_s for lv in topo.levels] == pytest.approx([1 * US, 4 * US])
    assert built.device_order == tuple(range(8))
    assert not built.renumbered


def test_from_graph_renumbers_non_contiguous_units():
    # NVLink pairs (0, 2) and (1, 3); all four on switch 4
    edges = [(0, 2, 100 * GB, 1 * US), (1, 3, 100 * GB, 1 * US)] + [(d, 4, 10 * GB, 2 * US) for d in range(4)]
    built = from_graph("g", 4, edges)
    assert built.device_order == (0, 2, 1, 3)
    assert built.renumbered
    assert [lv.size for lv in built.topology.levels] == [2, 2]


def test_from_graph_widest_path_and_its_latency():
    # direct 10 GB/s link vs. a 50 GB/s path through switch 2 (two 3 us hops) or switch 3 (two 5 us hops)
    edges = [
        (0, 1, 10 * GB, 1 * US),
        (0, 2, 50 * GB, 3 * US),
        (2, 1, 50 * GB, 3 * US),
        (0, 3, 50 * GB, 5 * US),
        (3, 1, 50 * GB, 5 * US),
    ]
    topo = from_graph("g", 2, edges).topology
    assert len(topo.levels) == 1
    assert topo.levels[0].bandwidth_Bps == pytest.approx(50 * GB)
    assert topo.levels[0].latency_s == pytest.approx(6 * US)


def test_from_graph_matches_fat_tree_builder():
    # 4 nodes of 2 devices on NVLink (node switch ids 8..11), 2 leaves of 2 nodes, one spine
    edges = []
    for node in range(4):
        edges += [(2 * node + k, 8 + node, 300 * GB, 0.5 * US) for k in range(2)]
    for dev in range(8):
        edges.append((dev, 12 + dev // 4, 25 * GB, 1 * US))
    edges += [(12, 14, 20 * GB, 1 * US), (13, 14, 20 * GB, 1 * US)]
    derived = from_graph("g", 8, edges).topology
    expected = fat_tree("g", 2, 300 * GB, 1 * US, [2, 2], [25 * GB, 20 * GB], [2 * US, 4 * US])
    assert [lv.size for lv in derived.levels] == [lv.size for lv in expected.levels]
    assert [lv.bandwidth_Bps for lv in derived.levels] == pytest.approx([lv.bandwidth_Bps for lv in expected.levels])
    assert [lv.latency_s for lv in derived.levels] == pytest.approx([lv.latency_s for lv in expected.levels])


def test_from_graph_unequal_units_names_sizes():
    edges = [(0, 1, 100 * GB, 1 * US)] + [(d, 3, 10 * GB, 1 * US) for d in range(3)]
    with pytest.raises(ConfigError, match=r"unequal sizes \[1, 2\]"):
        from_graph("g", 3, edges)


def test_from_graph_disconnected():
    with pytest.raises(ConfigError, match="not all connected"):
        from_graph("g", 4, [(0, 1, 10 * GB, 1 * US), (2, 3, 10 * GB, 1 * US)])


# ---------------------------------------------------------------------------
# cluster files

_GOOD_TOML = """
name = "tiny"
accelerator = "h100-sxm-80gb"

[[levels]]
name = "node"
size = 4
bandwidth_GBps = 450
latency_us = 1
kind = "nvlink4"

[[levels]]
name = "leaf"
size = 2
bandwidth_GBps = 50
latency_us = 3
oversubscription = 2
"""


def _write(tmp_path, text: str, filename: str = "c.toml"):
    path = tmp_path / filename
    path.write_text(text)
    return str(path)


def test_cluster_file_toml(tmp_path):
    cluster = load_cluster(_write(tmp_path, _GOOD_TOML))
    assert isinstance(cluster, Cluster)
    assert cluster.name == "tiny" and cluster.devices == 8
    node, leaf = cluster.topology.levels
    assert node.bandwidth_Bps == pytest.approx(450e9)
    assert node.latency_s == pytest.approx(1e-6)
    assert node.bus_efficiency == interconnect_bus_efficiency("nvlink4")
    assert leaf.bus_efficiency == 1.0 and leaf.oversubscription == 2.0
    assert load_cluster(_write(tmp_path, _GOOD_TOML), devices=4).topology.levels == (node,)


def test_cluster_file_json_with_inline_accelerator(tmp_path):
    data = {
        "name": "tiny-json",
        "accelerator": {
            "peak_bf16_TFLOPS": 100,
            "hbm_GiB": 16,
            "hbm_bandwidth_TBps": 1.0,
            "matmul_efficiency": 0.8,
            "matmul_half_dim": 64.0,
            "memory_efficiency": 0.8,
        },
        "levels": [{"name": "node", "size": 2, "bandwidth_GBps": 100, "latency_us": 2, "bus_efficiency": 0.5}],
    }
    cluster = load_cluster(_write(tmp_path, json.dumps(data), "c.json"))
    assert cluster.accelerator.hbm_bytes == 16 * units.GiB
    assert cluster.topology.levels[0].effective_bandwidth_Bps == pytest.approx(50e9)


def test_cluster_torus_and_graph_tables():
    tor = cluster_from_dict(
        {
            "name": "tor",
            "accelerator": "tpuv4-nest",
            "torus": {"dims": [4, 4, 4], "link_bandwidth_GBps": 50, "hop_latency_us": 1, "kind": "ici"},
        }
    )
    assert tor.devices == 64 and len(tor.topology.levels) == 3
    assert tor.topology.levels[0].bandwidth_Bps == pytest.approx(100e9)
    assert tor.topology.levels[0].bus_efficiency == interconnect_bus_efficiency("ici")
    graph = cluster_from_dict(
        {
            "name": "g",
            "accelerator": "a100-80gb",
            "graph": {
                "devices": 4,
                "edges": [[0, 2, 100, 1], [1, 3, 100, 1], [0, 4, 10, 2], [1, 4, 10, 2], [2, 4, 10, 2], [3, 4, 10, 2]],
            },
        }
    )
    assert graph.device_order == (0, 2, 1, 3)
    assert [lv.size for lv in graph.topology.levels] == [2, 2]
    assert graph.truncate(2).device_order == (0, 2)


@pytest.mark.parametrize(
    "text, pattern",
    [
        (
            _GOOD_TOML.replace('name = "tiny"', 'name = "tiny"\ncolour = "red"'),
            r"unknown field 'colour'; allowed: name, accelerator",
        ),
        (
            _GOOD_TOML.replace("latency_us = 3", "latency_us = 3\nlatency_ms = 3"),
            r"unknown field 'levels\[1\].latency_ms'; allowed:",
        ),
        (_GOOD_TOML.replace("bandwidth_GBps = 50\n", ""), r"missing field 'levels\[1\].bandwidth_GBps'"),
        (_GOOD_TOML.replace('accelerator = "h100-sxm-80gb"\n', ""), r"missing field 'accelerator'"),
        (_GOOD_TOML.replace("size = 2", "size = 2.5"), r"size' must be an integer in 1..1048576, got 2.5"),
        (
            _GOOD_TOML.replace("oversubscription = 2", "oversubscription = 0.5"),
            r"oversubscription' must be a number in \[1, 1024\], got 0.5",
        ),
        (
            _GOOD_TOML.replace('kind = "nvlink4"', 'kind = "nvlink9"'),
            r"unknown interconnect kind 'nvlink9'; allowed: .*nvlink4",
        ),
        (
            _GOOD_TOML.replace('kind = "nvlink4"', 'kind = "nvlink4"\nbus_efficiency = 0.5'),
            r"either kind or bus_efficiency",
        ),
        (_GOOD_TOML.replace("latency_us = 1\n", "latency_us = 1\nsize = 3\n", 1), r"invalid TOML: .*line \d+"),
        (_GOOD_TOML.replace("[[levels]]", "[[levels]", 1), r"invalid TOML: .*line \d+"),
        (
            _GOOD_TOML + "\n[torus]\ndims = [2]\nlink_bandwidth_GBps = 1\nhop_latency_us = 1\n",
            r"exactly one network description",
        ),
        (_GOOD_TOML.replace('"h100-sxm-80gb"', '"h999"'), r"unknown accelerator 'h999'"),
    ],
    ids=[
        "unknown-top-key",
        "unknown-level-key",
        "missing-level-field",
        "missing-accelerator",
        "fractional-size",
        "oversubscription-below-1",
        "unknown-kind",
        "kind-and-efficiency",
        "duplicate-key",
        "bad-toml-syntax",
        "two-networks",
        "unknown-accelerator",
    ],
)
def test_bad_cluster_files(tmp_path, text, pattern):
    with pytest.raises(ConfigError, match=pattern) as info:
        load_cluster(_write(tmp_path, text))
    assert "\n" not in str(info.value)


def test_bad_json_reports_position(tmp_path):
    with pytest.raises(ConfigError, match=r"invalid JSON at line 1 column \d+"):
        load_cluster(_write(tmp_path, '{"name": "x", }', "c.json"))


def test_missing_file_and_unknown_name(tmp_path):
    missing = str(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="nope.toml' not found"):
        load_cluster(missing)
    with pytest.raises(UnknownNameError, match="dgx-a100"):
        load_cluster("no-such-cluster")


def test_cluster_devices_argument():
    assert load_cluster("dgx-a100", devices=280).devices == 280  # Korthikanti et al.: 35 DGX A100 nodes
    assert [lv.size for lv in load_cluster("dgx-a100", devices=280).topology.levels] == [8, 35]
    with pytest.raises(ConfigError, match="not a multiple of 8"):
        load_cluster("dgx-h100", devices=12)


CATALOG = {
    # name: (devices, levels)
    "tpuv4-fattree": (1024, 3),
    "h100-spine-leaf": (1024, 3),
    "v100-spine-leaf": (16, 2),
    "dgx-a100": (4480, 2),
    "dgx-h100": (4608, 2),
    "llama3-h100": (24576, 4),
    "dgx-b200": (16384, 2),
    "gb200-nvl72": (9216, 2),
}


def test_catalog_names():
    assert set(CATALOG) <= set(cluster_names())


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_catalog_cluster_loads(name):
    cluster = load_cluster(name)
    devices, levels = CATALOG[name]
    assert cluster.name == name
    assert cluster.devices == devices
    assert len(cluster.topology.levels) == levels
    assert cluster.accelerator.hbm_bytes > 0


def test_catalog_cluster_details():
    llama = load_cluster("llama3-h100").topology.levels
    assert [lv.oversubscription for lv in llama] == [1.0, 1.0, 1.0, 7.0]  # Llama 3 section 3.3.1: 1:7 at aggregation
    assert llama[3].effective_bandwidth_Bps == pytest.approx(50e9 * 0.9 / 7)
    paper = load_cluster("h100-spine-leaf").topology.levels
    assert [lv.bus_efficiency for lv in paper] == [1.0, 1.0, 1.0]
    assert [lv.bandwidth_Bps for lv in paper] == pytest.approx([900e9, 12.5e9, 50e9])


def test_interconnect_kinds():
    kinds = interconnect_kinds()
    assert {"nvlink2", "nvlink3", "nvlink4", "nvlink5", "infiniband", "roce", "ici", "ethernet", "paper"} <= set(kinds)
    assert interconnect_bus_efficiency("nvlink3") == pytest.approx(232.5 / 300)
    assert interconnect_bus_efficiency("nvlink4") == pytest.approx(370 / 450, rel=1e-3)
    assert all(0 < interconnect_bus_efficiency(k) <= 1 for k in kinds)


def test_catalog_accelerators():
    assert {
        "v100-32gb",
        "a100-40gb",
        "a100-80gb",
        "h100-sxm-80gb",
        "h200-141gb",
        "b200",
        "gb200",
        "gb300",
        "tpuv4-nest",
    } <= set(accelerator_names())
    h100 = load_accelerator("h100-sxm-80gb")
    assert h100.peak("bf16") == pytest.approx(989.5e12)  # H100 SXM datasheet: 1,979 TFLOPS with sparsity
    assert "bf16" not in load_accelerator("v100-32gb").peak_flops
    assert load_accelerator("tpuv4-nest").hbm_bytes == 64 * units.GiB
    assert load_accelerator("tpuv4-nest").peak("bf16") == pytest.approx(275e12)  # Jouppi et al. ISCA 2023


# ---------------------------------------------------------------------------
# collective cost properties

FANOUTS = [(8, 1, 1), (2, 1, 1), (1, 4, 1), (8, 4, 1), (1, 1, 4), (4, 2, 2), (8, 4, 4)]
COLLECTIVES = [all_reduce, reduce_scatter, all_gather, all_to_all]


@pytest.mark.parametrize("fanout", FANOUTS, ids=lambda f: "x".join(map(str, f)))
@pytest.mark.parametrize("op", COLLECTIVES, ids=lambda f: f.__name__)
def test_collectives_monotone_in_bytes(op, fanout):
    topo = _three_level(latency=1 * US)
    times = [op(topo, fanout, n) for n in (0, 1, 1e3, 1e6, 1e9, 1e10)]
    assert times[0] == 0.0
    assert all(a < b for a, b in zip(times, times[1:]))


def test_send_recv_monotone_and_slower_outward():
    topo = _three_level(latency=1 * US)
    for level in range(3):
        times = [send_recv(topo, level, n) for n in (0, 1e3, 1e6, 1e9)]
        assert times[0] == 0.0 and all(a < b for a, b in zip(times, times[1:]))
    assert send_recv(topo, 0, 1e9) < send_recv(topo, 1, 1e9) < send_recv(topo, 2, 1e9)


@pytest.mark.parametrize("op", COLLECTIVES, ids=lambda f: f.__name__)
def test_collectives_zero_for_one_member(op):
    assert op(_three_level(latency=1 * US), (1, 1, 1), 1e9) == 0.0


@pytest.mark.parametrize("fanout", FANOUTS, ids=lambda f: "x".join(map(str, f)))
def test_all_reduce_is_reduce_scatter_plus_all_gather(fanout):
    topo = _three_level(latency=0.0)
    nbytes = 3.7e8
    total = all_reduce(topo, fanout, nbytes)
    parts = reduce_scatter(topo, fanout, nbytes) + all_gather(topo, fanout, nbytes)
    assert abs(total - parts) <= 1e-12 * total


@pytest.mark.parametrize("op", COLLECTIVES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("fanout", [(1, 1, 4), (1, 2, 4), (8, 4, 4)], ids=lambda f: "x".join(map(str, f)))
def test_oversubscribed_level_is_slower_by_the_ratio(op, fanout):
    # a 2 GB/s spine is the bottleneck of these groups; with zero latency time scales with 1/bandwidth
    ratio = 3.0
    plain = op(_three_level(oversub=1.0, spine_GBps=2.0), fanout, 1e9)
    oversubscribed = op(_three_level(oversub=ratio, spine_GBps=2.0), fanout, 1e9)
    assert oversubscribed / plain == pytest.approx(ratio, rel=1e-12)


def test_group_inside_a_unit_ignores_outer_oversubscription():
    assert all_reduce(_three_level(oversub=4.0), (8, 4, 1), 1e9) == all_reduce(_three_level(), (8, 4, 1), 1e9)


def test_truncate_splits_partial_outer_units():
    """16,384 GPUs of the Llama 3 cluster span 5 1/3 pods of 3,072: pods are read as 1,024-GPU
    sub-units, so every cross-sub-unit group is costed at the (oversubscribed) outer level."""
    from nestplan.cluster import load_cluster

    topo = load_cluster("llama3-h100", 16384).topology
    assert [lv.size for lv in topo.levels] == [8, 2, 64, 16]
    assert topo.levels[-1].oversubscription == 7
    assert load_cluster("llama3-h100", 6144).topology.levels[-1].size == 2  # whole pods stay whole
