"""The library surface: load inputs, evaluate a plan. The CLI is a thin shell over this."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from nestplan.cluster import Cluster, load_cluster
from nestplan.cost.evaluator import evaluate_plan
from nestplan.cost.prediction import Prediction
from nestplan.errors import ConfigError
from nestplan.job import Job
from nestplan.model import ModelSpec, load_model
from nestplan.report.plan_json import SearchStats, plan_to_dict
from nestplan.strategy.dims import ParallelDims, check_against_model
from nestplan.strategy.placement import DEFAULT_AXIS_ORDER

DEFAULT_SEQ_LEN_CAP = 8192


def resolve_model(model: str | ModelSpec) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else load_model(model)


def resolve_cluster(cluster: str | Cluster, devices: int | None = None) -> Cluster:
    if isinstance(cluster, Cluster):
        return cluster if devices is None else cluster.truncate(devices)
    return load_cluster(cluster, devices)


def default_seq_len(model: ModelSpec) -> int:
    """The model's context length, capped at 8192 (a typical pre-training length)."""
    return min(model.max_position_embeddings, DEFAULT_SEQ_LEN_CAP)


def default_dtype(cluster: Cluster) -> str:
    """bf16 where the accelerator has it, else fp16 (V100)."""
    return "bf16" if "bf16" in cluster.accelerator.peak_flops else "fp16"


def make_job(model: ModelSpec, global_batch_size: int, seq_len: int | None = None, **kwargs: Any) -> Job:
    return Job(global_batch_size=global_batch_size, seq_len=seq_len or default_seq_len(model), **kwargs)


@dataclass(frozen=True)
class Evaluation:
    """A prediction with the inputs it was made for; ``to_dict`` gives the plan JSON."""

    model: ModelSpec
    cluster: Cluster
    job: Job
    prediction: Prediction
    solve_time_s: float

    def to_dict(self) -> dict[str, Any]:
        return plan_to_dict(
            self.prediction, model=self.model.name, cluster=self.cluster.name,
            devices_total=self.cluster.devices, job=self.job,
            level_names=[lv.name for lv in self.cluster.topology.levels],
            search=SearchStats(self.solve_time_s, candidates=1, pruned_memory=0))

    def plot(self, out_dir: str | Path) -> list[Path]:
        """Write the plan's timeline.png, memory.png and placement.png (needs matplotlib)."""
        return plot_plan(self.prediction, self.cluster, out_dir, title=f"{self.model.name} on {self.cluster.name}")


def evaluate(model: str | ModelSpec, cluster: str | Cluster, plan: ParallelDims, job: Job,
             *, devices: int | None = None, axis_order: Sequence[str] = DEFAULT_AXIS_ORDER) -> Prediction:
    """Predict step time, its breakdown and memory per device of one plan."""
    return evaluate_full(model, cluster, plan, job, devices=devices, axis_order=axis_order).prediction


def evaluate_full(model: str | ModelSpec, cluster: str | Cluster, plan: ParallelDims, job: Job,
                  *, devices: int | None = None, axis_order: Sequence[str] = DEFAULT_AXIS_ORDER) -> Evaluation:
    """Like :func:`evaluate`, keeping the inputs for reporting.

    ``devices`` takes the first N devices of the cluster and must equal the plan's
    tp x cp x ep x pp x dp; without it the plan's product is taken.
    """
    spec = resolve_model(model)
    check_against_model(plan, spec, job.seq_len)
    n = plan.devices if devices is None else devices
    if devices is not None and plan.devices != devices:
        raise ConfigError(
            f"the plan's degrees multiply to tp x cp x ep x pp x dp = {plan.tp} x {plan.cp} x {plan.ep} x "
            f"{plan.pp} x {plan.dp} = {plan.devices}, not the {devices} devices asked for",
            field="devices", value=plan.devices, limit=devices)
    cl = resolve_cluster(cluster, n)
    start = time.perf_counter()
    pred = evaluate_plan(spec, cl, plan, job, axis_order)
    return Evaluation(spec, cl, job, pred, time.perf_counter() - start)


def catalog_names(kind: str) -> list[str]:
    """Names in the catalog: 'models', 'accelerators' or 'clusters'."""
    from nestplan.cluster import cluster_names
    from nestplan.hardware import accelerator_names
    from nestplan.model import model_names

    listers = {"models": model_names, "accelerators": accelerator_names, "clusters": cluster_names}
    key = kind.strip().lower()
    if key not in listers:
        raise ConfigError(f"cannot list '{kind}'; choose one of: {', '.join(listers)}", field="kind", value=kind,
                          limit=list(listers))
    return listers[key]()


DEFAULT_GLOBAL_BATCH = 4096   # the NEST paper's evaluation (section 5.1)


@dataclass(frozen=True)
class PlanReport:
    """The best plan, the runner-ups (best first) and the search statistics."""

    model: ModelSpec
    cluster: Cluster
    job: Job
    best: Prediction
    runners_up: tuple[Prediction, ...]
    stats: Any

    def to_dict(self) -> dict[str, Any]:
        return plan_to_dict(
            self.best, model=self.model.name, cluster=self.cluster.name, devices_total=self.cluster.devices,
            job=self.job, level_names=[lv.name for lv in self.cluster.topology.levels],
            search=SearchStats(self.stats.solve_time_s, candidates=self.stats.candidates,
                               pruned_memory=self.stats.pruned_memory))

    def plot(self, out_dir: str | Path) -> list[Path]:
        """Write the best plan's timeline.png, memory.png and placement.png (needs matplotlib)."""
        return plot_plan(self.best, self.cluster, out_dir, title=f"{self.model.name} on {self.cluster.name}")


def plot_plan(pred: Prediction, cluster: str | Cluster, out_dir: str | Path, title: str = "") -> list[Path]:
    """Figures of one evaluated plan: pipeline timeline (its length is the predicted step time),
    memory per stage, placement of stages and replicas on the network levels."""
    from nestplan.report.plots import write_plan_plots

    cl = resolve_cluster(cluster)
    return write_plan_plots(pred, cl.topology, Path(out_dir), title or cl.name)


def plan(model: str | ModelSpec, cluster: str | Cluster, job: Job | None = None, *, devices: int | None = None,
         global_batch_size: int | None = None, seq_len: int | None = None, top: int = 5,
         space: Any = None, progress: Any = None) -> PlanReport:
    """Find the plan with the highest predicted throughput that fits (NEST's dynamic program).

    Raises InfeasibleError (exit code 3) explaining the leanest plan's memory when nothing fits.
    """
    from nestplan.search.infeasible import infeasible_error
    from nestplan.search.planner import check_job, search
    from nestplan.search.space import SearchSpace

    spec = resolve_model(model)
    cl = resolve_cluster(cluster, devices)
    if job is None:
        job = make_job(spec, global_batch_size or DEFAULT_GLOBAL_BATCH, seq_len, dtype=default_dtype(cl))
    n = cl.devices
    check_job(spec, cl, job, n)
    space = space or SearchSpace()
    result = search(spec, cl, job, n, space, top=top, progress=progress)
    if result.best is None:
        raise infeasible_error(spec, cl, job, n, space)
    return PlanReport(spec, cl, job, result.best, result.runners_up, result.stats)


def sweep(spec: str | Path, out_dir: str | Path, *, workers: int = 2, ray: str | None = None,
          progress: Any = None) -> Any:
    """Run a sweep spec (TOML) into out_dir/results.sqlite, skipping cases already there.

    ``ray``: None for local processes (``workers`` of them), or ``local``, ``auto``,
    ``ray://host:port`` to run on a Ray cluster. Returns a SweepSummary.
    """
    from nestplan.sweep.run import run_sweep
    from nestplan.sweep.spec import load_spec

    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}", field="workers", value=workers, limit=">= 1")
    return run_sweep(load_spec(spec), Path(out_dir), workers=workers, ray_address=ray, progress=progress)


def sweep_report(out_dir: str | Path) -> tuple[list[dict[str, Any]], list[Path]]:
    """Rows of a sweep's store (best first per model) and the CSV and plots written into out_dir."""
    from nestplan.sweep.report import read_rows, write_csv, write_plots

    out = Path(out_dir)
    rows = read_rows(out)
    csv_path = out / "results.csv"
    write_csv(rows, csv_path)
    return rows, [csv_path, *write_plots(rows, out)]


def export_plan(plan: Mapping[str, Any], framework: str, out_dir: str | Path, *,
                model: str | ModelSpec | None = None, cluster: str | Cluster | None = None) -> tuple[list[Path], Any]:
    """Write a framework's launch files for a plan JSON object (``PlanReport.to_dict()`` or a saved
    ``--json`` file). Model and cluster default to the names the plan carries. Where the
    framework's rank order differs from the one costed, the export quotes nestplan's prediction
    under the framework's order too. Returns (paths written, the Export with its notes)."""
    from nestplan import __version__
    from nestplan.export import build_input, check_framework, export, framework_orders
    from nestplan.export.common import choose_order
    from nestplan.export.plan import check_schema, read_plan

    key = check_framework(framework)
    check_schema(plan)
    spec = resolve_model(model or str(plan.get("model")))
    settings = read_plan(plan)
    cl = resolve_cluster(cluster or str(plan.get("cluster")), settings.devices)
    order = choose_order(settings, framework_orders(key, settings))
    alternative = None
    if order != settings.axis_order:
        dims = ParallelDims(tp=settings.tp, pp=settings.pp, dp=settings.dp, cp=settings.cp, ep=settings.ep,
                            sp=settings.sp, zero=settings.zero, recompute=settings.recompute,
                            micro_batch_size=settings.micro_batch_size, schedule=settings.schedule,
                            virtual_stages=settings.virtual_stages, layers_per_stage=settings.layers_per_stage)
        job = make_job(spec, settings.global_batch_size, settings.seq_len, dtype=settings.dtype)
        other = evaluate_plan(spec, cl, dims, job, order)
        alternative = {"step_time_s": other.step_time_s, "tokens_per_s": other.tokens_per_s}
    inp = build_input(plan, spec, cl.topology, __version__, alternative=alternative)
    result = export(key, inp)
    return result.write(out_dir), result


def trace(model: str | ModelSpec, seq_len: int | None = None, layers: int = 2) -> tuple[Any, list[dict[str, Any]]]:
    """Trace a model's Hugging Face config (needs the [trace] extra) and compare each traced block
    with the closed-form formulas: (TraceResult, rows of traced and closed-form figures)."""
    import json as _json

    from nestplan.catalog import entry_path
    from nestplan.model.layers import Recomputation, Shard, block_activation_bytes, block_model_flops
    from nestplan.model.trace import trace_config

    spec = resolve_model(model)
    text = str(model)
    path = Path(text) if (text.endswith(".json") or "/" in text) else entry_path("model", text)
    config = _json.loads(path.read_text())
    s = seq_len or min(default_seq_len(spec), 2048)
    result = trace_config(config, seq_len=s, layers=layers)
    rows = []
    for b in result.blocks:
        flops = 3 * block_model_flops(spec, b.index, s, s)
        saved = block_activation_bytes(spec, b.index, Shard(seq_len=s), Recomputation.NONE)
        rows.append({"block": b.index, "moe": spec.is_moe_layer(b.index), "traced_flops": b.flops,
                     "closed_flops": flops, "traced_saved_bytes": b.saved_bytes, "closed_saved_bytes": saved})
    return result, rows


def calibrate(model: ModelSpec, rows: Sequence[Mapping[str, Any]]) -> ModelSpec:
    """The model with the traced/closed-form ratios of its blocks (``trace``'s rows, averaged) as
    the cost model's block compute and activation scales."""
    from dataclasses import replace as _replace

    flops = sum(r["traced_flops"] for r in rows) / sum(r["closed_flops"] for r in rows)
    saved = sum(r["traced_saved_bytes"] for r in rows) / sum(r["closed_saved_bytes"] for r in rows)
    return _replace(model, traced_flops_scale=flops, traced_activation_scale=saved)



def nest_solve(source: str | Path | Mapping[str, Any], *, progress: Any = None) -> tuple[Any, dict[str, Any], Any]:
    """The NEST authors' solver, drop-in: read their input (a ``dp_input.json`` path or its
    parsed object), search with their cost semantics on nestplan's engine, re-cost their
    baselines. Returns (the validated input, the output object in their schema, the
    NestResult with the plan's costs and the search statistics)."""
    from nestplan.compat.schema import parse_input, read_input
    from nestplan.compat.solve import solve, to_output

    inp = parse_input(source) if isinstance(source, Mapping) else read_input(source)
    result = solve(inp, progress=progress)
    return inp, to_output(inp, result), result


def nest_explain(inp: Any, result: Any, *, model: str | None = None, cluster: str | None = None) -> list[str]:
    """What the authors' unit mix hides in a nest_solve result, and nestplan's physical
    prediction of the same plan when a catalog model and cluster are named."""
    from nestplan.compat.explain import explain

    return explain(inp, result, model=model, cluster=cluster)
