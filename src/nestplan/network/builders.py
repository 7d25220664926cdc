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

from typing import Any, Mapping, Sequence

import numpy as np

from nestplan.errors import ConfigError
from nestplan.inputs import Fields
from nestplan.network._checks import SI_UNITS, FigureUnits, read_bus_efficiency, read_level
from nestplan.network.graph import GraphTopology as GraphTopology  # re-exported: the graph builder lives in graph.py
from nestplan.network.graph import from_graph as from_graph
from nestplan.network.topology import MAX_DEVICES, MAX_LEVELS, Level, Topology

_SWITCH_TIER_NAMES = ("leaf", "spine", "core")
_TORUS_AXIS_NAMES = ("x", "y", "z")


# ---------------------------------------------------------------------------
# small validators (a level's and a link's figures are read by _checks.py)


def _same_length(where: str, **seqs: Sequence[Any]) -> None:
    lengths = {key: len(seq) for key, seq in seqs.items()}
    if len(set(lengths.values())) > 1:
        described = ", ".join(f"{key} has {n}" for key, n in lengths.items())
        raise ConfigError(
            f"{where}: one entry per switch tier expected, but {described}", field=next(iter(lengths)), value=lengths
        )


# ---------------------------------------------------------------------------
# hierarchical, fat tree, spine-leaf


def hierarchical(name: str, levels: Sequence[Mapping[str, Any] | Level]) -> Topology:
    """A topology from level descriptions, innermost first.

    Each entry is a :class:`Level` or a mapping with keys ``name``, ``size``,
    ``bandwidth_Bps`` (per device, one direction), ``latency_s`` and optionally
    ``oversubscription`` (default 1), ``bus_efficiency`` (default 1) and ``mesh_link_Bps``
    (the link of a full mesh, see :class:`Level`; default None, a switched level), read by the
    network's one level reader (``network._checks.read_level``, as a cluster file's levels are):
    unknown and missing keys refused by name, every figure within its range.
    """
    entries = Fields({"levels": list(levels)}, f"topology '{name}'").listed("levels", MAX_LEVELS, minimum=1)
    built = [
        spec if isinstance(spec, Level) else read_level(entries.table(key), SI_UNITS)
        for key, spec in entries.data.items()
    ]
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
    levels: list[dict[str, Any]] = [
        dict(
            name="node",
            size=devices_per_node,
            bandwidth_Bps=node_bandwidth_Bps,
            latency_s=node_latency_s,
            bus_efficiency=node_bus_efficiency,
        )
    ]
    for i, (radix, bw, lat) in enumerate(zip(switch_radix_per_level, bandwidths, latencies)):
        levels.append(
            dict(
                name=_tier_name(i),
                size=radix,
                bandwidth_Bps=bw,
                latency_s=lat,
                oversubscription=1.0,
                bus_efficiency=bus_efficiency,
            )
        )
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
        raise ConfigError(
            f"{where}: latencies needs 3 values (node, leaf, spine), got {len(latencies)}",
            field="latencies",
            value=list(latencies),
            limit=3,
        )
    node_lat, leaf_lat, spine_lat = latencies
    return hierarchical(
        name,
        [
            dict(
                name="node",
                size=devices_per_node,
                bandwidth_Bps=node_bw,
                latency_s=node_lat,
                bus_efficiency=node_bus_efficiency,
            ),
            dict(
                name="leaf",
                size=nodes_per_leaf,
                bandwidth_Bps=leaf_bw,
                latency_s=leaf_lat,
                bus_efficiency=bus_efficiency,
            ),
            dict(
                name="spine",
                size=leaves,
                bandwidth_Bps=spine_bw,
                latency_s=spine_lat,
                oversubscription=oversubscription,
                bus_efficiency=bus_efficiency,
            ),
        ],
    )


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
    sized = list(dims) if isinstance(dims, (Sequence, np.ndarray)) and not isinstance(dims, (str, bytes)) else dims
    table = {
        "dims": sized,
        "link_bandwidth_Bps": link_bandwidth_Bps,
        "hop_latency_s": hop_latency_s,
        "bus_efficiency": bus_efficiency,
    }
    return read_torus(Fields(table, f"torus '{name}'"), name, SI_UNITS)


def read_torus(f: Fields, name: str, figures: FigureUnits, kinds: Mapping[str, float] | None = None) -> Topology:
    """:func:`torus` of a torus table (``dims``, ``link_bandwidth`` and ``hop_latency`` in ``figures``,
    ``bus_efficiency`` or with ``kinds`` a ``kind``), every field checked by the network's one reader."""
    keys = ("dims", f"link_bandwidth_{figures.bandwidth}", f"hop_latency_{figures.latency}", "bus_efficiency")
    f.refuse_unknown(keys + (("kind",) if kinds is not None else ()))
    f.require(keys[:3])
    dims = f.listed("dims", MAX_LEVELS, minimum=1)
    sizes = [dims.integer(key, MAX_DEVICES) for key in dims.data]
    bandwidth = 2.0 * figures.bandwidth_Bps(f, keys[1])
    hop = figures.latency_s(f, keys[2])
    efficiency = read_bus_efficiency(f, kinds)
    levels = []
    for i, size in enumerate(sizes):
        axis = _TORUS_AXIS_NAMES[i] if i < len(_TORUS_AXIS_NAMES) else f"dim{i}"
        levels.append(
            Level(
                name=axis,
                size=size,
                bandwidth_Bps=bandwidth,
                latency_s=hop * (size // 2),
                oversubscription=1.0,
                bus_efficiency=efficiency,
            )
        )
    return Topology(name, tuple(levels))
