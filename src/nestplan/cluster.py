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

Optional top-level fields::

    gpus_per_host = 4               # GPUs per host (server, compute tray): what launchers and schedulers
                                    # count; divides the innermost level's size (default: that size)
    gpus_per_domain = 64            # GPUs a job uses per unit of the innermost level (its NVLink domain)
                                    # where it does not fill them (default: network.hosts, the most whole
                                    # hosts per domain that divide the job)

and ``source`` and ``notes`` strings that document the file. Files are read by
Optional top-level ``source`` and ``notes`` strings document the file; an optional ``[facility]``
table gives storage, failure rates, power and prices for a whole run (nestplan.hardware.facility). Files are read by
``nestplan.inputs`` (size, encoding, syntax, nesting, finite numbers, no control
characters); every field is then checked, and converted to SI, by the network's one reader
of level and link figures (``nestplan.network._checks``: its ``*_RANGE`` bounds), unknown
keys refused by name, and the devices of the whole network against
``nestplan.network.topology.MAX_DEVICES``.
"""

from __future__ import annotations

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
from nestplan.hardware.facility import DEFAULT_FACILITY, Facility, facility_from_dict, facility_to_dict, in_unit
from nestplan.inputs import Fields, load_object
from nestplan.network._checks import FILE_UNITS, MAX_NAME_CHARS, read_level
from nestplan.network.builders import hierarchical, read_torus
from nestplan.network.graph import read_graph
from nestplan.network.hosts import check_hosts, take
from nestplan.network.topology import MAX_DEVICES, MAX_LEVELS, Level, Topology

_HOST_KEYS = ("gpus_per_host", "gpus_per_domain")
_TOP_KEYS = ("name", "accelerator", *_HOST_KEYS, "levels", "torus", "graph", "source", "notes", "facility")
_NETWORK_KEYS = ("levels", "torus", "graph")
_SUFFIXES = (".toml", ".json")


@dataclass(frozen=True)
class Cluster:
    """An accelerator type on a network.

    device_order: for clusters built from a graph, ``device_order[rank]`` is the
        graph's device id of each rank (see ``GraphTopology``); None means the
        identity (ranks are the devices in file order).
    gpus_per_host: devices per host (what launchers and schedulers count, ``host_devices``); None: the
        innermost level's size. A host lies inside one unit of the innermost level (network.hosts).
    gpus_per_domain: devices a job uses per unit of the innermost level where it does not fill them
        (``truncate``); None: network.hosts's default.
    """

    name: str
    accelerator: Accelerator
    topology: Topology
    device_order: tuple[int, ...] | None = None
    gpus_per_host: int | None = None
    gpus_per_domain: int | None = None
    facility: Facility = DEFAULT_FACILITY  # storage, failures, power, prices for a whole run

    def __post_init__(self) -> None:
        check_hosts(self.topology, self.gpus_per_host, self.gpus_per_domain)

    @property
    def devices(self) -> int:
        return self.topology.devices

    @property
    def host_devices(self) -> int:
        """Devices per host: ``--nproc-per-node`` of a launch script."""
        return self.topology.levels[0].size if self.gpus_per_host is None else self.gpus_per_host

    def truncate(self, devices: int) -> "Cluster":
        """The devices a job of ``devices`` takes: whole hosts, equally many in each unit of the innermost
        level it uses, the first units and the first hosts of each (``network.hosts.take`` says which
        counts are valid and names the nearest valid ones)."""
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
        topology, per_domain = take(self.topology, devices, self.host_devices, self.gpus_per_domain)
        domain = self.topology.levels[0].size
        order = None
        if self.device_order is not None:
            used = range(devices // per_domain)
            order = tuple(self.device_order[u * domain + i] for u in used for i in range(per_domain))
        host = None if self.gpus_per_host is None else min(self.gpus_per_host, devices)
        return replace(self, topology=topology, device_order=order, gpus_per_host=host, gpus_per_domain=None)


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
# validation and conversion: every figure through the network's one reader (network._checks)


def _accelerator(f: Fields, cluster: str) -> Accelerator:
    value = f.raw("accelerator")
    if isinstance(value, str):
        return load_accelerator(value)
    if isinstance(value, Mapping):
        suffix = "-accelerator"  # the default name, within the accelerator's name bound
        return accelerator_from_dict(value.get("name", cluster[: MAX_NAME_CHARS - len(suffix)] + suffix), value)
    raise f.error(
        f"accelerator must be a catalog name or an [accelerator] table, got {brief(value)}",
        "accelerator",
        brief(value),
        "catalog name or table",
    )


def _network(f: Fields, name: str) -> tuple[Topology, tuple[int, ...] | None]:
    """The topology of the file's one network description, and a graph's device order."""
    given = [key for key in _NETWORK_KEYS if f.has(key)]
    if len(given) != 1:
        described = "none" if not given else " and ".join(given)
        raise f.error(
            f"give exactly one network description of {', '.join(_NETWORK_KEYS)}; found {described}",
            "levels",
            given,
            list(_NETWORK_KEYS),
        )
    kinds = _interconnects()
    if given == ["levels"]:
        levels = [read_level(level, FILE_UNITS, kinds) for level in f.tables("levels", MAX_LEVELS)]
        return hierarchical(name, levels), None
    if given == ["torus"]:
        return read_torus(f.table("torus"), name, FILE_UNITS, kinds), None
    built = read_graph(f.table("graph"), name, FILE_UNITS, kinds)
    return built.topology, built.device_order


def cluster_from_dict(data: Mapping[str, Any], origin: str = "<dict>") -> Cluster:
    """A Cluster from the parsed contents of a cluster file (see the module docstring).

    ``origin`` (a path or a label) prefixes error messages about the file as a whole.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"cluster {origin}: expected a table of fields, got {type(data).__name__}", field="cluster", value=origin
        )
    top = Fields(data, f"cluster {origin}")
    top.refuse_unknown(_TOP_KEYS)
    top.require(("name", "accelerator"))
    name = top.string("name", maximum=MAX_NAME_CHARS)
    f = Fields(data, f"cluster '{name}'")
    for key in ("source", "notes"):
        f.string(key, "", blank=True)
    accelerator = _accelerator(f, name)
    topology, order = _network(f, name)
    hosts = {key: f.integer(key, MAX_DEVICES) for key in _HOST_KEYS if f.has(key)}
    facility = facility_from_dict(f.raw("facility", None), f"cluster '{name}'")
    return Cluster(
        name=name, accelerator=accelerator, topology=topology, device_order=order, facility=facility, **hosts
    )


# ---------------------------------------------------------------------------
# writing: the inverse of cluster_from_dict


def _in_unit(value: float, scale: float) -> float:
    """``value`` (SI) in the unit ``scale`` (1e9 for GB/s): the float the cluster reader's conversion
    (``x * scale``) turns back into exactly ``value`` (hardware.facility.in_unit), else the quotient."""
    return in_unit(value, lambda x: float(x) * scale, value / scale)


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
        "architecture": acc.architecture.value,
        "source": acc.source,
    }
    optional = {
        "fp8_matmul_efficiency": acc.fp8_matmul_efficiency,
        "attention_efficiency": acc.attention_efficiency,
        "attention_backward_efficiency": acc.attention_backward_efficiency,
        "attention_factor": None if acc.attention_factor == 1.0 else acc.attention_factor,
        "calibration": None if acc.calibration is None else dict(vars(acc.calibration)),
        "board_power_W": acc.board_power_W,
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
    hosts = {key: getattr(cluster, key) for key in _HOST_KEYS if getattr(cluster, key) is not None}
    facility = {} if cluster.facility == DEFAULT_FACILITY else {"facility": facility_to_dict(cluster.facility)}
    return {
        "name": cluster.name,
        "accelerator": _accelerator_table(cluster.accelerator),
        **hosts,
        "levels": [_level_table(level) for level in cluster.topology.levels],
    } | facility
