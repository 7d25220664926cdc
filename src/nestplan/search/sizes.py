"""How many devices: the best plan at each size of a range (powers of two, or a host's accelerators
times a power of two, that fill whole hosts), its
whole run (cost/run.py), and the size that meets an objective within limits.

Objectives: ``step`` (the fastest step), ``time`` (the fewest wall-clock days, failures included),
``cost`` (the lowest cost; GPU-hours where no price is given, the same order for one price per
GPU-hour) and ``energy`` (the fewest MWh; GPU-hours where the accelerator's board power is not
known). Limits: days and cost at most the ones given. Each size is planned by ``plan_job`` as a
single plan is; a size where nothing fits or the batch does not divide is a row with the reason.

Sizes that cannot win are not planned: each size's floor (cost/run.py ``run_floor``: its GEMM FLOPs at
the accelerator's ceiling, goodput 1, no spares) bounds the objective of every plan on it, so a size
whose floor is above the best valid run found so far is a row with that note. Under ``step`` and
``time`` the largest sizes go first (their floors are the lowest); the floors of ``cost`` and
``energy`` hardly depend on the size, so there the smallest go first and few are skipped. The sizes
share the search's memory answers (search/physical.py ``FeasibleMemo``: which pipeline depths of a
sub-graph, ZeRO stage, replica count and microbatch count fit), which do not depend on the size.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from nestplan.cluster import Cluster
from nestplan.cost.prediction import Prediction
from nestplan.cost.run import RunEstimate, RunFloor, RunLength, gemm_flops_per_step, predicted_run, run_floor
from nestplan.errors import ConfigError, InfeasibleError, PlannerError
from nestplan.job import Job
from nestplan.model import ModelSpec
from nestplan.search.physical import FeasibleMemo
from nestplan.search.planner import PlanResult, plan_job
from nestplan.search.space import SearchSpace
from nestplan.strategy.describe import describe

MAX_SIZES = 64  # device counts of one range
SKIPPED = "not planned: at least"  # the note of a size whose floor cannot win


class Objective(StrEnum):
    STEP = "step"
    TIME = "time"
    COST = "cost"
    ENERGY = "energy"


@dataclass(frozen=True)
class Limits:
    max_days: float | None = None
    max_cost_usd: float | None = None


@dataclass(frozen=True)
class SizeRow:
    """One device count: its best plan and run, or why it has none; ``note`` says why it was not chosen."""

    devices: int
    result: PlanResult | None
    run: RunEstimate | None
    note: str
    cpu_s: float

    @property
    def best(self) -> Prediction | None:
        return None if self.result is None else self.result.best

    @property
    def skipped(self) -> bool:
        """Not planned: its floor cannot beat the best run found."""
        return self.result is None and self.note.startswith(SKIPPED)

    @property
    def plan_text(self) -> str:
        return "-" if self.best is None else describe(self.best.plan)


@dataclass(frozen=True)
class SizeChoice:
    rows: tuple[SizeRow, ...]
    chosen: SizeRow
    objective: Objective


def range_sizes(low: int, high: int, cluster: Cluster) -> list[int]:
    """The device counts of low..high (at most the cluster's) that are powers of two, or a host's
    accelerators times a power of two, and that a job can take as ``--devices`` takes them (whole hosts,
    equally many per domain: ``Cluster.truncate``); ConfigError when none is."""
    per_host = cluster.host_devices
    top = min(high, cluster.devices)
    doublings = [1 << k for k in range(top.bit_length())]
    candidates = sorted({*doublings, *(per_host * d for d in doublings)})
    sizes = [n for n in candidates if low <= n <= top and _takes(cluster, n)]
    if not sizes:
        raise ConfigError(
            f"--devices-range {low}..{high} holds no power of two (or hosts of {per_host} devices times one) "
            f"that fills whole hosts within the cluster's {cluster.devices} devices",
            field="devices-range",
            value=f"{low}..{high}",
            limit=f"powers of two, multiples of {per_host}, at most {cluster.devices}",
        )
    return sizes[-MAX_SIZES:]


def _takes(cluster: Cluster, devices: int) -> bool:
    """Whether a job of ``devices`` can run on ``cluster`` (network/hosts.py's rules)."""
    try:
        cluster.truncate(devices)
    except ConfigError:
        return False
    return True


def objective_value(run: RunEstimate | RunFloor, objective: Objective) -> float:
    """What the objective minimises for one run (or its floor, which has the same figures)."""
    if objective is Objective.STEP:
        return run.step_time_s
    if objective is Objective.TIME:
        return run.wall_s
    if objective is Objective.COST and run.cost_usd is not None:
        return run.cost_usd
    if objective is Objective.ENERGY and run.energy_J is not None:
        return run.energy_J
    return run.gpu_hours


def _breach(run: RunEstimate, limits: Limits) -> str:
    if limits.max_days is not None and run.days > limits.max_days:
        return f"over {limits.max_days:g} days"
    if limits.max_cost_usd is not None and (run.cost_usd is None or run.cost_usd > limits.max_cost_usd):
        return f"over ${limits.max_cost_usd:,.0f}"
    return ""


def _plan_size(plan_one: Callable[[Cluster], PlanResult], cluster: Cluster, size: int, job: Job, length: RunLength):
    start = time.process_time()
    try:
        result = plan_one(cluster.truncate(size))
    except PlannerError as err:
        return SizeRow(size, None, None, str(err).split(";")[0][:80], time.process_time() - start)
    run = predicted_run(result.best, result.job, cluster, length)
    return SizeRow(size, result, run, "", time.process_time() - start)


def plan_sizes(
    model: ModelSpec,
    cluster: Cluster,
    job: Job,
    space: SearchSpace,
    sizes: list[int],
    length: RunLength,
    objective: Objective,
    limits: Limits,
    top: int = 0,
) -> SizeChoice:
    """Plan every size that can still win (module docstring), then choose the one that minimises
    ``objective`` within ``limits`` (ties: fewer devices). InfeasibleError when no size has a plan
    within the limits."""

    memo = FeasibleMemo()  # which depths fit in memory: the same answers at every size

    def plan_one(part: Cluster) -> PlanResult:
        return plan_job(model, part, job, space, top=top, feasible_memo=memo)

    flops = gemm_flops_per_step(model, job)
    descending = objective in (Objective.STEP, Objective.TIME)
    rows: list[SizeRow] = []
    best: float | None = None
    for size in sorted(sizes, reverse=descending):
        floor = run_floor(flops, job, size, cluster, length)
        if best is not None and objective_value(floor, objective) > best:
            rows.append(SizeRow(size, None, None, f"{SKIPPED} {_shown(floor, objective)}", 0.0))
            continue
        row = _plan_size(plan_one, cluster, size, job, length)
        if row.run is not None:
            row = _noted(row, _breach(row.run, limits))
            if not row.note:
                value = objective_value(row.run, objective)
                best = value if best is None else min(best, value)
        rows.append(row)
    rows.sort(key=lambda row: row.devices)
    valid = [row for row in rows if row.run is not None and not row.note]
    if not valid:
        reasons = "; ".join(f"{row.devices}: {row.note}" for row in rows)
        raise InfeasibleError(
            f"no device count in {sizes[0]}..{sizes[-1]} has a plan within the limits ({reasons})",
            field="devices-range",
            value=f"{sizes[0]}..{sizes[-1]}",
        )
    chosen = min(valid, key=lambda row: (objective_value(row.run, objective), row.devices))
    return SizeChoice(tuple(rows), chosen, objective)


def _shown(floor: RunFloor, objective: Objective) -> str:
    """The floor's figure that ``objective`` minimises, in its unit."""
    if objective is Objective.STEP:
        return f"{floor.step_time_s:.3g} s per step"
    if objective is Objective.TIME:
        return f"{floor.days:.3g} days"
    if objective is Objective.COST and floor.cost_usd is not None:
        return f"${floor.cost_usd:,.0f}"
    if objective is Objective.ENERGY and floor.energy_MWh is not None:
        return f"{floor.energy_MWh:,.0f} MWh"
    return f"{floor.gpu_hours:,.0f} GPU-hours"


def _noted(row: SizeRow, note: str) -> SizeRow:
    return SizeRow(row.devices, row.result, row.run, note, row.cpu_s)
