"""A cluster: one accelerator type on a network of levels, read from the catalog or a file
(``cluster_from_dict``), and written back as a file's table (``cluster_to_dict``, its inverse).

File format (TOML, or JSON with the same structure; every field: docs/formats.md)::

    name = "my-cluster"
    accelerator = "h100-sxm-80gb"   # catalog name, or an [accelerator] table (fields of accelerators.toml)

    [[levels]]                      # innermost first; devices = product of sizes
    name = "node"
    size = 8
    bandwidth_GBps = 450            # per device, one direction, 1e9 B/s
    latency_us = 1
    kind = "nvlink4"                # optional: interconnects.toml key, gives bus_efficiency
    # bus_efficiency = 0.82         # optional instead of kind (default 1.0 when neither is given)
    # oversubscription = 1.0        # optional, >= 1 (default 1)
    # mesh_link_GBps = 64           # optional: the level is a full mesh of links of this bandwidth (each device
    #                               # reaches each peer directly); bandwidth_GBps is then its links together

Instead of ``[[levels]]`` a file may give exactly one of::

    [torus]                          # see nestplan.network.builders.torus
    dims = [4, 4, 4]
    link_bandwidth_GBps = 50
    hop_latency_us = 1
    kind = "ici"                     # or bus_efficiency = ...; optional

    [graph]                          # see nestplan.network.builders.from_graph
    devices = 4
    edges = [[0, 1, 100, 1], [1, 4, 25, 3], ...]   # [u, v, bandwidth_GBps, latency_us]; ids >= devices are switches
    kind = "infiniband"              # or bus_efficiency = ...; optional

Optional top-level ``source`` and ``notes`` strings document the file. Unit
conversion happens here only (through ``nestplan.units``). Files are read by
``nestplan.inputs`` (size, encoding, syntax, nesting, finite numbers, no control
characters); every field is then checked against its range below (``*_RANGE``), and
the devices of the whole network against ``nestplan.network.topology.MAX_DEVICES``.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from nestplan import units
from nestplan.catalog import data_file, entry_path, is_file, names, user_path
from nestplan.errors import ConfigError, brief
from nestplan.hardware.accelerator import Accelerator, accelerator_from_dict, load_accelerator
from nestplan.inputs import check_string, load_object
from nestplan.network.builders import from_graph, hierarchical, torus
from nestplan.network.graph import MAX_GRAPH_EDGES, MAX_GRAPH_NODES
from nestplan.network.topology import MAX_DEVICES, MAX_LEVELS, Level, Topology

_TOP_KEYS = ("name", "accelerator", "levels", "torus", "graph", "source", "notes")
_NETWORK_KEYS = ("levels", "torus", "graph")
_LEVEL_KEYS = (
    "name",
    "size",
    "bandwidth_GBps",
    "latency_us",
    "oversubscription",
    "kind",
    "bus_efficiency",
    "mesh_link_GBps",
)
_LEVEL_REQUIRED = ("name", "size", "bandwidth_GBps", "latency_us")
_TORUS_KEYS = ("dims", "link_bandwidth_GBps", "hop_latency_us", "kind", "bus_efficiency")
_TORUS_REQUIRED = ("dims", "link_bandwidth_GBps", "hop_latency_us")
_GRAPH_KEYS = ("devices", "edges", "kind", "bus_efficiency")
_GRAPH_REQUIRED = ("devices", "edges")
_SUFFIXES = (".toml", ".json")

# Closed ranges of a cluster file's figures: far beyond any network on both sides, so that every
# transfer time (bytes / bandwidth) stays a finite number.
BANDWIDTH_GBps_RANGE = (1e-3, 1e6)  # 1 MB/s to 1 PB/s per device and direction: NVLink 5 gives 900 GB/s
LATENCY_us_RANGE = (0.0, 1e6)  # up to one second per hop: real links take microseconds
OVERSUBSCRIPTION_RANGE = (1.0, 1024.0)  # published fabrics are oversubscribed at most ~8:1 (Llama 3's 1:7)
BUS_EFFICIENCY_RANGE = (1e-3, 1.0)  # achievable fraction of the line rate (catalog kinds: 0.77 to 1)
MAX_NAME_CHARS = 200  # cluster and level names label plans, tables and exported files


@dataclass(frozen=True)
class Cluster:
    """An accelerator type on a network.

    device_order: for clusters built from a graph, ``device_order[rank]`` is the
        graph's device id of each rank (see ``GraphTopology``); None means the
        identity (ranks are the devices in file order).
    """

    name: str
    accelerator: Accelerator
    topology: Topology
    device_order: tuple[int, ...] | None = None

    @property
    def devices(self) -> int:
        return self.topology.devices

    def truncate(self, devices: int) -> "Cluster":
        """The first ``devices`` ranks (``Topology.truncate`` explains which counts are valid)."""
        try:
            if isinstance(devices, bool):
                raise TypeError
            devices = operator.index(devices)
        except TypeError:
            raise ConfigError(
                f"--devices must be an integer, got {devices!r}",
                field="devices",
                value=devices,
                limit=f"1..{self.devices}",
            ) from None
        order = None if self.device_order is None else self.device_order[:devices]
        return replace(self, topology=self.topology.truncate(devices), device_order=order)


# ---------------------------------------------------------------------------
# interconnect kinds


@lru_cache(maxsize=1)
def _interconnects() -> Mapping[str, float]:
    table = load_object(data_file("interconnects.toml"), "interconnect catalog", "toml")
    return MappingProxyType({kind: float(entry["bus_efficiency"]) for kind, entry in table.items()})


def interconnect_kinds() -> list[str]:
    """Link kinds of ``catalog/interconnects.toml``."""
    return sorted(_interconnects())


def interconnect_bus_efficiency(kind: str) -> float:
    """Achievable busbw / line rate of a link kind; ConfigError naming the known kinds."""
    table = _interconnects()
    if not isinstance(kind, str) or kind.strip().lower() not in table:
        raise ConfigError(
            f"unknown interconnect kind {brief(kind)}; allowed: {', '.join(sorted(table))}",
            field="kind",
            value=brief(kind),
            limit=sorted(table),
        )
    return table[kind.strip().lower()]


# ---------------------------------------------------------------------------
# reading


def cluster_names() -> list[str]:
    """Names of the catalog clusters."""
    return names("cluster")


def _resolve(name_or_path: str) -> Path:
    text = str(name_or_path)
    path = user_path(text)
    looks_like_path = path.suffix.lower() in _SUFFIXES or "/" in text or "\\" in text or is_file(path)
    if not looks_like_path:
        return entry_path("cluster", text)
    if not is_file(path):
        raise ConfigError(f"cluster file '{text}' not found", field="cluster", value=text, limit="an existing file")
    if path.suffix.lower() not in _SUFFIXES:
        raise ConfigError(
            f"cluster file '{text}' must end in .toml or .json", field="cluster", value=text, limit=list(_SUFFIXES)
        )
    return path


def _read(path: Path) -> dict[str, Any]:
    """The top-level table of a cluster file (TOML or JSON by its suffix), read by ``nestplan.inputs``."""
    return load_object(path, "cluster file")


def cluster_data(name_or_path: str) -> dict[str, Any]:
    """The parsed, not yet validated, table of a catalog cluster or a cluster file (to derive
    variants from; ``cluster_from_dict`` validates it)."""
    return _read(_resolve(name_or_path))


def load_cluster(name_or_path: str, devices: int | None = None) -> Cluster:
    """A catalog cluster by name, or a cluster file (.toml or .json); ``devices`` keeps the first N devices."""
    path = _resolve(name_or_path)
    cluster = cluster_from_dict(_read(path), origin=str(path))
    return cluster if devices is None else cluster.truncate(devices)


# ---------------------------------------------------------------------------
# validation and conversion


def _check_keys(table: Any, allowed: tuple[str, ...], required: tuple[str, ...], where: str) -> Mapping[str, Any]:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where} must be a table, got {brief(table)}", field=where, value=brief(table))
    unknown = [key for key in table if key not in allowed]
    if unknown:
        raise ConfigError(
            f"{where}: unknown key '{unknown[0]}'; allowed: {', '.join(allowed)}",
            field=str(unknown[0]),
            value=brief(table[unknown[0]]),
            limit=list(allowed),
        )
    missing = [key for key in required if key not in table]
    if missing:
        raise ConfigError(
            f"{where}: missing field '{missing[0]}'; required: {', '.join(required)}",
            field=missing[0],
            limit=list(required),
        )
    return table


def _number(value: Any, field: str, where: str, bounds: tuple[float, float]) -> float:
    """A number in the closed range ``bounds``."""
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:  # NaN fails too
        allowed = f"[{low:g}, {high:g}]"
        raise ConfigError(
            f"{where}: {field} must be a number in {allowed}, got {brief(value)}",
            field=field,
            value=brief(value),
            limit=allowed,
        )
    return float(value)


def _integer(value: Any, field: str, where: str, *, maximum: int, minimum: int = 1) -> int:
    """An integer of the file (not a bool, not ``2.0``) in minimum..maximum."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ConfigError(
            f"{where}: {field} must be an integer in {minimum}..{maximum}, got {brief(value)}",
            field=field,
            value=brief(value),
            limit=f"{minimum}..{maximum}",
        )
    return value


def _name(value: Any, field: str, where: str) -> str:
    """A name: a non-empty string of at most ``MAX_NAME_CHARS`` characters, no control character."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f"{where}: {field} must be a non-empty string, got {brief(value)}",
            field=field,
            value=brief(value),
            limit="non-empty string",
        )
    if len(value) > MAX_NAME_CHARS:
        raise ConfigError(
            f"{where}: {field} is {len(value)} characters long; at most {MAX_NAME_CHARS} allowed",
            field=field,
            value=len(value),
            limit=MAX_NAME_CHARS,
            unit="characters",
        )
    return check_string(value, field, where)


def _list(value: Any, field: str, where: str, maximum: int, described: str) -> list[Any]:
    """A non-empty list of at most ``maximum`` entries."""
    if not isinstance(value, list) or not 1 <= len(value) <= maximum:
        shown = f"{len(value)} entries" if isinstance(value, list) else brief(value)
        raise ConfigError(
            f"{where}: {field} must be a list of 1 to {maximum} {described}, got {shown}",
            field=field,
            value=shown,
            limit=f"1..{maximum} entries",
        )
    return value


def _efficiency(table: Mapping[str, Any], where: str) -> float:
    if "kind" in table and "bus_efficiency" in table:
        raise ConfigError(
            f"{where}: give either kind or bus_efficiency, not both (kind = {brief(table['kind'])})",
            field="bus_efficiency",
            value=brief(table["bus_efficiency"]),
            limit="kind or bus_efficiency",
        )
    if "kind" in table:
        try:
            return interconnect_bus_efficiency(table["kind"])
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}", field="kind", value=exc.value, limit=exc.limit) from None
    if "bus_efficiency" in table:
        return _number(table["bus_efficiency"], "bus_efficiency", where, BUS_EFFICIENCY_RANGE)
    return 1.0


def _bandwidth_Bps(value: Any, field: str, where: str) -> float:
    return units.GBps_to_Bps(_number(value, field, where, BANDWIDTH_GBps_RANGE))


def _latency_s(value: Any, field: str, where: str) -> float:
    return units.us_to_s(_number(value, field, where, LATENCY_us_RANGE))


def _accelerator(value: Any, cluster: str) -> Accelerator:
    if isinstance(value, str):
        return load_accelerator(value)
    if isinstance(value, Mapping):
        suffix = "-accelerator"  # the default name, within the accelerator's name bound
        return accelerator_from_dict(value.get("name", cluster[: MAX_NAME_CHARS - len(suffix)] + suffix), value)
    raise ConfigError(
        f"cluster '{cluster}': accelerator must be a catalog name or an [accelerator] table, got {brief(value)}",
        field="accelerator",
        value=brief(value),
        limit="catalog name or table",
    )


def _levels_topology(name: str, levels: Any) -> Topology:
    where = f"cluster '{name}'"
    specs = []
    for i, table in enumerate(_list(levels, "levels", where, MAX_LEVELS, "[[levels]] tables, innermost first")):
        at = f"{where}: levels[{i}]"
        _check_keys(table, _LEVEL_KEYS, _LEVEL_REQUIRED, at)
        specs.append(
            dict(
                name=_name(table["name"], "name", at),
                size=_integer(table["size"], "size", at, maximum=MAX_DEVICES),
                bandwidth_Bps=_bandwidth_Bps(table["bandwidth_GBps"], "bandwidth_GBps", at),
                latency_s=_latency_s(table["latency_us"], "latency_us", at),
                oversubscription=_number(
                    table.get("oversubscription", 1.0), "oversubscription", at, OVERSUBSCRIPTION_RANGE
                ),
                bus_efficiency=_efficiency(table, at),
                mesh_link_Bps=(
                    _bandwidth_Bps(table["mesh_link_GBps"], "mesh_link_GBps", at) if "mesh_link_GBps" in table else None
                ),
            )
        )
    return hierarchical(name, specs)


def _torus_topology(name: str, table: Any) -> Topology:
    at = f"cluster '{name}': torus"
    _check_keys(table, _TORUS_KEYS, _TORUS_REQUIRED, at)
    dims = _list(table["dims"], "dims", at, MAX_LEVELS, "integers such as [4, 4, 4]")
    sizes = [_integer(d, f"dims[{i}]", at, maximum=MAX_DEVICES) for i, d in enumerate(dims)]
    return torus(
        name,
        sizes,
        _bandwidth_Bps(table["link_bandwidth_GBps"], "link_bandwidth_GBps", at),
        _latency_s(table["hop_latency_us"], "hop_latency_us", at),
        bus_efficiency=_efficiency(table, at),
    )


def _graph_topology(name: str, table: Any) -> tuple[Topology, tuple[int, ...]]:
    at = f"cluster '{name}': graph"
    _check_keys(table, _GRAPH_KEYS, _GRAPH_REQUIRED, at)
    num_devices = _integer(table["devices"], "devices", at, minimum=2, maximum=MAX_GRAPH_NODES)
    edges = _list(table["edges"], "edges", at, MAX_GRAPH_EDGES, "links [u, v, bandwidth_GBps, latency_us]")
    converted = []
    for i, edge in enumerate(edges):
        where = f"{at}: edges[{i}]"
        if not isinstance(edge, list) or len(edge) != 4:
            raise ConfigError(
                f"{where} must be [u, v, bandwidth_GBps, latency_us], got {brief(edge)}",
                field=f"edges[{i}]",
                value=brief(edge),
                limit="[u, v, bandwidth_GBps, latency_us]",
            )
        u = _integer(edge[0], "u", where, minimum=0, maximum=MAX_GRAPH_NODES - 1)
        v = _integer(edge[1], "v", where, minimum=0, maximum=MAX_GRAPH_NODES - 1)
        converted.append(
            (u, v, _bandwidth_Bps(edge[2], "bandwidth_GBps", where), _latency_s(edge[3], "latency_us", where))
        )
    built = from_graph(name, num_devices, converted, bus_efficiency=_efficiency(table, at))
    return built.topology, built.device_order


def cluster_from_dict(data: Mapping[str, Any], origin: str = "<dict>") -> Cluster:
    """A Cluster from the parsed contents of a cluster file (see the module docstring).

    ``origin`` (a path or a label) prefixes error messages about the file as a whole.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"cluster {origin}: expected a table of fields, got {type(data).__name__}", field="cluster", value=origin
        )
    _check_keys(data, _TOP_KEYS, ("name", "accelerator"), f"cluster {origin}")
    name = _name(data["name"], "name", f"cluster {origin}")
    for key in ("source", "notes"):
        if key in data and not isinstance(data[key], str):
            raise ConfigError(
                f"cluster '{name}': {key} must be a string, got {brief(data[key])}",
                field=key,
                value=brief(data[key]),
                limit="a string",
            )
    given = [key for key in _NETWORK_KEYS if key in data]
    if len(given) != 1:
        described = "none" if not given else " and ".join(given)
        raise ConfigError(
            f"cluster '{name}': give exactly one network description of {', '.join(_NETWORK_KEYS)}; found {described}",
            field="levels",
            value=given,
            limit=list(_NETWORK_KEYS),
        )
    accelerator = _accelerator(data["accelerator"], name)
    order: tuple[int, ...] | None = None
    if "levels" in data:
        topology = _levels_topology(name, data["levels"])
    elif "torus" in data:
        topology = _torus_topology(name, data["torus"])
    else:
        topology, order = _graph_topology(name, data["graph"])
    return Cluster(name=name, accelerator=accelerator, topology=topology, device_order=order)


# ---------------------------------------------------------------------------
# writing: the inverse of cluster_from_dict


def _in_unit(value: float, scale: float) -> float:
    """``value`` (SI) in the unit ``scale`` (1e9 for GB/s): the float that the cluster reader's
    conversion (``x * scale``) turns back into exactly ``value`` where one lies within two steps
    of the quotient (always, for a value a file gave), else the quotient."""
    guess = value / scale
    candidates = [guess]
    for direction in (math.inf, -math.inf):
        step = guess
        for _ in range(2):
            step = math.nextafter(step, direction)
            candidates.append(step)
    return next((c for c in candidates if float(c) * scale == value), guess)


def _accelerator_table(acc: Accelerator) -> dict[str, Any]:
    """An [accelerator] table of a cluster file (the fields of catalog/accelerators.toml)."""
    table: dict[str, Any] = {"name": acc.name}
    table |= {f"peak_{dtype}_TFLOPS": _in_unit(flops, units.TERA) for dtype, flops in acc.peak_flops.items()}
    table |= {
        "hbm_GiB": acc.hbm_bytes / units.GiB,
        "hbm_bandwidth_TBps": _in_unit(acc.hbm_bandwidth_Bps, units.TB),
        "matmul_efficiency": acc.matmul_efficiency,
        "matmul_half_dim": acc.matmul_half_dim,
        "memory_efficiency": acc.memory_efficiency,
        "reserved_GiB": acc.reserved_bytes / units.GiB,
        "mx_block_scaling": acc.mx_block_scaling,
        "source": acc.source,
    }
    optional = {
        "fp8_matmul_efficiency": acc.fp8_matmul_efficiency,
        "attention_efficiency": acc.attention_efficiency,
        "attention_backward_efficiency": acc.attention_backward_efficiency,
    }
    return table | {key: value for key, value in optional.items() if value is not None}


def _level_table(level: Level) -> dict[str, Any]:
    table = {
        "name": level.name,
        "size": level.size,
        "bandwidth_GBps": _in_unit(level.bandwidth_Bps, units.GB),
        "latency_us": _in_unit(level.latency_s, units.US),
        "oversubscription": level.oversubscription,
        "bus_efficiency": level.bus_efficiency,
    }
    mesh = {} if level.mesh_link_Bps is None else {"mesh_link_GBps": _in_unit(level.mesh_link_Bps, units.GB)}
    return table | mesh


def cluster_to_dict(cluster: Cluster) -> dict[str, Any]:
    """The inverse of :func:`cluster_from_dict`: ``cluster`` as a cluster file's table (its levels as
    they are after ``--devices``: a torus or a graph as the levels derived from it), so that
    ``cluster_from_dict(cluster_to_dict(c))`` has the topology and the accelerator of ``c``
    (``== c`` where ``c`` was not derived from a graph: ``device_order`` is not written)."""
    return {
        "name": cluster.name,
        "accelerator": _accelerator_table(cluster.accelerator),
        "levels": [_level_table(level) for level in cluster.topology.levels],
    }
