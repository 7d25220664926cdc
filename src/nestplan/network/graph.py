"""Levels of an arbitrary link graph, derived by widest (bottleneck) paths: :func:`from_graph`.

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
6. When the innermost units (of 3 or more devices) are full meshes, every pair of their
   devices joined by a direct link at least b_0 wide (8 MI300X on Infinity Fabric), level 0
   is a mesh: ``mesh_link_Bps`` = b_0 and ``bandwidth_Bps`` = (size - 1) * b_0, so that a
   collective over g of its devices uses their g - 1 links (``Level.group_bandwidth_Bps``),
   not one.

Bottleneck classes come from a Kruskal-style union-find sweep over the links,
widest first (O(E log E)); latencies from a NumPy Bellman-Ford from all devices
per level (O(levels * D * E * hop-diameter), a few seconds for thousands of nodes).
Oversubscription is not derived from a graph: every level gets 1. Ids are below
``MAX_GRAPH_NODES``, links at most ``MAX_GRAPH_EDGES``, and a graph whose latencies
would take more than ``MAX_RELAXATIONS`` Bellman-Ford cells is refused (ConfigError): by counting
(4 x devices x links) before a link is read, then when a hop count shows it, else when the sweep
runs out of its budget.

Re-exported from ``nestplan.network.builders`` and ``nestplan.network``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
import itertools
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from nestplan import units
from nestplan.errors import ConfigError
from nestplan.inputs import Fields
from nestplan.network._checks import SI_UNITS, FigureUnits, read_bus_efficiency, read_link
from nestplan.network.topology import Level, Topology


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
MAX_GRAPH_NODES = 2**14  # ids of devices and switches in one graph (node arrays are this long)
MAX_GRAPH_EDGES = 2**16  # links of one graph
# Bellman-Ford cells (sources x directed links, per sweep) the latencies of one graph may take: ~25 s on one core.
# A two-tier fat tree of 8,192 devices takes 1.6e9; a line of 2,048 devices would take ~2^33 (sweeps grow with hops).
MAX_RELAXATIONS = 2**31
GRAPH_KEYS = ("devices", "edges", "bus_efficiency")  # the required two first


def _too_much_work(where: str, limit: int) -> ConfigError:
    return ConfigError(
        f"{where}: deriving the levels' latencies needs more than {limit:.3g} link relaxations "
        "(devices x links x hops); describe this network with [[levels]] instead",
        field="edges",
        value="graph",
        limit=limit,
    )


@dataclass
class _Budget:
    """What is left of the relaxations one graph may take; ``spend`` refuses the graph once it runs out."""

    where: str
    left: int

    def __post_init__(self) -> None:
        self.limit = self.left

    def spend(self, cells: int) -> None:
        self.left -= cells
        if self.left < 0:
            raise _too_much_work(self.where, self.limit)


def _refuse_sure_overrun(where: str, n_dev: int, src: np.ndarray, dst: np.ndarray, limit: int) -> None:
    """Refuse at once a graph whose latencies are sure to take more than ``limit`` relaxations.

    ``src``/``dst`` are the outermost level's links. Bellman-Ford from a device takes at least as many
    sweeps as the device's eccentricity in hops, which is at least half the eccentricity of device 0
    (the radius); each sweep costs 2 x links cells per source, and every device is a source.
    A breadth-first search from device 0 stops as soon as that lower bound passes ``limit``.
    """
    heads, tails = np.concatenate([src, dst]), np.concatenate([dst, src])
    size = int(max(n_dev, heads.max() + 1))
    reached = np.zeros(size, dtype=bool)
    frontier = np.zeros(size, dtype=bool)
    reached[0] = frontier[0] = True
    hops = 0
    while frontier.any():
        if n_dev * len(heads) * -(-hops // 2) > limit:
            raise _too_much_work(where, limit)
        step = np.zeros(size, dtype=bool)
        step[tails[frontier[heads]]] = True
        frontier = step & ~reached
        reached |= frontier
        hops += 1


def _refuse_by_count(where: str, n_dev: int, n_links: int, limit: int) -> None:
    """Refuse, before any link is read, a graph whose latencies must take more than ``limit`` relaxations
    by counting alone: the outermost level's sweep relaxes both directions of its links for every device
    as a source, at least twice (one sweep that reaches, one that finds nothing better), so
    4 x devices x links, taken as if every link belonged to the outermost level (links narrower than
    every bottleneck are rare)."""
    if 4 * n_dev * n_links > limit:
        raise _too_much_work(where, limit)


def _read_edges(f: Fields, figures: FigureUnits, where: str, n_dev: int) -> tuple[np.ndarray, ...]:
    """The links of ``f``'s ``edges`` (1 to ``MAX_GRAPH_EDGES``) as arrays of ids, bytes/s and seconds;
    refused by their count first (:func:`_refuse_by_count`)."""
    links = f.listed("edges", MAX_GRAPH_EDGES, minimum=1)
    _refuse_by_count(where, n_dev, len(links.data), MAX_RELAXATIONS)
    us, vs, bws, lats = zip(*(read_link(links, key, figures, MAX_GRAPH_NODES - 1) for key in links.data))
    return (
        np.asarray(us, dtype=np.int64),
        np.asarray(vs, dtype=np.int64),
        np.asarray(bws, dtype=np.float64),
        np.asarray(lats, dtype=np.float64),
    )


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
    n_local: int,
    src: np.ndarray,
    dst: np.ndarray,
    lat: np.ndarray,
    sources: np.ndarray,
    inner: np.ndarray | None,
    budget: _Budget,
) -> float:
    """Largest shortest-path latency from ``sources`` to the other sources, skipping pairs whose ``inner``
    labels (per source, the unit of the level below) are equal.

    Bellman-Ford from all sources at once, in blocks, vectorised with NumPy: each
    sweep relaxes every link for every source of the block; the targets are marked per block, so memory
    stays within the block's cells.
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
            budget.spend(len(s2) * len(rows))
            best = np.minimum.reduceat(dist[s2] + w2[:, None], starts, axis=0)
            current = dist[heads]
            better = best < current
            if not better.any():
                break
            dist[heads] = np.where(better, best, current)
        mask = np.zeros((len(rows), n_local), dtype=bool)
        mask[:, sources] = True if inner is None else inner[rows, None] != inner[None, :]
        if mask.any():
            worst = max(worst, float(dist.T[mask].max()))
    return worst


def _max_latency_within_units(
    n_dev: int,
    src: np.ndarray,
    dst: np.ndarray,
    lat: np.ndarray,
    node_labels: np.ndarray,
    inner_labels: np.ndarray | None,
    budget: _Budget,
) -> float:
    """Largest shortest-path latency, over the given links, between two devices of one unit.

    ``node_labels`` gives every node's unit (connected component of these links);
    each unit is solved on its own nodes and links. Device pairs that share a unit
    of ``inner_labels`` (the level below) are skipped.
    """
    edge_label = node_labels[src]
    edge_order = np.argsort(edge_label, kind="stable")
    edge_units, edge_starts = np.unique(edge_label[edge_order], return_index=True)
    edge_bounds = dict(
        zip(edge_units.tolist(), zip(edge_starts.tolist(), np.append(edge_starts[1:], len(edge_order)).tolist()))
    )
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
        inner = None if inner_labels is None else inner_labels[devices]
        worst = max(worst, _bellman_ford_max(len(nodes), local_src, local_dst, lat[e], sources, inner, budget))
    return worst


# ---------------------------------------------------------------------------
# from_graph, step by step


def _find(parent: np.ndarray, x: int) -> int:
    """Union-find root of ``x``, compressing the path on the way."""
    root = x
    while parent[root] != root:
        root = parent[root]
    while parent[x] != root:
        parent[x], x = root, parent[x]
    return int(root)


def _sweep_levels(
    n_dev: int,
    n_nodes: int,
    src: np.ndarray,
    dst: np.ndarray,
    order: np.ndarray,
    cls: np.ndarray,
) -> tuple[list[int], list[np.ndarray], np.ndarray]:
    """Kruskal-style union-find sweep over the links, one bandwidth class at a time, widest first.

    A class that joins two components holding devices starts a level. Returns
    (bandwidth class of each level, per level the unit (component root) of every node,
    the union-find parent array after the whole sweep).
    """
    parent = np.arange(n_nodes)
    has_devices = np.zeros(n_nodes, dtype=bool)
    has_devices[:n_dev] = True
    level_classes: list[int] = []
    level_labels: list[np.ndarray] = []
    for c in range(int(cls[-1]) + 1):
        merged_devices = False
        for e in order[cls == c]:
            ru, rv = _find(parent, int(src[e])), _find(parent, int(dst[e]))
            if ru == rv:
                continue
            if has_devices[ru] and has_devices[rv]:
                merged_devices = True
            parent[ru] = rv
            has_devices[rv] |= has_devices[ru]
        if merged_devices:
            level_classes.append(c)
            level_labels.append(np.array([_find(parent, x) for x in range(n_nodes)]))
    return level_classes, level_labels, parent


def _check_connected(where: str, n_dev: int, level_labels: list[np.ndarray], parent: np.ndarray) -> None:
    """Raise a ConfigError naming an unreachable device unless the outermost level joins all devices."""
    if level_labels and len(np.unique(level_labels[-1][:n_dev])) == 1:
        return
    labels = np.array([_find(parent, d) for d in range(n_dev)])
    apart = [d for d in range(n_dev) if labels[d] != labels[0]]
    raise ConfigError(
        f"{where}: devices are not all connected; e.g. device {apart[0]} cannot reach device 0 "
        f"({len(apart)} device(s) unreachable)",
        field="edges",
        value=apart[:8],
    )


def _unit_device_counts(where: str, n_dev: int, level_labels: list[np.ndarray], level_bw: list[float]) -> list[int]:
    """Devices per unit of every level; a ConfigError if one level's units differ in size."""
    unit_devices: list[int] = []
    for i, labels in enumerate(level_labels):
        counts = np.unique(labels[:n_dev], return_counts=True)[1]
        sizes = sorted({int(k) for k in counts})
        if len(sizes) > 1:
            raise ConfigError(
                f"{where}: level {i} (links >= {level_bw[i] / units.GB:g} GB/s) groups devices into units of "
                f"unequal sizes {sizes}; every unit of a level must hold the same number of devices",
                field="edges",
                value=sizes,
                limit="equal unit sizes",
            )
        unit_devices.append(sizes[0])
    return unit_devices


def _rank_order(n_dev: int, n_nodes: int, level_labels: list[np.ndarray]) -> np.ndarray:
    """Device ids in rank order, so that every unit of every level is a contiguous block of ranks.

    Lexicographic by (top unit, ..., level-0 unit, device id); a unit's key is its smallest device id.
    """
    device_ids = np.arange(n_dev)
    keys = [device_ids]
    for labels in level_labels:
        smallest = np.full(n_nodes, n_dev, dtype=np.int64)
        np.minimum.at(smallest, labels[:n_dev], device_ids)
        keys.append(smallest[labels[:n_dev]])
    return np.lexsort(tuple(keys))


def _level_latencies(
    n_dev: int,
    src: np.ndarray,
    dst: np.ndarray,
    lat: np.ndarray,
    order: np.ndarray,
    cls: np.ndarray,
    level_classes: list[int],
    level_labels: list[np.ndarray],
    budget: _Budget,
) -> list[float]:
    """Per level, the largest widest-path latency between two devices of one unit (never below the level under it)."""
    latencies: list[float] = []
    previous_latency = 0.0
    for i, c in enumerate(level_classes):
        edge_ids = order[cls <= c]
        inner = level_labels[i - 1][:n_dev] if i > 0 else None
        latency = max(
            previous_latency,
            _max_latency_within_units(
                n_dev, src[edge_ids], dst[edge_ids], lat[edge_ids], level_labels[i], inner, budget
            ),
        )
        previous_latency = latency
        latencies.append(latency)
    return latencies


def _is_full_mesh(n_dev: int, src: np.ndarray, dst: np.ndarray, labels: np.ndarray, unit_size: int) -> bool:
    """True when the given links join the devices of every unit (``labels``, ``unit_size`` devices each)
    pairwise by direct device-to-device links: a full mesh, no switch between them. Units of two devices
    answer False (one link, a switched level costs it the same)."""
    if unit_size < 3:
        return False
    direct = (src < n_dev) & (dst < n_dev)
    heads, tails = src[direct], dst[direct]
    inside = labels[heads] == labels[tails]
    pairs = {(min(a, b), max(a, b)) for a, b in zip(heads[inside].tolist(), tails[inside].tolist())}
    return len(pairs) == n_dev // unit_size * (unit_size * (unit_size - 1) // 2)


def _as_mesh(level: Level) -> Level:
    """``level`` (its bandwidth one link's) as the full mesh it is: each device's ``size - 1`` links together."""
    return replace(level, bandwidth_Bps=(level.size - 1) * level.bandwidth_Bps, mesh_link_Bps=level.bandwidth_Bps)


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

    Derivation, limits and cost: the module docstring.

    Returns a :class:`GraphTopology`: the topology over ranks and ``device_order``
    (rank -> graph device id).
    """
    listed = edges if isinstance(edges, (str, bytes, Mapping)) else list(itertools.islice(edges, MAX_GRAPH_EDGES + 1))
    table = {"devices": num_devices, "edges": listed, "bus_efficiency": bus_efficiency}
    return read_graph(Fields(table, f"graph '{name}'"), name, SI_UNITS, rel_tol=rel_tol)


def read_graph(
    f: Fields, name: str, figures: FigureUnits, kinds: Mapping[str, float] | None = None, rel_tol: float = 1e-9
) -> GraphTopology:
    """:func:`from_graph` of a graph table (``devices``, ``edges`` in ``figures``, ``bus_efficiency`` or with
    ``kinds`` a ``kind``), every field checked by the network's one reader (``network._checks``)."""
    f.refuse_unknown(GRAPH_KEYS + (("kind",) if kinds is not None else ()))
    f.require(GRAPH_KEYS[:2])
    where = f"graph '{name}'"
    n_dev = f.integer("devices", MAX_GRAPH_NODES, minimum=2)
    src, dst, bw, lat = _read_edges(f, figures, where, n_dev)
    eff = read_bus_efficiency(f, kinds)
    n_nodes = int(max(n_dev, src.max() + 1, dst.max() + 1))

    order, cls = _bandwidth_classes(bw, rel_tol)
    level_classes, level_labels, parent = _sweep_levels(n_dev, n_nodes, src, dst, order, cls)
    _check_connected(where, n_dev, level_labels, parent)

    sorted_bw = bw[order]
    level_bw = [float(sorted_bw[np.argmax(cls == c)]) for c in level_classes]
    unit_devices = _unit_device_counts(where, n_dev, level_labels, level_bw)
    device_order = _rank_order(n_dev, n_nodes, level_labels)
    outer = order[cls <= level_classes[-1]]
    _refuse_sure_overrun(where, n_dev, src[outer], dst[outer], MAX_RELAXATIONS)
    latencies = _level_latencies(
        n_dev, src, dst, lat, order, cls, level_classes, level_labels, _Budget(where, MAX_RELAXATIONS)
    )

    levels = [
        Level(
            name=f"level{i}",
            size=unit_devices[i] // (unit_devices[i - 1] if i else 1),
            bandwidth_Bps=level_bw[i],
            latency_s=latencies[i],
            oversubscription=1.0,
            bus_efficiency=eff,
        )
        for i in range(len(level_classes))
    ]
    inner = order[cls <= level_classes[0]]
    if _is_full_mesh(n_dev, src[inner], dst[inner], level_labels[0], unit_devices[0]):
        levels[0] = _as_mesh(levels[0])
    return GraphTopology(Topology(name, tuple(levels)), tuple(int(d) for d in device_order))
