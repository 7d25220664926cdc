"""Evaluating one given plan: ``evaluate``, ``evaluate_full`` and its ``Evaluation``, a saved plan again
with changes (``reevaluate``), the rank order a framework runs (``framework_order``), and ``plot_plan``."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nestplan.api.display import heading, summary
from nestplan.api.resolve import FRAMEWORK_EXPORTS, resolve_cluster, resolve_model
from nestplan.profile import ProfileChoice, calibrated_cluster
from nestplan.cluster import Cluster
from nestplan.cost.evaluator import evaluate_plan
from nestplan.cost.schedules import named as named_schedule
from nestplan.cost.prediction import Prediction
from nestplan.errors import ConfigError
from nestplan.job import Job, check_context
from nestplan.model import ModelSpec
from nestplan.plan import Plan, SearchStats
from nestplan.settings import Framework
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Schedule
from nestplan.strategy.legality import check_against_model
from nestplan.strategy.placement import DEFAULT_AXIS_ORDER


@dataclass(frozen=True)
class Evaluation:
    """A prediction with the inputs it was made for; ``plan`` is its typed plan, ``to_dict`` the plan JSON."""

    model: ModelSpec
    cluster: Cluster
    job: Job
    prediction: Prediction
    solve_time_s: float

    @property
    def plan(self) -> Plan:
        return Plan.from_prediction(
            self.prediction,
            self.model,
            self.cluster,
            self.job,
            SearchStats(self.solve_time_s, candidates=1, pruned_memory=0),
        )

    def to_dict(self) -> dict[str, Any]:
        return self.plan.to_dict()

    def plot(self, out_dir: str | Path) -> list[Path]:
        """Write the plan's timeline.png, memory.png and placement.png (needs matplotlib)."""
        return plot_plan(self.plan, out_dir)

    def __repr__(self) -> str:
        return f"Evaluation({summary(self.model, self.cluster, self.prediction)})"

    def _repr_html_(self) -> str:
        return heading(self.model, self.cluster, "evaluated") + self.prediction._repr_html_()


def evaluate(
    model: str | ModelSpec,
    cluster: str | Cluster,
    plan: ParallelDims,
    job: Job,
    *,
    devices: int | None = None,
    axis_order: Sequence[str] | None = None,
    profile: ProfileChoice = None,
) -> Prediction:
    """Predict step time, its breakdown and memory per device of one plan (``axis_order`` None: the rank
    order the job's framework runs by default, ``framework_order``)."""
    return evaluate_full(model, cluster, plan, job, devices=devices, axis_order=axis_order, profile=profile).prediction


def evaluate_full(
    model: str | ModelSpec,
    cluster: str | Cluster,
    plan: ParallelDims,
    job: Job,
    *,
    devices: int | None = None,
    axis_order: Sequence[str] | None = None,
    profile: ProfileChoice = None,
) -> Evaluation:
    """Like :func:`evaluate`, keeping the inputs for reporting.

    ``devices`` takes the first N devices of the cluster and must equal the plan's
    tp x cp x ep x pp x dp; without it the plan's product is taken. ``axis_order`` (fastest first) by
    default the framework's own (``framework_order``: the degrees of a recipe give its step).
    ``profile``: the calibration (``resolve.calibrated_cluster``; default the catalog's for the
    accelerator and the job's framework).
    """
    spec = resolve_model(model)
    check_context(spec, job.seq_len)
    check_against_model(plan, spec, job.seq_len)
    if devices is not None and plan.devices != devices:
        raise ConfigError(
            f"the plan's degrees multiply to tp x cp x ep x pp x dp = {plan.tp} x {plan.cp} x {plan.ep} x "
            f"{plan.pp} x {plan.dp} = {plan.devices}, not the {devices} devices asked for"
            + (_expert_dp_hint(plan, devices) if plan.ep > 1 else ""),
            field="devices",
            value=plan.devices,
            limit=devices,
        )
    cl = calibrated_cluster(resolve_cluster(cluster, plan.devices), job.settings.framework, profile)
    start = time.perf_counter()
    order = framework_order(job.settings.framework) if axis_order is None else axis_order
    pred = evaluate_plan(spec, cl, plan, job, order)
    return Evaluation(spec, cl, job, pred, time.perf_counter() - start)


# a saved plan's fields by the names of evaluate's options, as ParallelDims names them
PLAN_FIELDS = {
    "tp": "tp",
    "pp": "pp",
    "dp": "dp",
    "cp": "cp",
    "ep": "ep",
    "etp": "etp",
    "sp": "sp",
    "zero": "zero",
    "recompute": "recompute",
    "mbs": "micro_batch_size",
    "schedule": "schedule",
    "virtual_stages": "virtual_stages",
    "layers_per_stage": "layers_per_stage",
}


def reevaluate(
    plan: Plan, changes: Mapping[str, Any], *, cluster: Cluster | None = None, profile: ProfileChoice = None
) -> Evaluation:
    """A saved plan (``load_plan``) evaluated again with ``changes``: its fields by the names of evaluate's
    options (``PLAN_FIELDS``) and run settings by name (each checked as ``Job.with_settings`` checks it),
    on the plan's model, cluster (or ``cluster``: the plan's with a facility), batch and rank order. A new
    schedule without virtual stages takes its own chunks per stage (1F1B one, ZB-V and DualPipeV two,
    interleaved the plan's); a new pp, schedule or virtual stages without layers_per_stage splits the
    layers evenly."""
    dims_changes = {PLAN_FIELDS[k]: v for k, v in changes.items() if k in PLAN_FIELDS}
    settings = {k: v for k, v in changes.items() if k not in PLAN_FIELDS}
    if {"pp", "schedule", "virtual_stages"} & set(dims_changes) and "layers_per_stage" not in dims_changes:
        dims_changes["layers_per_stage"] = None
    if "schedule" in dims_changes or "virtual_stages" in dims_changes:
        dims_changes |= _schedule_change(plan.dims, dims_changes.get("schedule"), dims_changes.get("virtual_stages"))
    dims = replace(plan.dims, **dims_changes)
    job = plan.job.with_settings(**settings) if settings else plan.job
    on = plan.cluster if cluster is None else cluster
    return evaluate_full(plan.model, on, dims, job, axis_order=plan.axis_order, profile=profile)


def _schedule_change(dims: ParallelDims, schedule: Schedule | None, virtual: int | None) -> dict[str, Any]:
    """The schedule and chunks per stage a change of either gives: a schedule without chunks takes its own
    (interleaved keeps the plan's), chunks without a schedule turn 1F1B into interleaved and back
    (cost/schedules ``named``)."""
    if schedule is None:
        schedule = Schedule.ONE_F_ONE_B if dims.schedule is Schedule.INTERLEAVED else dims.schedule
    if virtual is None:
        virtual = Schedule(schedule).chunks or dims.virtual_stages
    return {"schedule": named_schedule(schedule, virtual), "virtual_stages": virtual}


def framework_order(framework: Framework) -> tuple[str, ...]:
    """The rank order (fastest axis first) ``framework`` lays ranks out in unless told otherwise (its
    export's default: Megatron-LM's and NeMo's tp-cp-ep-dp-pp, torchtitan's device mesh, DeepSpeed's
    topology); nestplan's own for plain FSDP, which has no export and shards over the data axis alone."""
    from nestplan.export import default_order

    export = FRAMEWORK_EXPORTS.get(framework)
    return DEFAULT_AXIS_ORDER if export is None else default_order(export)


def _expert_dp_hint(plan: ParallelDims, devices: int) -> str:
    """Both conventions for dp beside ep, with the numbers: nestplan's dp excludes the expert
    ranks, Megatron-LM's (``--data-parallel-size``) counts them."""
    others = plan.tp * plan.cp * plan.pp
    text = (
        f"; nestplan's dp excludes the {plan.ep} expert ranks (devices = tp x cp x ep x pp x dp), "
        f"Megatron-LM's dp counts them (devices = tp x cp x pp x dp, ep dividing dp)"
    )
    if devices % (others * plan.ep):
        return text + f": neither fills {devices} devices with tp x cp x pp = {others} and ep {plan.ep}"
    dp = devices // (others * plan.ep)
    return text + f": {devices} devices take nestplan's dp {dp}, which is Megatron-LM's dp {dp * plan.ep}"


def plot_plan(plan: Plan, out_dir: str | Path, title: str = "") -> list[Path]:
    """Figures of one plan: pipeline timeline (its length is the predicted step time), memory per
    stage, placement of stages and replicas on the network levels. A plan read from a file is
    evaluated again first (the figures draw the evaluator's schedule)."""
    from nestplan.report.plots import write_plan_plots

    pred = plan.prediction or evaluate_plan(plan.model, plan.cluster, plan.dims, plan.job, plan.axis_order)
    title = title or f"{plan.model.name} on {plan.cluster.name}"
    return write_plan_plots(pred, plan.cluster.topology, Path(out_dir), title, plan.cluster.host_devices)
