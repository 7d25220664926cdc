"""Networks: hierarchical levels, builders for common topologies, collective costs."""

from nestplan.network.builders import GraphTopology, fat_tree, from_graph, hierarchical, spine_leaf, torus
from nestplan.network.collectives import (
    all_gather,
    all_reduce,
    all_to_all,
    bus_bandwidth,
    reduce_scatter,
    send_recv,
)
from nestplan.network.topology import Level, Topology

__all__ = [
    "GraphTopology",
    "Level",
    "Topology",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "bus_bandwidth",
    "fat_tree",
    "from_graph",
    "hierarchical",
    "reduce_scatter",
    "send_recv",
    "spine_leaf",
    "torus",
]
