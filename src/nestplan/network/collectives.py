"""Alpha-beta costs of collectives over a group spanning several network levels.

A group is described by its fan-out per level (``Topology.fanout``): g[0] members
per node, g[1] nodes per leaf unit, ... Bandwidth follows the bus-bandwidth model
of nccl-tests (doc/PERFORMANCE.md): a ring all-reduce of S bytes over n ranks takes
    t = 2 (n - 1) / n * S / busbw,
and busbw is set by the slowest level the ring crosses. Crossing a unit of level
i-1, the ring's traffic shares the links of the group's members inside that unit,
    busbw_i = eff_i * bw_i / oversub_i * prod_{j < i} g[j],
so the slowest level dominates (hierarchical algorithms bound the same way). The
latency term counts ring steps per level: 2 * sum_i (g[i] - 1) * alpha_i
(Thakur, Rabenseifner & Gropp 2005, ring algorithms).

A level that is a full mesh of direct links (``Level.mesh_link_Bps``: 8 MI300X on
Infinity Fabric) gives bw_i = min(bandwidth, (g[i] - 1) * link) instead
(``Level.group_bandwidth_Bps``): each member sends its 1/g[i] share to every peer over
their own link at once, which moves the ring's (g - 1) / g of the data per member in
the time of one share on one link, so its busbw is (g[i] - 1) links' worth; a
point-to-point transfer gets one link.
"""

from __future__ import annotations

import math
from typing import Sequence

from nestplan.network.topology import Topology


def bus_bandwidth(topo: Topology, fanout: Sequence[int]) -> float:
    """Achievable bus bandwidth (B/s) of a ring over the group; inf for a single member."""
    span = topo.span_level(fanout)
    best = math.inf
    inner_members = 1
    for i, (level, g) in enumerate(zip(topo.levels, fanout)):
        crossed = g > 1 if i == 0 else i <= span
        if crossed:
            best = min(best, level.group_bandwidth_Bps(g) * inner_members)
        inner_members *= g
    return best


def _ring_latency(topo: Topology, fanout: Sequence[int]) -> float:
    return sum((g - 1) * level.latency_s for level, g in zip(topo.levels, fanout))


def all_reduce(topo: Topology, fanout: Sequence[int], nbytes: float) -> float:
    """Seconds for an all-reduce of ``nbytes`` (the buffer each member holds)."""
    n = math.prod(fanout)
    if n <= 1 or nbytes <= 0:
        return 0.0
    transfer = 2.0 * (n - 1) / n * nbytes / bus_bandwidth(topo, fanout)
    return transfer + 2.0 * _ring_latency(topo, fanout)


def reduce_scatter(topo: Topology, fanout: Sequence[int], nbytes: float) -> float:
    """Seconds for a reduce-scatter whose input buffer is ``nbytes`` per member."""
    n = math.prod(fanout)
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) / n * nbytes / bus_bandwidth(topo, fanout) + _ring_latency(topo, fanout)


def all_gather(topo: Topology, fanout: Sequence[int], nbytes: float) -> float:
    """Seconds for an all-gather whose gathered output is ``nbytes`` per member."""
    return reduce_scatter(topo, fanout, nbytes)


def all_to_all(topo: Topology, fanout: Sequence[int], nbytes: float, outer_scale: float = 1.0) -> float:
    """Seconds for an all-to-all where each member holds ``nbytes`` spread evenly over the group.

    Every member sends its own share through its own links at once, so no
    aggregation. Level 0 carries the share for the other members of the node,
    (g[0] - 1) / n; level i >= 1 carries everything that leaves the member's
    level-(i-1) unit, (n - prod_{j<i} g[j]) / n (in a tree the uplink sees all of
    it), at eff_i * bw_i / oversub_i (on a full mesh, the g[i] - 1 links each member
    sends its peers' shares over). The slowest level dominates. ``outer_scale``: the fraction of
    that outward traffic sent at levels i >= 1 (a dispatcher that sends a token once per remote
    unit instead of once per copy).
    """
    n = math.prod(fanout)
    if n <= 1 or nbytes <= 0:
        return 0.0
    slowest = 0.0
    inner = 1
    for i, (level, g) in enumerate(zip(topo.levels, fanout)):
        share = (g - 1) / n if i == 0 else outer_scale * (n - inner) / n
        if share > 0:
            slowest = max(slowest, share * nbytes / level.group_bandwidth_Bps(g))
        inner *= g
    return slowest + _ring_latency(topo, fanout)


def send_recv(topo: Topology, level: int, nbytes: float) -> float:
    """Seconds for a point-to-point transfer of ``nbytes`` between devices whose lowest common level is ``level``
    (over one link of a full mesh)."""
    if nbytes <= 0:
        return 0.0
    lv = topo.levels[level]
    return nbytes / lv.group_bandwidth_Bps(2) + lv.latency_s
