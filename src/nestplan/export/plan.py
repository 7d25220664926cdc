"""What an exporter reads: the typed plan (``nestplan.plan.Plan``: degrees, layout, schedule, job,
model, cluster, prediction), the nestplan version, and the plan's prediction under the
framework's rank order where that differs from the one costed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nestplan.model.spec import ModelSpec
from nestplan.plan import Plan


@dataclass(frozen=True)
class ExportInput:
    """Everything an exporter needs: the plan (its model and its cluster's node layout included)."""

    plan: Plan
    version: str = ""
    alternative: Mapping[str, float] | None = None  # the plan's prediction under the framework's rank order

    @property
    def model(self) -> ModelSpec:
        return self.plan.model

    @property
    def level_names(self) -> tuple[str, ...]:
        return self.plan.level_names

    @property
    def level_unit_devices(self) -> tuple[int, ...]:
        """Devices per unit of each level (node first)."""
        topology = self.plan.cluster.topology
        return tuple(topology.unit_devices(i) for i in range(topology.num_levels))

    @property
    def devices_per_node(self) -> int:
        """GPUs per node as launchers count them: the cluster's hosts (``Cluster.host_devices``; 4 on GB200
        NVL72, whose NVLink domain, the innermost level, is a rack of 18 such hosts), not the innermost level."""
        return self.plan.cluster.host_devices

    @property
    def nodes(self) -> int:
        return -(-self.plan.devices_used // self.devices_per_node)

    @property
    def nodes_per_domain(self) -> int:
        """Nodes of one unit of the innermost level (an NVLink domain) the plan uses, at most its nodes."""
        return min(self.level_unit_devices[0] // self.devices_per_node, self.nodes)
