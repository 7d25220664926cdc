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

Adjacent levels with equal links (``Level.links``: an 8-GPU NVLink node drawn as two
levels of 4) are one network drawn in two steps: every collective costs its group on
the topology with one level per network (``Topology.one_level_per_network``), so that
no cost depends on how a network is drawn. Drawn as two levels, the all-to-all's inner
level would carry only the traffic staying in its half while the outer one carried the
rest at the same time, as if they were two sets of links (Mixtral's expert all-to-all
fell 44% that way), and the ring's latency would count 3 + 1 steps instead of 7.
"""

from __future__ import annotations

import math
from typing import Sequence

from nestplan.network.topology import Topology


def per_network(topo: Topology, fanout: Sequence[int]) -> tuple[Topology, Sequence[int]]:
    """``topo`` with one level per network and the group's fan-out on it: members per unit of the merged
    levels, the product of the fan-outs of the levels each merges (``Topology.one_level_per_network``)."""
    merged = topo.one_level_per_network
    if merged is None:
        return topo, fanout
    bounds, joined = merged
    return joined, tuple(math.prod(fanout[a:b]) for a, b in zip(bounds, bounds[1:]))


def bus_bandwidth(topo: Topology, fanout: Sequence[int]) -> float:
    """Achievable bus bandwidth (B/s) of a ring over the group; inf for a single member."""
    return _bus_bandwidth(*per_network(topo, fanout))


def _bus_bandwidth(topo: Topology, fanout: Sequence[int]) -> float:
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
    topo, fanout = per_network(topo, fanout)
    transfer = 2.0 * (n - 1) / n * nbytes / _bus_bandwidth(topo, fanout)
    return transfer + 2.0 * _ring_latency(topo, fanout)


def reduce_scatter(topo: Topology, fanout: Sequence[int], nbytes: float) -> float:
    """Seconds for a reduce-scatter whose input buffer is ``nbytes`` per member."""
    n = math.prod(fanout)
    if n <= 1 or nbytes <= 0:
        return 0.0
    topo, fanout = per_network(topo, fanout)
    return (n - 1) / n * nbytes / _bus_bandwidth(topo, fanout) + _ring_latency(topo, fanout)


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
    topo, fanout = per_network(topo, fanout)
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
    (over one link of a full mesh); levels merged by ``per_network`` have the same links, so ``level`` as
    drawn gives the same figures."""
    if nbytes <= 0:
        return 0.0
    lv = topo.levels[level]
    return nbytes / lv.group_bandwidth_Bps(2) + lv.latency_s
