"""Hierarchical network levels (docs/design.md section 3).

Level 0 is innermost (inside a node). A level's ``size`` counts units of the level
below per unit of this one (for level 0: devices per node). Devices are numbered
so that every unit of every level is a contiguous block of ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Iterable, Sequence

from nestplan.errors import ConfigError

MAX_DEVICES = 2**20  # devices of one network: 1,048,576, 10x the largest announced training clusters
MAX_LEVELS = 16  # levels of one network: real ones have 2 to 4 (a torus one per dimension)


@dataclass(frozen=True)
class Level:
    """One tier of the network, in SI units.

    bandwidth_Bps: per-device, one-direction bandwidth for traffic that crosses
        units of the level below but stays inside one unit of this level.
    latency_s: one-hop latency across this level (the alpha of alpha-beta).
    oversubscription: >= 1; bandwidth divides by it when every device crosses at once.
    bus_efficiency: achievable fraction of bandwidth_Bps for collectives (NCCL busbw / line rate).
    mesh_link_Bps: None for a switched level (a device reaches the level at bandwidth_Bps whichever
        devices it talks to); for a full mesh of direct links (8 MI300X on Infinity Fabric: 7 links of
        64 GB/s per GPU), the one-direction bandwidth of one link: a device reaches g - 1 peers over
        g - 1 links at once, at most bandwidth_Bps (the device's links together), see ``group_bandwidth_Bps``.
    """

    name: str
    size: int
    bandwidth_Bps: float
    latency_s: float
    oversubscription: float = 1.0
    bus_efficiency: float = 1.0
    mesh_link_Bps: float | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.size <= MAX_DEVICES:
            self._refuse("size", self.size, f"1..{MAX_DEVICES}")
        if not 0 < self.bandwidth_Bps < math.inf:  # NaN fails every comparison
            self._refuse("bandwidth_Bps", self.bandwidth_Bps, "a finite number > 0")
        if not 0 <= self.latency_s < math.inf:
            self._refuse("latency_s", self.latency_s, "a finite number >= 0")
        if not 1 <= self.oversubscription < math.inf:
            self._refuse("oversubscription", self.oversubscription, "a finite number >= 1")
        if not 0 < self.bus_efficiency <= 1:
            self._refuse("bus_efficiency", self.bus_efficiency, "(0, 1]")
        if self.mesh_link_Bps is not None and not 0 < self.mesh_link_Bps <= self.bandwidth_Bps:
            self._refuse(
                "mesh_link_Bps", self.mesh_link_Bps, f"None or a number in (0, bandwidth_Bps = {self.bandwidth_Bps:g}]"
            )

    @property
    def links(self) -> tuple[float, float, float, float, float | None]:
        """Every figure of the level's links (its name and size aside): two adjacent levels with equal
        links are one network drawn in two steps (``Topology.one_level_per_network``)."""
        return self.bandwidth_Bps, self.latency_s, self.oversubscription, self.bus_efficiency, self.mesh_link_Bps

    def _refuse(self, field: str, value: float, allowed: str) -> None:
        raise ConfigError(
            f"level '{self.name}': {field} must be {allowed}, got {value}", field=field, value=value, limit=allowed
        )

    @property
    def effective_bandwidth_Bps(self) -> float:
        """Per-device bandwidth a collective achieves when all devices cross at once."""
        return self.bandwidth_Bps * self.bus_efficiency / self.oversubscription

    def group_bandwidth_Bps(self, members: int) -> float:
        """Per-device bandwidth a collective achieves across this level when ``members`` units of the level
        below take part in each unit of it.

        A switched level gives ``effective_bandwidth_Bps`` whatever the group. On a full mesh every member
        can send each of its ``members - 1`` peers its share over their direct link, all links at once (the
        bandwidth-optimal schedule on a clique; RCCL's all-reduce on 8 MI300X reaches 317 GB/s busbw, five
        links' worth of 64 GB/s, so it does use the links together: catalog/interconnects.toml):
        ``members - 1`` links, at least one (a group crossing the level with one member per unit, or a
        point-to-point transfer, uses one) and at most ``bandwidth_Bps``, derated like
        ``effective_bandwidth_Bps``.
        """
        if self.mesh_link_Bps is None:
            return self.effective_bandwidth_Bps
        links = max(members - 1, 1)
        return min(self.bandwidth_Bps, links * self.mesh_link_Bps) * self.bus_efficiency / self.oversubscription


@dataclass(frozen=True)
class Topology:
    name: str
    levels: tuple[Level, ...]

    def __post_init__(self) -> None:
        assert len(self.levels) >= 1, "a topology needs at least one level"
        if len(self.levels) > MAX_LEVELS:
            raise ConfigError(
                f"topology '{self.name}' has {len(self.levels)} levels; at most {MAX_LEVELS} allowed",
                field="levels",
                value=len(self.levels),
                limit=MAX_LEVELS,
            )
        if self.devices > MAX_DEVICES:
            sizes = " x ".join(str(level.size) for level in self.levels)
            raise ConfigError(
                f"topology '{self.name}' has {sizes} = {self.devices} devices; at most {MAX_DEVICES} allowed",
                field="devices",
                value=self.devices,
                limit=MAX_DEVICES,
                unit="devices",
            )

    @property
    def devices(self) -> int:
        return math.prod(level.size for level in self.levels)

    @property
    def num_levels(self) -> int:
        return len(self.levels)

    def with_bus_efficiency(self, factor: float) -> "Topology":
        """Every level's bus efficiency times ``factor`` (at most 1): a calibrated collective efficiency."""
        if factor == 1.0:
            return self
        return replace(
            self, levels=tuple(replace(lv, bus_efficiency=min(1.0, lv.bus_efficiency * factor)) for lv in self.levels)
        )

    @cached_property
    def one_level_per_network(self) -> tuple[tuple[int, ...], "Topology"] | None:
        """Where adjacent levels have equal links (``Level.links``: an 8-GPU NVLink node drawn as two
        levels of 4, a non-blocking fabric drawn as leaf and spine of equal figures), the same hardware as
        one level each: (the first level of each merged run, and the last index + 1, i.e. the runs'
        bounds; the topology of the merged levels, each ``size`` the product of its run's). None where
        every level differs from the one below (every catalog cluster), so that callers keep the levels
        as drawn. The collectives cost groups on the merged levels, so that a cost does not depend on
        how a network is drawn (issue 27)."""
        bounds = [0] + [i for i in range(1, self.num_levels) if self.levels[i].links != self.levels[i - 1].links]
        if len(bounds) == self.num_levels:
            return None
        bounds.append(self.num_levels)
        merged = tuple(
            replace(self.levels[a], size=math.prod(lv.size for lv in self.levels[a:b]))
            for a, b in zip(bounds, bounds[1:])
        )
        return tuple(bounds), Topology(self.name, merged)

    def unit_devices(self, level: int) -> int:
        """Devices in one unit of ``level`` (level 0: one node)."""
        return math.prod(lv.size for lv in self.levels[: level + 1])

    def truncate(self, devices: int) -> "Topology":
        """The first ``devices`` devices: outer levels shrink, inner units stay whole.

        When ``devices`` is not a whole number of units of the level below the one it
        spans (16,384 GPUs of 3,072-GPU pods), that level's units are split into the
        largest equal sub-units that tile ``devices`` (pods of 1,024 GPUs here): traffic
        between sub-units of one real unit is then costed at the outer level, a
        pessimistic but never optimistic reading. Devices must still fill whole nodes
        once they span more than one (12 devices of 8-device nodes are refused).
        """
        total = self.devices
        if devices < 1 or devices > total:
            raise ConfigError(
                f"--devices {devices} is outside 1..{total} for cluster '{self.name}'",
                field="devices",
                value=devices,
                limit=total,
            )
        levels = list(self.levels)
        inner = 1
        for j, lv in enumerate(levels):
            if inner * lv.size >= devices:
                break
            inner *= lv.size
        if devices % inner:
            node = levels[0].size
            if j == 1 or devices % node:
                raise ConfigError(
                    f"--devices {devices} is not a multiple of {node} (devices per {levels[0].name} "
                    f"of cluster '{self.name}')",
                    field="devices",
                    value=devices,
                    limit=node,
                )
            below = levels[j - 1]
            outer_inner = inner // below.size
            sub = max(d for d in range(1, below.size + 1) if below.size % d == 0 and devices % (outer_inner * d) == 0)
            levels[j - 1] = replace(below, size=sub)
            inner = outer_inner * sub
        return Topology(self.name, tuple(levels[:j]) + (replace(levels[j], size=devices // inner),))

    def fanout(self, ranks: Iterable[int]) -> tuple[int, ...]:
        """Members per unit at each level for a group of ranks (product = group size).

        fanout[0] = members per node, fanout[1] = nodes of the group per level-1 unit, ...
        A group uniformly spread over units (every group of a rank grid is) gives exact
        integers; otherwise the counts are rounded up.
        """
        members = sorted(set(int(r) for r in ranks))
        assert members and members[-1] < self.devices, "rank outside the topology"
        prev = len(members)
        fan: list[int] = []
        for i in range(self.num_levels):
            unit = self.unit_devices(i)
            n_units = len({r // unit for r in members})
            fan.append(-(-prev // n_units))
            prev = n_units
        return tuple(fan)

    def span_level(self, fanout: Sequence[int]) -> int:
        """The lowest level containing every member (0 for groups inside one node or of one device)."""
        spanned = [i for i, g in enumerate(fanout) if g > 1]
        return spanned[-1] if spanned else 0
