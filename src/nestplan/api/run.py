"""A whole run: its length and facility inputs, and the device count chosen over a range
(``plan_range``, its ``RangeReport``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from nestplan.api.planning import PlanReport, check_top_layers
from nestplan.cluster import Cluster
from nestplan.cost.run import RunLength
from nestplan.errors import ConfigError
from nestplan.hardware.facility import with_overrides
from nestplan.job import Job
from nestplan.model import ModelSpec
from nestplan.plan import Plan
from nestplan.search.sizes import Limits, Objective, SizeChoice, plan_sizes, range_sizes
from nestplan.search.space import SearchSpace


def run_length(tokens: float | None = None, steps: int | None = None) -> RunLength | None:
    """The run's length (None when neither is given)."""
    return None if tokens is None and steps is None else RunLength(tokens=tokens, steps=steps)


def with_facility(cluster: Cluster, **given: Any) -> Cluster:
    """``cluster`` with facility fields (the cluster file's ``[facility]`` names and units) replaced
    where given (not None)."""
    if all(value is None for value in given.values()):
        return cluster
    return replace(cluster, facility=with_overrides(cluster.facility, given))


@dataclass(frozen=True)
class RangeReport:
    """The chosen size's plan report and every size's row."""

    report: PlanReport
    choice: SizeChoice
    length: RunLength

    @property
    def plan(self) -> Plan:
        """The chosen plan with its run."""
        return self.report.plan.with_run(self.length)


def plan_range(
    model: ModelSpec,
    cluster: Cluster,
    job: Job,
    space: SearchSpace,
    devices_range: tuple[int, int],
    length: RunLength | None,
    objective: str = "time",
    limits: Limits = Limits(),
    top: int = 0,
) -> RangeReport:
    """Plan every size of ``devices_range`` (search/sizes.py) and choose one by ``objective``."""
    check_top_layers(top, model)
    if length is None:
        raise ConfigError("--devices-range needs the run's length: give --tokens or --steps", field="tokens")
    goal = Objective(objective)
    if limits.max_cost_usd is not None and cluster.facility.price_per_gpu_s is None:
        raise ConfigError(
            "--max-cost needs a price: give --price-per-gpu-hour or the cluster's [facility] price_per_gpu_hour_usd",
            field="max-cost",
        )
    sizes = range_sizes(*devices_range, cluster)
    choice = plan_sizes(model, cluster, job, space, sizes, length, goal, limits, top)
    result = choice.chosen.result
    part = cluster.truncate(choice.chosen.devices)
    report = PlanReport(model, part, result.job, result.best, result.runners_up, result.stats)
    return RangeReport(report, choice, length)
