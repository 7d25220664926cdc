"""Evaluating one given plan: ``evaluate``, ``evaluate_full`` and its ``Evaluation``, and ``plot_plan``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nestplan.api.display import heading, summary
from nestplan.api.resolve import resolve_cluster, resolve_model
from nestplan.profile import ProfileChoice, calibrated_cluster
from nestplan.cluster import Cluster
from nestplan.cost.evaluator import evaluate_plan
from nestplan.cost.prediction import Prediction
from nestplan.errors import ConfigError
from nestplan.job import Job, check_context
from nestplan.model import ModelSpec
from nestplan.plan import Plan, SearchStats
from nestplan.strategy.dims import ParallelDims
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
    axis_order: Sequence[str] = DEFAULT_AXIS_ORDER,
    profile: ProfileChoice = None,
) -> Prediction:
    """Predict step time, its breakdown and memory per device of one plan."""
    return evaluate_full(model, cluster, plan, job, devices=devices, axis_order=axis_order, profile=profile).prediction


def evaluate_full(
    model: str | ModelSpec,
    cluster: str | Cluster,
    plan: ParallelDims,
    job: Job,
    *,
    devices: int | None = None,
    axis_order: Sequence[str] = DEFAULT_AXIS_ORDER,
    profile: ProfileChoice = None,
) -> Evaluation:
    """Like :func:`evaluate`, keeping the inputs for reporting.

    ``devices`` takes the first N devices of the cluster and must equal the plan's
    tp x cp x ep x pp x dp; without it the plan's product is taken. ``profile``: the calibration
    (``resolve.calibrated_cluster``; default the catalog's for the accelerator and the job's framework).
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
    pred = evaluate_plan(spec, cl, plan, job, axis_order)
    return Evaluation(spec, cl, job, pred, time.perf_counter() - start)


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
    return write_plan_plots(
        pred, plan.cluster.topology, Path(out_dir), title or f"{plan.model.name} on {plan.cluster.name}"
    )
