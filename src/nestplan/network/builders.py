"""Builders that turn common network descriptions into a :class:`Topology`.

Every builder takes SI units (B/s, s); unit-suffixed file fields are converted
where the file is read (``nestplan.cluster``). Levels come out innermost first.

- :func:`hierarchical`: levels given one by one.
- :func:`fat_tree`: a non-blocking tree of switch tiers above the node.
- :func:`spine_leaf`: node, leaf, spine, with the leaf uplinks oversubscribed.
- :func:`torus`: 1-, 2- or 3-D tori, one level per dimension (NEST Appendix B.2).
- :func:`from_graph`: levels derived from an arbitrary link graph by widest paths.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from nestplan import units
from nestplan.errors import ConfigError
from nestplan.network.topology import Level, Topology

_LEVEL_KEYS = ("name", "size", "bandwidth_Bps", "latency_s", "oversubscription", "bus_efficiency")
_LEVEL_REQUIRED = ("name", "size", "bandwidth_Bps", "latency_s")
_SWITCH_TIER_NAMES = ("leaf", "spine", "core")
_TORUS_AXIS_NAMES = ("x", "y", "z")


# ---------------------------------------------------------------------------
# small validators (messages name the field, the value and what is allowed)


def _as_int(value: Any, field: str, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{where}: {field} must be an integer >= {minimum}, got {value!r}",
                          field=field, value=value, limit=f">= {minimum}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ConfigError(f"{where}: {field} must be an integer >= {minimum}, got {value!r}",
                          field=field, value=value, limit=f">= {minimum}") from None
    if number < minimum:
        raise ConfigError(f"{where}: {field} must be an integer >= {minimum}, got {number}",
                          field=field, value=number, limit=f">= {minimum}")
    return int(number)


def _as_float(value: Any, field: str, where: str, *, positive: bool) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    number = float(value) if ok else math.nan
    if not ok or not math.isfinite(number) or number < 0 or (positive and number == 0):
        allowed = "> 0" if positive else ">= 0"
        raise ConfigError(f"{where}: {field} must be a finite number {allowed}, got {value!r}",
                          field=field, value=value, limit=allowed)
    return number


def _same_length(where: str, **seqs: Sequence[Any]) -> None:
    lengths = {key: len(seq) for key, seq in seqs.items()}
    if len(set(lengths.values())) > 1:
        described = ", ".join(f"{key} has {n}" for key, n in lengths.items())
        raise ConfigError(f"{where}: one entry per switch tier expected, but {described}",
                          field=next(iter(lengths)), value=lengths)


# ---------------------------------------------------------------------------
# hierarchical, fat tree, spine-leaf


def hierarchical(name: str, levels: Sequence[Mapping[str, Any] | Level]) -> Topology:
    """A topology from level descriptions, innermost first.

    Each entry is a :class:`Level` or a mapping with keys ``name``, ``size``,
    ``bandwidth_Bps`` (per device, one direction), ``latency_s`` and optionally
    ``oversubscription`` (default 1) and ``bus_efficiency`` (default 1).
    """
    where = f"topology '{name}'"
    if not levels:
        raise ConfigError(f"{where}: needs at least one level", field="levels", value=[], limit=">= 1 level")
    built: list[Level] = []
    for i, spec in enumerate(levels):
        if isinstance(spec, Level):
            built.append(spec)
            continue
        at = f"{where}: levels[{i}]"
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{at} must be a table of level fields, got {spec!r}", field=f"levels[{i}]", value=spec)
        unknown = sorted(set(spec) - set(_LEVEL_KEYS))
        if unknown:
            raise ConfigError(f"{at}: unknown key '{unknown[0]}'; allowed: {', '.join(_LEVEL_KEYS)}",
                              field=unknown[0], limit=list(_LEVEL_KEYS))
        missing = [key for key in _LEVEL_REQUIRED if key not in spec]
        if missing:
            raise ConfigError(f"{at}: missing field '{missing[0]}'; required: {', '.join(_LEVEL_REQUIRED)}",
                              field=missing[0], limit=list(_LEVEL_REQUIRED))
        built.append(Level(
            name=str(spec["name"]),
            size=_as_int(spec["size"], "size", at),
            bandwidth_Bps=_as_float(spec["bandwidth_Bps"], "bandwidth", at, positive=True),
            latency_s=_as_float(spec["latency_s"], "latency", at, positive=False),
            oversubscription=_as_float(spec.get("oversubscription", 1.0), "oversubscription", at, positive=True),
            bus_efficiency=_as_float(spec.get("bus_efficiency", 1.0), "bus_efficiency", at, positive=True),
        ))
    return Topology(name, tuple(built))


def _tier_name(i: int) -> str:
    return _SWITCH_TIER_NAMES[i] if i < len(_SWITCH_TIER_NAMES) else f"tier{i + 1}"


def fat_tree(
    name: str,
    devices_per_node: int,
    node_bandwidth_Bps: float,
    node_latency_s: float,
    switch_radix_per_level: Sequence[int],
    bandwidths: Sequence[float],
    latencies: Sequence[float],
    *,
    node_bus_efficiency: float = 1.0,
    bus_efficiency: float = 1.0,
) -> Topology:
    """A non-blocking (full-bisection) fat tree: node, then one level per switch tier.

    ``switch_radix_per_level[i]`` is the number of units of the level below that one
    unit of switch tier i joins (its down-facing fan-out: nodes per leaf group, leaf
    groups per spine group, ...); ``bandwidths[i]``/``latencies[i]`` are the per-device
    bandwidth and the latency across tier i. Every level has oversubscription 1.
    Tiers are named leaf, spine, core, then tier4, tier5, ...
    """
    where = f"fat tree '{name}'"
    _same_length(where, switch_radix_per_level=switch_radix_per_level, bandwidths=bandwidths, latencies=latencies)
    levels: list[dict[str, Any]] = [dict(name="node", size=devices_per_node, bandwidth_Bps=node_bandwidth_Bps,
                                         latency_s=node_latency_s, bus_efficiency=node_bus_efficiency)]
    for i, (radix, bw, lat) in enumerate(zip(switch_radix_per_level, bandwidths, latencies)):
        levels.append(dict(name=_tier_name(i), size=radix, bandwidth_Bps=bw, latency_s=lat,
                           oversubscription=1.0, bus_efficiency=bus_efficiency))
    return hierarchical(name, levels)


def spine_leaf(
    name: str,
    devices_per_node: int,
    nodes_per_leaf: int,
    leaves: int,
    node_bw: float,
    leaf_bw: float,
    spine_bw: float,
    latencies: Sequence[float],
    oversubscription: float = 1.0,
    *,
    node_bus_efficiency: float = 1.0,
    bus_efficiency: float = 1.0,
) -> Topology:
    """Node, leaf and spine levels: ``leaves`` leaf switches of ``nodes_per_leaf`` nodes each.

    ``node_bw``, ``leaf_bw``, ``spine_bw`` are per-device bandwidths (B/s) across each
    level, ``latencies`` the three latencies (s, node first). ``oversubscription`` is the
    leaf's downlink-to-uplink capacity ratio and applies to the spine level (3.0 for a
    3:1 leaf; a "2:2" leaf, two uplinks for two downlinks' worth, is 1.0).
    """
    where = f"spine-leaf '{name}'"
    if len(latencies) != 3:
        raise ConfigError(f"{where}: latencies needs 3 values (node, leaf, spine), got {len(latencies)}",
                          field="latencies", value=list(latencies), limit=3)
    node_lat, leaf_lat, spine_lat = latencies
    return hierarchical(name, [
        dict(name="node", size=devices_per_node, bandwidth_Bps=node_bw, latency_s=node_lat,
             bus_efficiency=node_bus_efficiency),
        dict(name="leaf", size=nodes_per_leaf, bandwidth_Bps=leaf_bw, latency_s=leaf_lat,
             bus_efficiency=bus_efficiency),
        dict(name="spine", size=leaves, bandwidth_Bps=spine_bw, latency_s=spine_lat,
             oversubscription=oversubscription, bus_efficiency=bus_efficiency),
    ])


# ---------------------------------------------------------------------------
# torus


def torus(
    name: str,
    dims: Sequence[int],
    link_bandwidth_Bps: float,
    hop_latency_s: float,
    bus_efficiency: float = 1.0,
) -> Topology:
    """A torus (wrap-around mesh) as levels of hop-distance classes (NEST Appendix B.2).

    NEST maps a torus onto levels by coordinate affinity: devices that share more
    coordinates are "closer". Here, with ranks ordered first dimension fastest
    (rank = x + X*(y + Y*z)):

    - level i is a ring along dimension i: a level-i unit is the set of devices
      that agree on every coordinate above i, so ``size = dims[i]`` and level 0 is
      a line of ``dims[0]`` consecutive ranks;
    - per-device bandwidth across level i is ``2 * link_bandwidth_Bps``: a device has
      two links in each dimension (one per ring direction) and a bidirectional ring
      collective uses both; a collective over several dimensions runs one ring phase
      per dimension, which is what the hierarchical collective model computes;
    - latency of level i is ``hop_latency_s * (dims[i] // 2)``, the largest hop
      distance inside one ring of that dimension (a ring of 1 has no hop).

    Every level has oversubscription 1. Axes are named x, y, z (then dim3, ...).
    Any number of dimensions >= 1 is accepted (1 = a ring); TPU-style pods are 2-D or 3-D.
    """
    where = f"torus '{name}'"
    if isinstance(dims, (str, bytes)) or not isinstance(dims, (Sequence, np.ndarray)) or len(dims) < 1:
        raise ConfigError(f"{where}: dims must be a list of 1 to 3 (or more) integers, got {dims!r}",
                          field="dims", value=dims, limit="[X, Y] or [X, Y, Z]")
    sizes = [_as_int(d, f"dims[{i}]", where) for i, d in enumerate(dims)]
    bandwidth = 2.0 * _as_float(link_bandwidth_Bps, "link bandwidth", where, positive=True)
    hop = _as_float(hop_latency_s, "hop latency", where, positive=False)
    levels = []
    for i, size in enumerate(sizes):
        axis = _TORUS_AXIS_NAMES[i] if i < len(_TORUS_AXIS_NAMES) else f"dim{i}"
        levels.append(dict(name=axis, size=size, bandwidth_Bps=bandwidth, latency_s=hop * (size // 2),
                           oversubscription=1.0, bus_efficiency=bus_efficiency))
    return hierarchical(name, levels)


# ---------------------------------------------------------------------------
# arbitrary graphs


@dataclass(frozen=True)
class GraphTopology:
    """Result of :func:`from_graph`.

    topology: the derived levels, over ranks 0..N-1.
    device_order: ``device_order[rank]`` is the graph's device id that runs rank
        ``rank``; the identity when the graph's numbering already makes every unit a
        contiguous block of ranks.
    """

    topology: Topology
    device_order: tuple[int, ...]

    @property
    def renumbered(self) -> bool:
        return any(rank != device for rank, device in enumerate(self.device_order))


_BF_BUDGET = 4_000_000  # float64 cells per Bellman-Ford block (32 MB)


def _parse_edges(name: str, num_devices: int, edges: Iterable[Sequence[Any]]) -> tuple[np.ndarray, ...]:
    where = f"graph '{name}'"
    us, vs, bws, lats = [], [], [], []
    for i, edge in enumerate(edges):
        at = f"{where}: edges[{i}]"
        if isinstance(edge, (str, bytes)) or not isinstance(edge, Sequence) or len(edge) != 4:
            raise ConfigError(f"{at} must be [u, v, bandwidth, latency], got {edge!r}",
                              field=f"edges[{i}]", value=edge, limit="[u, v, bandwidth, latency]")
        u = _as_int(edge[0], "u", at, minimum=0)
        v = _as_int(edge[1], "v", at, minimum=0)
        if u == v:
            raise ConfigError(f"{at}: a link joins two different ids, got u = v = {u}", field=f"edges[{i}]", value=edge)
        us.append(u)
        vs.append(v)
        bws.append(_as_float(edge[2], "bandwidth", at, positive=True))
        lats.append(_as_float(edge[3], "latency", at, positive=False))
    if not us:
        raise ConfigError(f"{where}: edges is empty; give at least one link", field="edges", value=[], limit=">= 1 link")
    return (np.asarray(us, dtype=np.int64), np.asarray(vs, dtype=np.int64),
            np.asarray(bws, dtype=np.float64), np.asarray(lats, dtype=np.float64))


def _bandwidth_classes(bw: np.ndarray, rel_tol: float) -> tuple[np.ndarray, np.ndarray]:
    """Sort edges by bandwidth, widest first, and group values equal within ``rel_tol``.

    Returns (edge order, class index per sorted edge); class 0 is the widest.
    """
    order = np.argsort(-bw, kind="stable")
    sorted_bw = bw[order]
    cls = np.zeros(len(order), dtype=np.int64)
    representative = sorted_bw[0]
    current = 0
    for k in range(1, len(order)):
        if sorted_bw[k] < representative * (1.0 - rel_tol):
            current += 1
            representative = sorted_bw[k]
        cls[k] = current
    return order, cls


def _bellman_ford_max(
    n_local: int, src: np.ndarray, dst: np.ndarray, lat: np.ndarray, sources: np.ndarray,
    targets_mask: np.ndarray,
) -> float:
    """Largest shortest-path latency from ``sources`` to the targets ``targets_mask`` marks (per source row).

    Bellman-Ford from all sources at once, in blocks, vectorised with NumPy: each
    sweep relaxes every link for every source of the block.
    """
    s2 = np.concatenate([src, dst])
    d2 = np.concatenate([dst, src])
    w2 = np.concatenate([lat, lat])
    order = np.argsort(d2, kind="stable")
    s2, d2, w2 = s2[order], d2[order], w2[order]
    heads, starts = np.unique(d2, return_index=True)
    block = max(1, min(len(sources), _BF_BUDGET // max(len(s2), n_local)))
    worst = 0.0
    for first in range(0, len(sources), block):
        rows = np.arange(first, min(first + block, len(sources)))
        # dist[node, source]: rows of one node are contiguous, so gathers and reduceat stream
        dist = np.full((n_local, len(rows)), np.inf)
        dist[sources[rows], np.arange(len(rows))] = 0.0
        for _ in range(n_local):
            best = np.minimum.reduceat(dist[s2] + w2[:, None], starts, axis=0)
            current = dist[heads]
            better = best < current
            if not better.any():
                break
            dist[heads] = np.where(better, best, current)
        mask = targets_mask[rows]
        if mask.any():
            worst = max(worst, float(dist.T[mask].max()))
    return worst


def _max_latency_within_units(
    n_dev: int, src: np.ndarray, dst: np.ndarray, lat: np.ndarray, node_labels: np.ndarray,
    inner_labels: np.ndarray | None,
) -> float:
    """Largest shortest-path latency, over the given links, between two devices of one unit.

    ``node_labels`` gives every node's unit (connected component of these links);
    each unit is solved on its own nodes and links. Device pairs that share a unit
    of ``inner_labels`` (the level below) are skipped.
    """
    edge_label = node_labels[src]
    edge_order = np.argsort(edge_label, kind="stable")
    edge_units, edge_starts = np.unique(edge_label[edge_order], return_index=True)
    edge_bounds = dict(zip(edge_units.tolist(), zip(edge_starts.tolist(),
                                                    np.append(edge_starts[1:], len(edge_order)).tolist())))
    device_units = np.unique(node_labels[:n_dev])
    worst = 0.0
    for unit in device_units.tolist():
        nodes = np.flatnonzero(node_labels == unit)
        devices = nodes[nodes < n_dev]
        if len(devices) < 2 or unit not in edge_bounds:
            continue
        lo, hi = edge_bounds[unit]
        e = edge_order[lo:hi]
        local_src = np.searchsorted(nodes, src[e])
        local_dst = np.searchsorted(nodes, dst[e])
        sources = np.searchsorted(nodes, devices)
        targets = np.zeros((len(devices), len(nodes)), dtype=bool)
        targets[:, sources] = True
        if inner_labels is not None:
            inner = inner_labels[devices]
            targets[:, sources] &= inner[:, None] != inner[None, :]
        worst = max(worst, _bellman_ford_max(len(nodes), local_src, local_dst, lat[e], sources, targets))
    return worst


def from_graph(
    name: str,
    num_devices: int,
    edges: Iterable[Sequence[Any]],
    *,
    bus_efficiency: float = 1.0,
    rel_tol: float = 1e-9,
) -> GraphTopology:
    """Levels of an arbitrary network given as links ``(u, v, bandwidth_Bps, latency_s)``.

    Ids ``0 .. num_devices-1`` are devices; any larger id is a switch. Links are
    undirected; parallel links are not aggregated (give a bonded link as one edge).

    Derivation:

    1. For every device pair, the widest path is the one whose narrowest link (its
       bottleneck bandwidth) is widest; its latency is the smallest total latency of
       the paths that achieve that bottleneck.
    2. The distinct bottleneck bandwidths over device pairs, widest first (values
       within ``rel_tol`` are equal), are the levels' bandwidths b_0 > b_1 > ...
    3. A level-i unit is a set of devices connected by paths whose links are all at
       least b_i wide (a connected component of the links >= b_i, restricted to
       devices). Such units nest; all units of a level must hold the same number of
       devices, otherwise a ConfigError names the sizes found.
    4. The latency of level i is the largest widest-path latency between two devices
       of one level-i unit (so it never falls below level i-1's).
    5. Ranks are ordered so that every unit is a contiguous block: units are ordered
       by their smallest device id, devices inside the innermost unit by id.

    Bottleneck classes come from a Kruskal-style union-find sweep over the links,
    widest first (O(E log E)); latencies from a NumPy Bellman-Ford from all devices
    per level (O(levels * D * E * hop-diameter), a few seconds for thousands of nodes).
    Oversubscription is not derived from a graph: every level gets 1.

    Returns a :class:`GraphTopology`: the topology over ranks and ``device_order``
    (rank -> graph device id).
    """
    where = f"graph '{name}'"
    n_dev = _as_int(num_devices, "devices", where, minimum=2)
    eff = _as_float(bus_efficiency, "bus_efficiency", where, positive=True)
    src, dst, bw, lat = _parse_edges(name, n_dev, edges)
    n_nodes = int(max(n_dev, src.max() + 1, dst.max() + 1))

    order, cls = _bandwidth_classes(bw, rel_tol)
    parent = np.arange(n_nodes)
    has_devices = np.zeros(n_nodes, dtype=bool)
    has_devices[:n_dev] = True

    def find(x: int) -> int:
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return int(root)

    level_classes: list[int] = []
    level_labels: list[np.ndarray] = []  # per level: the unit (component root) of every node
    for c in range(int(cls[-1]) + 1):
        merged_devices = False
        for e in order[cls == c]:
            ru, rv = find(int(src[e])), find(int(dst[e]))
            if ru == rv:
                continue
            if has_devices[ru] and has_devices[rv]:
                merged_devices = True
            parent[ru] = rv
            has_devices[rv] |= has_devices[ru]
        if merged_devices:
            level_classes.append(c)
            level_labels.append(np.array([find(x) for x in range(n_nodes)]))

    if not level_labels or len(np.unique(level_labels[-1][:n_dev])) > 1:
        labels = np.array([find(d) for d in range(n_dev)])
        apart = [d for d in range(n_dev) if labels[d] != labels[0]]
        raise ConfigError(f"{where}: devices are not all connected; e.g. device {apart[0]} cannot reach device 0 "
                          f"({len(apart)} device(s) unreachable)", field="edges", value=apart[:8])

    sorted_bw = bw[order]
    level_bw = [float(sorted_bw[np.argmax(cls == c)]) for c in level_classes]
    unit_devices: list[int] = []
    for i, labels in enumerate(level_labels):
        counts = np.unique(labels[:n_dev], return_counts=True)[1]
        sizes = sorted({int(k) for k in counts})
        if len(sizes) > 1:
            raise ConfigError(
                f"{where}: level {i} (links >= {level_bw[i] / units.GB:g} GB/s) groups devices into units of "
                f"unequal sizes {sizes}; every unit of a level must hold the same number of devices",
                field="edges", value=sizes, limit="equal unit sizes")
        unit_devices.append(sizes[0])

    # rank order: lexicographic by (top unit, ..., level-0 unit, device id); a unit's key is its smallest device id
    device_ids = np.arange(n_dev)
    keys = [device_ids]
    for labels in level_labels:
        smallest = np.full(n_nodes, n_dev, dtype=np.int64)
        np.minimum.at(smallest, labels[:n_dev], device_ids)
        keys.append(smallest[labels[:n_dev]])
    device_order = np.lexsort(tuple(keys))

    levels: list[Level] = []
    previous_latency = 0.0
    for i, c in enumerate(level_classes):
        edge_ids = order[cls <= c]
        inner = level_labels[i - 1][:n_dev] if i > 0 else None
        latency = max(previous_latency, _max_latency_within_units(
            n_dev, src[edge_ids], dst[edge_ids], lat[edge_ids], level_labels[i], inner))
        previous_latency = latency
        size = unit_devices[i] // (unit_devices[i - 1] if i else 1)
        levels.append(Level(name=f"level{i}", size=size, bandwidth_Bps=level_bw[i], latency_s=latency,
                            oversubscription=1.0, bus_efficiency=eff))
    return GraphTopology(Topology(name, tuple(levels)), tuple(int(d) for d in device_order))
