"""The library surface: load inputs, evaluate a plan. The CLI is a thin shell over this."""

from __future__ import annotations

import html
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nestplan.cluster import Cluster, load_cluster
from nestplan.cost.evaluator import evaluate_plan
from nestplan.cost.schedules import family as schedule_family
from nestplan.cost.prediction import Prediction, html_table, rank_order
from nestplan.errors import ConfigError, printable
from nestplan.job import (
    Job,
    Optimizer,
    check_context,
    check_fp8,
    default_fp8_recipe,
    default_seq_len,
    make_job,
    preferred_dtype,
)
from nestplan.model import ModelSpec, load_model
from nestplan.plan import Plan, SearchStats
from nestplan.settings import CpCommType, Fp8Recipe, RunSettings
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.legality import check_against_model
from nestplan.strategy.describe import describe
from nestplan.strategy.enums import Recompute, Schedule
from nestplan.strategy.placement import DEFAULT_AXIS_ORDER
from nestplan.units import GiB, MiB

if TYPE_CHECKING:  # imported where used: the CLI starts without the search, the exports and the sweep
    import pandas

    from nestplan.compat.schema import NestInput
    from nestplan.compat.solve import NestResult
    from nestplan.export.common import Export
    from nestplan.model.trace import TraceResult
    from nestplan.search.compare import CompareRow
    from nestplan.search.space import SearchSpace
    from nestplan.sweep.run import SweepSummary
    from nestplan.validate import RowResult

MAX_TOP = 100  # runner-up plans a search keeps: each costs finalists kept and simulated
MAX_WORKERS = 1024  # local worker processes of a sweep


def resolve_model(model: str | ModelSpec) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else load_model(model)


def resolve_cluster(cluster: str | Cluster, devices: int | None = None) -> Cluster:
    if isinstance(cluster, Cluster):
        return cluster if devices is None else cluster.truncate(devices)
    return load_cluster(cluster, devices)


def framework_settings(
    cluster: Cluster, *, fp8: bool = False, fp8_recipe: Fp8Recipe | None = None, **settings: Any
) -> dict[str, Any]:
    """Run settings by name (``settings.RunSettings``'s fields) as given, and an FP8 recipe when ``fp8``
    or ``fp8_recipe`` asks for one, by default the accelerator's (``job.default_fp8_recipe``)."""
    acc = cluster.accelerator
    if fp8_recipe is not None:
        check_fp8(acc.peak_flops)
    elif fp8:
        fp8_recipe = default_fp8_recipe(acc.peak_flops, acc.mx_block_scaling)
    return {"fp8_recipe": fp8_recipe, **settings}


def job_for(
    model: ModelSpec,
    cluster: Cluster,
    global_batch_size: int,
    seq_len: int | None,
    *,
    dtype: str | None = None,
    optimizer: Optimizer = Optimizer.ADAM,
    fp8: bool = False,
    **settings: Any,
) -> Job:
    """A Job for ``model`` on ``cluster``: ``dtype`` by default the accelerator's (``default_dtype``),
    its run settings by name in ``settings`` (each checked; an unknown name refused), the FP8 recipe
    as ``framework_settings`` resolves it."""
    run = RunSettings.from_mapping(framework_settings(cluster, fp8=fp8, **settings))
    return make_job(
        model, global_batch_size, seq_len, dtype=dtype or default_dtype(cluster), optimizer=optimizer, settings=run
    )


def default_dtype(cluster: Cluster) -> str:
    """bf16 where the cluster's accelerator has it, else fp16 (V100)."""
    return preferred_dtype(cluster.accelerator.peak_flops)


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
        return f"Evaluation({_summary(self.model, self.cluster, self.prediction)})"

    def _repr_html_(self) -> str:
        return _heading(self.model, self.cluster, "evaluated") + self.prediction._repr_html_()


NAME_WIDTH = 24  # characters of a model's or a cluster's name in a one-line repr


def _short(name: str, width: int = NAME_WIDTH) -> str:
    """``name`` printable and cut to ``width`` characters."""
    text = printable(name)
    return text if len(text) <= width else text[: width - 3] + "..."


def _summary(model: ModelSpec, cluster: Cluster, pred: Prediction) -> str:
    """One line: what ran where, the plan and its headline figures."""
    return (
        f"{_short(model.name)} on {_short(cluster.name)}: {describe(pred.plan)}, step {pred.step_time_s:.4g} s, "
        f"{pred.tokens_per_s:,.0f} tokens/s, MFU {pred.mfu:.1%}, {'fits' if pred.fits else 'does NOT fit'}"
    )


def _heading(model: ModelSpec, cluster: Cluster, what: str) -> str:
    return (
        f"<h4>{html.escape(model.name)} on {html.escape(cluster.name)} "
        f"({cluster.devices:,} devices): {html.escape(what)}</h4>"
    )


def evaluate(
    model: str | ModelSpec,
    cluster: str | Cluster,
    plan: ParallelDims,
    job: Job,
    *,
    devices: int | None = None,
    axis_order: Sequence[str] = DEFAULT_AXIS_ORDER,
) -> Prediction:
    """Predict step time, its breakdown and memory per device of one plan."""
    return evaluate_full(model, cluster, plan, job, devices=devices, axis_order=axis_order).prediction


def evaluate_full(
    model: str | ModelSpec,
    cluster: str | Cluster,
    plan: ParallelDims,
    job: Job,
    *,
    devices: int | None = None,
    axis_order: Sequence[str] = DEFAULT_AXIS_ORDER,
) -> Evaluation:
    """Like :func:`evaluate`, keeping the inputs for reporting.

    ``devices`` takes the first N devices of the cluster and must equal the plan's
    tp x cp x ep x pp x dp; without it the plan's product is taken.
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
    cl = resolve_cluster(cluster, plan.devices)
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


def megatron_dp(plan: ParallelDims, devices: int | None) -> ParallelDims | None:
    """``plan`` with its dp read in Megatron-LM's convention (dp counting the ep expert ranks) and
    converted to nestplan's (dp / ep), when only that reading fills ``devices``; None otherwise."""
    if devices is None or plan.ep == 1 or plan.devices == devices or plan.dp % plan.ep:
        return None
    if plan.tp * plan.cp * plan.pp * plan.dp != devices:
        return None
    return replace(plan, dp=plan.dp // plan.ep)


CATALOG_KINDS = ("models", "accelerators", "clusters")


def catalog_names(kind: str) -> list[str]:
    """Names in the catalog: 'models', 'accelerators' or 'clusters'."""
    from nestplan.cluster import cluster_names
    from nestplan.hardware import accelerator_names
    from nestplan.model import model_names

    listers = {"models": model_names, "accelerators": accelerator_names, "clusters": cluster_names}
    return listers[_catalog_kind(kind)]()


def _catalog_kind(kind: str) -> str:
    key = kind.strip().lower()
    if key not in CATALOG_KINDS:
        raise ConfigError(
            f"cannot list '{printable(kind)}'; choose one of: {', '.join(CATALOG_KINDS)}",
            field="kind",
            value=printable(kind),
            limit=list(CATALOG_KINDS),
        )
    return key


def catalog_entries(kind: str) -> list[dict[str, Any]]:
    """The catalog's 'models', 'accelerators' or 'clusters', one dict each: name, sizes, source."""
    key = _catalog_kind(kind)
    describe = {"models": _model_entry, "accelerators": _accelerator_entry, "clusters": _cluster_entry}[key]
    return [describe(name) for name in catalog_names(key)]


def _model_entry(name: str) -> dict[str, Any]:
    from nestplan.catalog import entry_path
    from nestplan.inputs import load_object
    from nestplan.model.layers import total_params

    spec = load_model(name)
    return {
        "name": name,
        "family": spec.family,
        "layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "parameters_B": total_params(spec) / 1e9,
        "experts": spec.num_experts,
        "max_position_embeddings": spec.max_position_embeddings,
        "source": str(load_object(entry_path("model", name), "model config").get("_source", "")),
    }


def _accelerator_entry(name: str) -> dict[str, Any]:
    from nestplan.hardware import load_accelerator

    acc = load_accelerator(name)
    return {
        "name": name,
        "peak_TFLOPS": {dtype: flops / 1e12 for dtype, flops in acc.peak_flops.items()},
        "hbm_GiB": acc.hbm_bytes / GiB,
        "hbm_bandwidth_TBps": acc.hbm_bandwidth_Bps / 1e12,
        "source": acc.source,
    }


def _cluster_entry(name: str) -> dict[str, Any]:
    from nestplan.cluster import cluster_data

    cl = load_cluster(name)
    return {
        "name": name,
        "accelerator": cl.accelerator.name,
        "devices": cl.devices,
        "levels": [{"name": lv.name, "size": lv.size} for lv in cl.topology.levels],
        "source": str(cluster_data(name).get("source", "")),
    }


DEFAULT_GLOBAL_BATCH = 4096  # the NEST paper's evaluation (section 5.1)


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
        return self.plan.to_dict()

    def plot(self, out_dir: str | Path) -> list[Path]:
        """Write the best plan's timeline.png, memory.png and placement.png (needs matplotlib)."""
        return plot_plan(self.plan, out_dir)

    def __repr__(self) -> str:
        return f"PlanReport({_summary(self.model, self.cluster, self.best)}; {len(self.runners_up)} runner-ups)"

    def _repr_html_(self) -> str:
        """The best plan's tables, then the runner-ups against it."""
        searched = f"best of {self.stats.candidates:,} candidates, {self.stats.solve_time_s:.2f} s"
        return _heading(self.model, self.cluster, searched) + self.best._repr_html_() + self.runners_up_html()

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


def plot_plan(plan: Plan, out_dir: str | Path, title: str = "") -> list[Path]:
    """Figures of one plan: pipeline timeline (its length is the predicted step time), memory per
    stage, placement of stages and replicas on the network levels. A plan read from a file is
    evaluated again first (the figures draw the evaluator's schedule)."""
    from nestplan.report.plots import write_plan_plots

    pred = plan.prediction or evaluate_plan(plan.model, plan.cluster, plan.dims, plan.job, plan.axis_order)
    return write_plan_plots(
        pred, plan.cluster.topology, Path(out_dir), title or f"{plan.model.name} on {plan.cluster.name}"
    )


def check_exportable(model: str | ModelSpec, framework: str) -> None:
    """Raise the one-line ConfigError ``framework``'s export would give for a model it cannot build,
    so that ``plan --export`` refuses before it searches."""
    from nestplan.export import check_framework, check_model

    check_model(check_framework(framework), resolve_model(model))


def search_space(
    *,
    schedules: Sequence[Schedule] | None = None,
    cp_comm_types: Sequence[CpCommType] | None = None,
    export: str | None = None,
    memory_margin: float | None = None,
    expert_tp: Sequence[int | None] | None = None,
    moe_comm_overlap: bool = True,
    model: ModelSpec | None = None,
) -> SearchSpace:
    """The full search space, its pipeline schedules narrowed to ``schedules``, its context-parallel
    exchanges to ``cp_comm_types`` and its expert tensor parallelism to ``expert_tp`` (None: all; an
    entry None is etp = tp), each also to those the ``export`` framework runs as costed, and the MoE
    all-to-all overlap tried where ``moe_comm_overlap`` and the framework allow (for ``model``, which an
    ``export`` needs). 1F1B, the schedule
    the search ranks splits under, is always in. ``memory_margin``: the fraction of device
    memory plans leave free (None: search/space.py DEFAULT_MEMORY_MARGIN)."""
    from nestplan.export import (
        check_framework,
        framework_cp_comm,
        framework_expert_tp,
        framework_moe_overlap,
        framework_schedules,
    )
    from nestplan.search.space import DEFAULT_MEMORY_MARGIN, SearchSpace

    chosen = tuple(schedules) if schedules is not None else tuple(Schedule)
    kinds = tuple(cp_comm_types) if cp_comm_types is not None else tuple(CpCommType)
    etps = tuple(expert_tp) if expert_tp is not None else SearchSpace().etp
    if export is not None:
        key = check_framework(export)
        chosen = tuple(s for s in chosen if s in framework_schedules(key))
        kinds = tuple(k for k in kinds if k in framework_cp_comm(key)) or framework_cp_comm(key)
        runs = framework_expert_tp(key)
        if runs is not None:
            etps = tuple(e for e in etps if e in runs) or runs
        assert model is not None, "an export's search space depends on the model"
        moe_comm_overlap = moe_comm_overlap and framework_moe_overlap(key, model)
    return SearchSpace(
        schedules=(Schedule.ONE_F_ONE_B,) + tuple(s for s in chosen if s is not Schedule.ONE_F_ONE_B),
        cp_comm_types=kinds,
        etp=etps,
        moe_comm_overlap=moe_comm_overlap,
        memory_margin=DEFAULT_MEMORY_MARGIN if memory_margin is None else memory_margin,
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
) -> PlanReport:
    """Find the plan with the highest predicted throughput that fits (NEST's dynamic program).

    Raises InfeasibleError (exit code 3) explaining the leanest plan's memory when nothing fits.
    """
    from nestplan.search.planner import plan_job
    from nestplan.search.space import SearchSpace

    if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_TOP:
        raise ConfigError(
            f"top must be an integer in 0..{MAX_TOP} (runner-up plans), got {top!r}",
            field="top",
            value=top,
            limit=f"0..{MAX_TOP}",
        )
    spec = resolve_model(model)
    cl = resolve_cluster(cluster, devices)
    if job is None:
        job = job_for(spec, cl, global_batch_size or DEFAULT_GLOBAL_BATCH, seq_len)
    result = plan_job(spec, cl, job, space or SearchSpace(), top=top, progress=progress)
    return PlanReport(spec, cl, result.job, result.best, result.runners_up, result.stats)


@dataclass(frozen=True)
class CompareCase:
    """One model on one cluster of a comparison, planned at each device count and microbatch size.

    model, cluster: names (or paths), or the objects themselves (the cluster is cut to each count).
    hbm_bytes: device memory to plan with instead of the accelerator's, without a framework
        reserve (the paper's hypothetical small devices); None keeps the accelerator as it is.
    """

    model: str | ModelSpec
    cluster: str | Cluster
    devices: tuple[int, ...]
    micro_batch_sizes: tuple[int, ...] = (1,)
    seq_len: int | None = None
    hbm_bytes: float | None = None


@dataclass(frozen=True)
class Comparison:
    """The rows of one CompareCase (``search.compare.CompareRow``) and their normalised throughput."""

    title: str
    rows: list[CompareRow]
    normalised: list[float]

    @property
    def tag(self) -> str:
        """The title as a file name stem."""
        return self.title.replace(" on ", "_").replace(" ", "_").replace(",", "")

    def to_dict(self) -> dict[str, Any]:
        """The title and the rows, each with its normalised throughput."""
        return {
            "title": self.title,
            "rows": [{**row.to_dict(), "normalised": n} for row, n in zip(self.rows, self.normalised)],
        }

    def to_dataframe(self) -> pandas.DataFrame:
        """The rows as a pandas DataFrame, a column per CompareRow field and ``normalised`` (needs pandas)."""
        from nestplan.search.compare import to_dataframe

        frame = to_dataframe(self.rows)
        frame["normalised"] = self.normalised
        return frame

    def __repr__(self) -> str:
        planners = ", ".join(dict.fromkeys(row.planner for row in self.rows))
        return f"Comparison({_short(self.title, 64)}: {len(self.rows)} rows, {_short(planners, 48)})"


def paper_cases() -> list[CompareCase]:
    """The NEST paper's comparison (``search.compare.paper_grid``): Figure 5's grid, Figure 6's microbatch
    sweep, Table 7's small devices."""
    from nestplan.search.compare import paper_grid

    return [CompareCase(*case) for case in paper_grid()]


def compare(
    cases: Sequence[CompareCase],
    baselines: Sequence[str] = ("manual", "phaze", "mcmc", "alpa"),
    global_batch_size: int = DEFAULT_GLOBAL_BATCH,
) -> list[Comparison]:
    """nestplan against baseline planners on each case, independent cases in parallel processes
    (one per core); each baseline runs once however often it is named."""
    from nestplan.search.compare import check_baselines

    names = list(dict.fromkeys(check_baselines(baselines)))
    jobs = [(case, names, global_batch_size) for case in cases]
    if len(jobs) == 1:
        return [_compare_case(jobs[0])]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        return list(pool.map(_compare_case, jobs))


def _compare_case(args: tuple[CompareCase, list[str], int]) -> Comparison:
    """One case of :func:`compare` (a top-level function, so that it runs in a worker process)."""
    from nestplan.search.compare import normalise, run_compare

    case, names, global_batch_size = args
    spec, whole = resolve_model(case.model), resolve_cluster(case.cluster)
    job = job_for(spec, whole, global_batch_size, case.seq_len)

    def load(n: int) -> Cluster:
        cl = whole.truncate(n)
        if case.hbm_bytes is None:
            return cl
        return replace(cl, accelerator=replace(cl.accelerator, hbm_bytes=case.hbm_bytes, reserved_bytes=0.0))

    rows = run_compare(spec, load, job, case.devices, case.micro_batch_sizes, names)
    title = f"{spec.name} on {whole.name}"
    if case.hbm_bytes is not None:
        gib = case.hbm_bytes / GiB
        title += f" with {gib:g} GiB devices" if gib >= 1 else f" with {case.hbm_bytes / MiB:g} MiB devices"
    elif len(case.micro_batch_sizes) > 1:
        title += f" mbs {','.join(map(str, case.micro_batch_sizes))}"
    return Comparison(title, rows, normalise(rows))


def sweep(
    spec: str | Path,
    out_dir: str | Path,
    *,
    workers: int = 2,
    ray: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SweepSummary:
    """Run a sweep spec (TOML) into out_dir/results.sqlite, skipping cases already there.

    ``ray``: None for local processes (``workers`` of them), or ``local``, ``auto``,
    ``ray://host:port`` to run on a Ray cluster. Returns a SweepSummary.
    """
    from nestplan.sweep.run import run_sweep
    from nestplan.sweep.spec import load_spec

    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= MAX_WORKERS:
        raise ConfigError(
            f"workers must be an integer in 1..{MAX_WORKERS}, got {workers!r}",
            field="workers",
            value=workers,
            limit=f"1..{MAX_WORKERS}",
        )
    return run_sweep(load_spec(spec), Path(out_dir), workers=workers, ray_address=ray, progress=progress)


def sweep_report(out_dir: str | Path) -> tuple[list[dict[str, Any]], list[Path]]:
    """Rows of a sweep's store (best first per model) and the CSV and plots written into out_dir."""
    from nestplan.sweep.report import read_rows, write_csv, write_plots

    out = Path(out_dir)
    rows = read_rows(out)
    csv_path = out / "results.csv"
    write_csv(rows, csv_path)
    return rows, [csv_path, *write_plots(rows, out)]


def load_plan(path: str | Path, *, model: str | ModelSpec | None = None, cluster: str | Cluster | None = None) -> Plan:
    """A saved plan file (``nestplan plan --json``), read through the bounded reader and checked field
    by field (``Plan.from_dict``). ``model`` and ``cluster`` replace the plan's own; they are needed
    only for a plan of schema ``nestplan.plan/1`` whose model or cluster is not in the catalog (a
    cluster named is loaded with the plan's ``devices_total`` devices)."""
    from nestplan.inputs import load_object

    return Plan.from_dict(load_object(path, "plan file"), model=model, cluster=cluster)


def validate(runs: str | Path) -> list[RowResult]:
    """Every measured run of a runs file predicted as it ran (``nestplan.validate``)."""
    from nestplan.validate import validate as validate_runs

    return validate_runs(runs)


def export_plan(plan: Plan, framework: str, out_dir: str | Path) -> tuple[list[Path], Export]:
    """Write a framework's launch files for a plan (``PlanReport.plan``, ``Evaluation.plan`` or
    :func:`load_plan`), on the model and cluster the plan holds (never truncated again). Where the
    framework's rank order differs from the one costed, the export quotes nestplan's prediction
    under the framework's order too. Returns (paths written, the Export with its notes)."""
    from nestplan.export import build
    from nestplan.version import __version__

    result = build(plan, framework, __version__)
    return result.write(out_dir), result


def trace(
    model: str | ModelSpec, seq_len: int | None = None, layers: int = 2
) -> tuple[TraceResult, list[dict[str, Any]]]:
    """Trace a model's Hugging Face config (needs the [trace] extra) and compare each traced block
    with the closed-form formulas: (TraceResult, rows of traced and closed-form figures)."""
    from nestplan.catalog import entry_path
    from nestplan.inputs import load_object
    from nestplan.model.layers import Shard, block_activation_bytes, block_model_flops
    from nestplan.model.trace import trace_config

    spec = resolve_model(model)
    text = str(model)
    path = Path(text) if (text.endswith(".json") or "/" in text) else entry_path("model", text)
    config = load_object(path, "model config file", "json")
    s = min(default_seq_len(spec), 2048) if seq_len is None else seq_len
    check_context(spec, s)
    result = trace_config(config, seq_len=s, layers=layers)
    rows = []
    for b in result.blocks:
        flops = 3 * block_model_flops(spec, b.index, s, s)
        saved = block_activation_bytes(spec, b.index, Shard(seq_len=s), Recompute.NONE)
        rows.append(
            {
                "block": b.index,
                "moe": spec.is_moe_layer(b.index),
                "traced_flops": b.flops,
                "closed_flops": flops,
                "traced_saved_bytes": b.saved_bytes,
                "closed_saved_bytes": saved,
            }
        )
    return result, rows


def calibrate(model: ModelSpec, rows: Sequence[Mapping[str, Any]]) -> ModelSpec:
    """The model with the traced/closed-form ratios of its blocks (``trace``'s rows, averaged) as
    the cost model's block compute and activation scales."""
    flops = sum(r["traced_flops"] for r in rows) / sum(r["closed_flops"] for r in rows)
    saved = sum(r["traced_saved_bytes"] for r in rows) / sum(r["closed_saved_bytes"] for r in rows)
    return replace(model, traced_flops_scale=flops, traced_activation_scale=saved)


def nest_solve(
    source: str | Path | Mapping[str, Any], *, progress: Callable[[int], None] | None = None
) -> tuple[NestInput, dict[str, Any], NestResult]:
    """The NEST authors' solver, drop-in: read their input (a ``dp_input.json`` path or its
    parsed object), search with their cost semantics on nestplan's engine, re-cost their
    baselines. Returns (the validated input, the output object in their schema, the
    NestResult with the plan's costs and the search statistics)."""
    from nestplan.compat.schema import parse_input, read_input
    from nestplan.compat.solve import solve, to_output

    inp = parse_input(source) if isinstance(source, Mapping) else read_input(source)
    result = solve(inp, progress=progress)
    return inp, to_output(inp, result), result


def nest_explain(
    inp: NestInput, result: NestResult, *, model: str | None = None, cluster: str | None = None
) -> list[str]:
    """What the authors' unit mix hides in a nest_solve result, and nestplan's physical
    prediction of the same plan when a catalog model and cluster are named."""
    from nestplan.compat.explain import explain

    return explain(inp, result, model=model, cluster=cluster)
