"""The one reader of a network's figures: a level's fields (size, bandwidth, latency, oversubscription, bus
efficiency, mesh link) and a link's (bandwidth, latency), each checked against its closed range once, for a
cluster file (GB/s and microseconds) and the builders (SI) alike. Messages name the field, the value and
what is allowed (``nestplan.inputs.Fields``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from nestplan import units
from nestplan.errors import brief
from nestplan.inputs import Fields
from nestplan.network.topology import MAX_DEVICES, Level

# Closed ranges of a network's figures, in a cluster file's units: far beyond any network on both sides, so
# that every transfer time (bytes / bandwidth) stays a finite number.
BANDWIDTH_GBps_RANGE = (1e-3, 1e6)  # 1 MB/s to 1 PB/s per device and direction: NVLink 5 gives 900 GB/s
LATENCY_us_RANGE = (0.0, 1e6)  # up to one second per hop: real links take microseconds
OVERSUBSCRIPTION_RANGE = (1.0, 1024.0)  # published fabrics are oversubscribed at most ~8:1 (Llama 3's 1:7)
BUS_EFFICIENCY_RANGE = (1e-3, 1.0)  # achievable fraction of the line rate (catalog kinds: 0.77 to 1)
MAX_NAME_CHARS = 200  # cluster and level names label plans, tables and exported files


@dataclass(frozen=True)
class FigureUnits:
    """How a table writes bandwidths and latencies: the fields' suffixes and the SI value of one unit."""

    bandwidth: str
    latency: str
    bandwidth_scale: float
    latency_scale: float

    def bandwidth_Bps(self, f: Fields, key: str, optional: bool = False) -> Any:
        """``key`` (a bandwidth in these units, within ``BANDWIDTH_GBps_RANGE``) in bytes/s; None when
        ``optional`` and absent."""
        if optional and not f.has(key):
            return None
        low, high = (bound * units.GB / self.bandwidth_scale for bound in BANDWIDTH_GBps_RANGE)
        return f.number(key, low, high) * self.bandwidth_scale

    def latency_s(self, f: Fields, key: str) -> float:
        """``key`` (a latency in these units, within ``LATENCY_us_RANGE``) in seconds."""
        low, high = (bound * units.US / self.latency_scale for bound in LATENCY_us_RANGE)
        return f.number(key, low, high) * self.latency_scale


FILE_UNITS = FigureUnits("GBps", "us", units.GB, units.US)  # a cluster file's
SI_UNITS = FigureUnits("Bps", "s", 1.0, 1.0)  # the builders'


def level_keys(figures: FigureUnits) -> tuple[str, ...]:
    """The fields of a level table written in ``figures``, the required ones first (four)."""
    bandwidth, latency = f"bandwidth_{figures.bandwidth}", f"latency_{figures.latency}"
    return ("name", "size", bandwidth, latency, "oversubscription", "bus_efficiency", f"mesh_link_{figures.bandwidth}")


def read_bus_efficiency(f: Fields, kinds: Mapping[str, float] | None = None) -> float:
    """The table's ``bus_efficiency``, or with ``kinds`` (a link kind's efficiency) its ``kind`` instead;
    1.0 when neither is given."""
    if kinds is not None and f.has("kind"):
        if f.has("bus_efficiency"):
            raise f.error(
                f"give either kind or bus_efficiency, not both (kind = {brief(f.data['kind'])})",
                f.name("bus_efficiency"),
                brief(f.data["bus_efficiency"]),
                "kind or bus_efficiency",
            )
        kind = f.raw("kind")
        if not isinstance(kind, str) or kind.strip().lower() not in kinds:
            raise f.error(
                f"unknown interconnect kind {brief(kind)}; allowed: {', '.join(sorted(kinds))}",
                f.name("kind"),
                brief(kind),
                sorted(kinds),
            )
        return kinds[kind.strip().lower()]
    return f.number("bus_efficiency", *BUS_EFFICIENCY_RANGE, default=1.0)


def read_level(f: Fields, figures: FigureUnits, kinds: Mapping[str, float] | None = None) -> Level:
    """One level of a network from its table (``level_keys``, plus ``kind`` when ``kinds`` is given):
    unknown and missing fields refused by name, every figure within its range."""
    keys = level_keys(figures)
    f.refuse_unknown(keys + (("kind",) if kinds is not None else ()))
    f.require(keys[:4])
    return Level(
        name=f.string("name", maximum=MAX_NAME_CHARS),
        size=f.integer("size", MAX_DEVICES),
        bandwidth_Bps=figures.bandwidth_Bps(f, keys[2]),
        latency_s=figures.latency_s(f, keys[3]),
        oversubscription=f.number("oversubscription", *OVERSUBSCRIPTION_RANGE, default=1.0),
        bus_efficiency=read_bus_efficiency(f, kinds),
        mesh_link_Bps=figures.bandwidth_Bps(f, keys[6], optional=True),
    )


def read_link(links: Fields, key: str, figures: FigureUnits, max_id: int) -> tuple[int, int, float, float]:
    """The link ``key`` of a graph's list ``links`` (read by ``Fields.listed``): ``[u, v, bandwidth, latency]``,
    ids in ``0..max_id`` and different, the bandwidth and the latency in ``figures``, converted to SI."""
    names = ("u", "v", f"bandwidth_{figures.bandwidth}", f"latency_{figures.latency}")
    link = links.raw(key)
    if not isinstance(link, (list, tuple)) or len(link) != 4:
        shape = f"[{', '.join(names)}]"
        raise links.error(
            f"field '{links.name(key)}' must be {shape}, got {brief(link)}", links.name(key), brief(link), shape
        )
    f = Fields(dict(zip(names, link)), links.origin, f"{links.name(key)}.")
    u, v = f.integer("u", max_id, minimum=0), f.integer("v", max_id, minimum=0)
    if u == v:
        raise f.error(f"a link joins two different ids, got u = v = {u}", links.name(key), brief(link))
    return u, v, figures.bandwidth_Bps(f, names[2]), figures.latency_s(f, names[3])
