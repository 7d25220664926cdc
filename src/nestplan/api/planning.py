"""The search for the best plan: ``plan`` and its ``PlanReport`` (runner-ups, schedule alternatives)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nestplan.api.display import heading, summary
from nestplan.api.evaluation import plot_plan
from nestplan.api.resolve import (
    DEFAULT_GLOBAL_BATCH,
    job_for,
    search_space,
    resolve_cluster,
    resolve_model,
)
from nestplan.cluster import Cluster
from nestplan.cost.evaluator import evaluate_plan
from nestplan.cost.schedules import family as schedule_family
from nestplan.cost.prediction import Prediction, html_table, rank_order
from nestplan.errors import ConfigError
from nestplan.job import Job
from nestplan.model import ModelSpec
from nestplan.plan import Plan, SearchStats
from nestplan.profile import ProfileChoice, calibrated_cluster, is_tie
from nestplan.strategy.describe import describe
from nestplan.strategy.enums import Schedule
from nestplan.units import GiB

if TYPE_CHECKING:  # imported where used: the CLI starts without the search, the exports and the sweep
    from nestplan.search.space import SearchSpace


MAX_TOP = 100  # runner-up plans a search keeps: each costs finalists kept and simulated
# runner-ups x layers: each runner-up keeps 4 finalists, each evaluated and its schedule variants simulated
# over every layer (a 1,024-layer model: at most 16 runner-ups, tens of seconds; 100 of them took minutes)
MAX_TOP_LAYERS = 2**14


@dataclass(frozen=True)
class ScheduleAlternative:
    """One pipeline schedule at a plan's degrees: its prediction, or why it cannot run there."""

    schedule: Schedule
    virtual_stages: int
    prediction: Prediction | None
    refused: str

    def verdict(self, best: Prediction) -> str:
        """Why it won or lost against ``best``, one phrase."""
        p = self.prediction
        if p is None:
            return "not legal here: " + self.refused
        if not p.fits:
            return f"does not fit: {p.peak_memory_bytes_per_device / GiB:.1f} GiB per device"
        if p is best:
            return "the plan's"
        bubble = p.breakdown_s["pipeline_bubble"] - best.breakdown_s["pipeline_bubble"]
        return f"{p.step_time_s / best.step_time_s - 1:+.1%} (bubble {bubble:+.3f} s)"


@dataclass(frozen=True)
class PlanReport:
    """The best plan, the runner-ups (best first) and the search statistics."""

    model: ModelSpec
    cluster: Cluster
    job: Job
    best: Prediction
    runners_up: tuple[Prediction, ...]
    stats: SearchStats

    @property
    def plan(self) -> Plan:
        """The best plan, typed: ``to_dict`` (the plan JSON, ``nestplan plan --json``), exports and plots
        read it."""
        return Plan.from_prediction(
            self.best,
            self.model,
            self.cluster,
            self.job,
            SearchStats(
                self.stats.solve_time_s, candidates=self.stats.candidates, pruned_memory=self.stats.pruned_memory
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        """The best plan's JSON, with its runner-ups (each marked a tie where it lies within the best's
        trust band)."""
        best = self.plan
        band = best.trust
        runners = [
            {
                "plan": describe(p.plan, p.placement.axis_order, long=True),
                "step_time_s": p.step_time_s,
                "vs_best": p.step_time_s / self.best.step_time_s - 1.0,
                "tie": is_tie(p.step_time_s, self.best.step_time_s, band),
                "peak_memory_bytes_per_device": p.peak_memory_bytes_per_device,
            }
            for p in self.runners_up
        ]
        # the search's counters (its time is the plan's search.solve_time_s); unrefined: finalists ranked on the
        # search's split, past the refinement's bound
        counters = {key: value for key, value in asdict(self.stats).items() if key != "solve_time_s"}
        stats = counters | {"enumerated": self.stats.enumerated}
        return best.to_dict() | {"runners_up": runners, "search_stats": stats}

    def plot(self, out_dir: str | Path) -> list[Path]:
        """Write the best plan's timeline.png, memory.png and placement.png (needs matplotlib)."""
        return plot_plan(self.plan, out_dir)

    def __repr__(self) -> str:
        return f"PlanReport({summary(self.model, self.cluster, self.best)}; {len(self.runners_up)} runner-ups)"

    def _repr_html_(self) -> str:
        """The best plan's tables, then the runner-ups against it."""
        searched = f"best of {self.stats.candidates:,} candidates, {self.stats.solve_time_s:.2f} s"
        return heading(self.model, self.cluster, searched) + self.best._repr_html_() + self.runners_up_html()

    def schedule_alternatives(self) -> list[ScheduleAlternative]:
        """The best plan's degrees and split under every pipeline schedule (interleaved and the V
        schedules with 2 chunks per stage), evaluated: why each other schedule lost or could not run."""
        best = self.best
        dims = replace(best.plan, layers_per_stage=tuple(s.last_layer - s.first_layer + 1 for s in best.stages))
        out = []
        for schedule in Schedule:
            v = schedule_family(schedule).shown_virtual_stages
            if schedule is best.plan.schedule:
                out.append(ScheduleAlternative(schedule, best.plan.virtual_stages, best, ""))
                continue
            try:
                variant = replace(dims, schedule=schedule, virtual_stages=v)
                pred = evaluate_plan(self.model, self.cluster, variant, self.job, best.placement.axis_order)
            except ConfigError as err:
                out.append(ScheduleAlternative(schedule, v, None, str(err)))
                continue
            out.append(ScheduleAlternative(schedule, v, pred, ""))
        return out

    def runners_up_html(self) -> str:
        best = self.best.step_time_s
        rows = [
            (
                rank,
                describe(p.plan),
                rank_order(p.placement),
                f"{p.step_time_s:.4g}",
                f"{p.tokens_per_s:,.0f}",
                f"{p.mfu:.1%}",
                f"{p.step_time_s / best - 1:+.1%}",
            )
            for rank, p in enumerate(self.runners_up, 2)
        ]
        return html_table(
            "runner-ups", ("rank", "plan", "rank order", "step s", "tokens/s", "MFU", "step vs best"), rows
        )


def check_top_layers(top: int, model: ModelSpec) -> None:
    """Refuse more runner-ups than MAX_TOP_LAYERS allows on ``model``'s layers, in one line."""
    if top * model.num_layers > MAX_TOP_LAYERS:
        most = MAX_TOP_LAYERS // model.num_layers
        raise ConfigError(
            f"top {top} runner-ups on {model.num_layers:,} layers exceeds {MAX_TOP_LAYERS:,} runner-up layers: "
            f"at most {most} runner-ups for this model",
            field="top",
            value=top,
            limit=most,
        )


def plan(
    model: str | ModelSpec,
    cluster: str | Cluster,
    job: Job | None = None,
    *,
    devices: int | None = None,
    global_batch_size: int | None = None,
    seq_len: int | None = None,
    top: int = 5,
    space: SearchSpace | None = None,
    progress: Callable[[int], None] | None = None,
    profile: ProfileChoice = None,
) -> PlanReport:
    """Find the plan with the highest predicted throughput that fits (NEST's dynamic program), on the
    cluster as ``profile`` calibrates it (``resolve.calibrated_cluster``).

    Raises InfeasibleError (exit code 3) explaining the leanest plan's memory when nothing fits.
    """
    from nestplan.search.planner import plan_job

    if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_TOP:
        raise ConfigError(
            f"top must be an integer in 0..{MAX_TOP} (runner-up plans), got {top!r}",
            field="top",
            value=top,
            limit=f"0..{MAX_TOP}",
        )
    spec = resolve_model(model)
    check_top_layers(top, spec)
    cl = resolve_cluster(cluster, devices)
    if job is None:
        job = job_for(spec, cl, global_batch_size or DEFAULT_GLOBAL_BATCH, seq_len)
    cl = calibrated_cluster(cl, job.settings.framework, profile)
    if space is None:  # what the job's framework runs, as the command line searches it
        space = search_space(model=spec, framework=job.settings.framework)
    result = plan_job(spec, cl, job, space, top=top, progress=progress)
    return PlanReport(spec, cl, result.job, result.best, result.runners_up, result.stats)
