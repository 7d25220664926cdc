"""The planning commands: evaluate, plan, compare and export."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from nestplan import api
from nestplan.cli.app import app
from nestplan.cli.changes import EVALUATE_PLAN_OPTIONS, flags_given, saved_plan
from nestplan.cli.jobs import JOB, require, with_job
from nestplan.cli import options as opt
from nestplan.cli.options import run_options, run_setting_options
from nestplan.cli.output import (
    print_trace,
    check_output,
    drawing,
    make_console,
    LateOutputs,
    output,
    plots,
    print_json,
    print_paths,
    progress,
    replacing,
    say,
    write_report,
)
from nestplan.cli.parse import devices_range as parse_devices_range
from nestplan.cli.parse import (
    GLOBAL_BATCH,
    MAX_LIST_ENTRIES,
    MAX_MICRO_BATCH,
    SEQ_LEN,
    expert_tp_list,
    int_list,
    parse_axis_order,
    parse_layers,
    schedule_list,
)
from nestplan.api.jobfile import JobFile
from nestplan.cluster import Cluster
from nestplan.cost.run import RunLength
from nestplan.cost.schedules import named as named_schedule
from nestplan.errors import ConfigError
from nestplan.job import Optimizer
from nestplan.model.spec import ModelSpec
from nestplan.network.topology import MAX_DEVICES
from nestplan.plan import Plan
from nestplan.settings import CpCommType, Framework
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Schedule

if TYPE_CHECKING:  # the CLI starts without the search
    from nestplan.search.space import SearchSpace


def _from_megatron_dp(plan: ParallelDims, devices: int | None) -> tuple[ParallelDims, str | None]:
    """``plan`` and no note, or, where only Megatron-LM's reading of --dp (counting the expert ranks)
    fills the devices, the plan converted to nestplan's dp and the note that says so (printed once
    the plan has been evaluated: an error stays the only line on stderr)."""
    converted = api.megatron_dp(plan, devices)
    if converted is None:
        return plan, None
    return converted, (
        f"nestplan: note: --dp {plan.dp} read as Megatron-LM's data-parallel size, which counts the "
        f"{plan.ep} expert ranks (tp x cp x pp x dp = {devices}); nestplan's dp excludes them: "
        f"dp {plan.dp} / ep {plan.ep} = {converted.dp}"
    )


@app.command()
@run_setting_options(searched=False)
@run_options(ranged=False)
@opt.degree_options()
def evaluate(
    ctx: typer.Context,
    model: str | None = typer.Option(None, "--model", help=opt.MODEL_HELP + " (required without --plan)"),
    cluster: str | None = typer.Option(None, "--cluster", help=opt.CLUSTER_HELP + " (required without --plan)"),
    devices: int | None = opt.DEVICES,
    gpus_per_domain: int | None = opt.GPUS_PER_DOMAIN,
    global_batch_size: int | None = typer.Option(
        None, "--global-batch-size", parser=GLOBAL_BATCH, help="sequences per step (required without --plan)"
    ),
    seq_len: int | None = opt.SEQ_LEN,
    dtype: str | None = opt.DTYPE,
    optimizer: Optimizer = opt.OPTIMIZER,
    fp8: bool = opt.FP8,
    axis_order: str | None = opt.AXIS_ORDER,
    as_json: bool = opt.JSON,
    plot: Path | None = opt.PLOT,
    report: Path | None = opt.REPORT,
    profile: str | None = opt.PROFILE,
    job_path: Path | None = JOB,
    plan_file: Path | None = opt.SAVED_PLAN,
    changes: str | None = opt.CHANGES,
    run_settings: dict[str, object] | None = None,
    run: dict[str, object] | None = None,
    degrees: dict[str, object] | None = None,
) -> None:
    """Predict step time, its breakdown and memory per device of one plan, or of a saved plan with changes
    (--plan, --set). A plan that does not fit is still predicted (exit 0): a warning on stderr, the
    verdict in the first line, "fits" in JSON."""
    _check_outputs(plot=plot, report=report)
    if plan_file is not None or changes is not None:
        given = flags_given(ctx, (*EVALUATE_PLAN_OPTIONS, "job_path")) + [
            f"--{k.replace('_', '-')}" for k in run_settings
        ]
        saved, wanted = saved_plan(plan_file, changes, given)
        full, length = _run_inputs(saved.cluster, run)
        reevaluated = api.reevaluate(saved, wanted, cluster=full, profile=profile)
        _show_evaluation(reevaluated, as_json, plot, report, length, None)
        return
    options = dict(model=model, cluster=cluster, devices=devices, global_batch_size=global_batch_size)
    options |= dict(seq_len=seq_len, dtype=dtype, optimizer=optimizer)
    values, run_settings, job_file = with_job(ctx, job_path, options, run_settings)
    require({k: values[k] for k in ("model", "cluster", "global_batch_size")}, ctx, "--job or --plan")
    model, cluster, devices, global_batch_size = (
        values[k] for k in ("model", "cluster", "devices", "global_batch_size")
    )
    seq_len, dtype, optimizer = values["seq_len"], values["dtype"], values["optimizer"]
    spec = api.resolve_model(model)
    plan, note = _from_megatron_dp(_plan_of(degrees), devices)
    full, length = _run_inputs(api.resolve_cluster(cluster, gpus_per_domain=gpus_per_domain), run)
    job = api.job_for(
        spec, full, global_batch_size, seq_len, dtype=dtype, optimizer=optimizer, fp8=fp8, dims=plan, **run_settings
    )
    result = api.evaluate_full(
        spec, full, plan, job, devices=devices, axis_order=axis_order and parse_axis_order(axis_order), profile=profile
    )
    _show_evaluation(result, as_json, plot, report, length, note, job_file)


def _named(job_file: JobFile | None) -> dict[str, object]:
    """What --json adds for a job file: the job it answered, the file's path and contents."""
    return {} if job_file is None else {"job_file": job_file.named()}


def _plan_of(degrees: dict[str, object]) -> ParallelDims:
    """One plan from evaluate's degree options (``opt.degree_options``)."""
    d = dict(degrees)
    schedule = Schedule(d.pop("schedule"))
    virtual_stages = d.pop("virtual_stages") or schedule.chunks or 1  # zbv, dualpipev: their 2 chunks
    micro_batch_size, layers = d.pop("mbs"), parse_layers(d.pop("layers_per_stage"))
    return ParallelDims(
        **d,  # tp, pp, dp, cp, ep, etp, sp, zero, recompute
        micro_batch_size=micro_batch_size,
        schedule=named_schedule(schedule, virtual_stages),  # the registry's rule: 1f1b with v > 1 is interleaved
        virtual_stages=virtual_stages,
        layers_per_stage=layers,
    )


def _run_inputs(cluster: Cluster, run: dict[str, object]) -> tuple[Cluster, RunLength | None]:
    """The cluster with the facility options given, and the run's length (None: not asked)."""
    given = {key: run[key] for key in ("price_per_gpu_hour_usd", "price_per_kwh_usd", "spare_hosts")}
    return api.with_facility(cluster, **given), api.run_length(run["tokens"], run["steps"])


def _check_outputs(plot: Path | None = None, report: Path | None = None, out: Path | None = None) -> None:
    """Every output path a command was given, checked before any work."""
    for option, path, folder in (("--plot", plot, True), ("--report", report, False), ("--out", out, True)):
        if path is not None:
            check_output(option, path, folder=folder)


def _show_evaluation(
    result: api.Evaluation,
    as_json: bool,
    plot: Path | None,
    report: Path | None,
    length: RunLength | None,
    note: str | None,
    job_file: JobFile | None = None,
) -> None:
    """The plots and the report written first (undone together on a failure), then the lines printed."""
    from nestplan.report.html import plan_report
    from nestplan.report.run import render_run
    from nestplan.report.text import fit_verdict, render_plan

    typed = result.plan.with_run(length)
    late = LateOutputs()
    written = late.write(plot, lambda: plots(plot, result.plot)) if plot is not None else []
    if report is not None:
        late.write(report, lambda: write_report(report, lambda: plan_report(typed), quiet=True))
    if note:
        say(note)
    if not typed.predicted.fits:
        say(f"nestplan: warning: the plan {fit_verdict(typed.predicted)}")
    console = make_console()
    if as_json:
        print_json(typed.to_dict() | _named(job_file))
    else:
        render_plan(console, typed)
        render_run(console, typed.run)
        print_paths(console, "plots", written)
    if report is not None:
        say(f"nestplan: wrote the report {report}")


@app.command("plan")
@run_setting_options(searched=True)
@run_options(ranged=True)
def plan_command(
    ctx: typer.Context,
    model: str | None = typer.Option(None, "--model", help=opt.MODEL_HELP + " (required without --job)"),
    cluster: str | None = typer.Option(None, "--cluster", help=opt.CLUSTER_HELP + " (required without --job)"),
    devices: int | None = opt.DEVICES,
    gpus_per_domain: int | None = opt.GPUS_PER_DOMAIN,
    global_batch_size: int = opt.GLOBAL_BATCH,
    seq_len: int | None = opt.SEQ_LEN,
    dtype: str | None = opt.DTYPE,
    optimizer: Optimizer = opt.OPTIMIZER,
    fp8: bool = opt.FP8,
    top: int = opt.TOP,
    as_json: bool = opt.JSON,
    plot: Path | None = opt.PLOT,
    export: str | None = opt.EXPORT,
    out: Path = opt.EXPORT_OUT,
    schedules: str | None = opt.SCHEDULES,
    expert_tp: str | None = opt.ETP_LIST,
    memory_margin: float = opt.MEMORY_MARGIN,
    trace: bool = opt.TRACE,
    report_path: Path | None = opt.REPORT,
    profile: str | None = opt.PROFILE,
    job_path: Path | None = JOB,
    run_settings: dict[str, object] | None = None,
    run: dict[str, object] | None = None,
) -> None:
    """Find the fastest plan that fits (NEST's network- and memory-aware dynamic program)."""
    _check_outputs(plot=plot, report=report_path, out=out if export is not None else None)
    options = dict(model=model, cluster=cluster, devices=devices, global_batch_size=global_batch_size, seq_len=seq_len)
    options |= dict(dtype=dtype, optimizer=optimizer, top=top, memory_margin=memory_margin)
    options["schedules"] = schedule_list(schedules)
    values, run_settings, job_file = with_job(ctx, job_path, options, run_settings)
    require({k: values[k] for k in ("model", "cluster")}, ctx, "--job")
    model, cluster, devices, global_batch_size = (
        values[k] for k in ("model", "cluster", "devices", "global_batch_size")
    )
    seq_len, dtype, optimizer, top = values["seq_len"], values["dtype"], values["optimizer"], values["top"]
    if export is not None:
        from nestplan.export import check_framework

        check_framework(export)
    spec = _planned_model(model, seq_len, trace, export)
    sizes = _devices_range(run, devices)
    cl, length = _run_inputs(api.resolve_cluster(cluster, None if sizes else devices, gpus_per_domain), run)
    space = _plan_space(spec, values, export, expert_tp, run_settings)
    job = api.job_for(spec, cl, global_batch_size, seq_len, dtype=dtype, optimizer=optimizer, fp8=fp8, **run_settings)
    cl = api.calibrated_cluster(cl, job.settings.framework, profile)
    if sizes is not None:
        limits = api.Limits(max_days=run["max_days"], max_cost_usd=run["max_cost"])
        ranged = api.plan_range(spec, cl, job, space, sizes, length, str(run["objective"]), limits, top)
        _show_plan(ranged.report, as_json, plot, export, out, report_path, ranged, job_file=job_file)
        return
    with progress() as advance:
        report = api.plan(spec, cl, job, top=top, progress=advance, space=space, profile=profile)
    _show_plan(report, as_json, plot, export, out, report_path, length=length, job_file=job_file)


def _plan_space(
    spec: ModelSpec, values: dict[str, object], export: str | None, expert_tp: str | None, run_settings: dict
) -> SearchSpace:
    """What plan searches: the schedules, exchanges and expert tensor parallelism asked, narrowed to what the
    framework (or the export's) runs; ``run_settings`` gets the export's framework and the exchange tried first."""
    searched = {name: run_settings.pop(name, None) for name in ("cp_comm_type", "moe_comm_overlap")}
    if export is not None:
        run_settings["framework"] = api.export_framework(export, run_settings.get("framework"))
    space = api.search_space(
        schedules=values["schedules"],
        export=export,
        cp_comm_types=None if searched["cp_comm_type"] is None else (CpCommType(searched["cp_comm_type"]),),
        memory_margin=values["memory_margin"],
        expert_tp=expert_tp_list(expert_tp),
        moe_comm_overlap=searched["moe_comm_overlap"] is not False,
        model=spec,
        framework=Framework(run_settings.get("framework", Framework.MEGATRON)),  # megatron: every schedule
    )
    run_settings["cp_comm_type"] = space.cp_comm_types[0]  # the search tries the others (search/planner.py)
    return space


def _devices_range(run: dict[str, object], devices: int | None) -> tuple[int, int] | None:
    """The device counts to choose from (--devices-range, or --max-devices as 1..N); None: plan --devices."""
    given = parse_devices_range(run["devices_range"])
    if given is None and run["max_devices"] is not None:
        given = (1, int(run["max_devices"]))
    if given is not None and devices is not None:
        raise ConfigError(
            "give --devices or a range of them (--devices-range, --max-devices), not both", field="devices"
        )
    if given is not None and run["max_devices"] is not None:
        given = (given[0], min(given[1], int(run["max_devices"])))
    return given


def _planned_model(model: str, seq_len: int | None, trace: bool, export: str | None) -> ModelSpec:
    """The model to plan: refused before the search where the export framework cannot build it, its
    block FLOPs and activations calibrated on its traced graph with --trace."""
    rows = print_trace(model, seq_len, make_console(stderr=True)) if trace else None
    spec = api.resolve_model(model)
    if export is not None:
        api.check_exportable(spec, export)  # before the search: a model the framework cannot build
    if rows:
        spec = api.calibrate(spec, rows)
        say(
            f"planning with the traced block FLOPs x {spec.traced_flops_scale:.4f} and saved "
            f"activations x {spec.traced_activation_scale:.4f} of the formulas"
        )
    return spec


def _show_plan(
    report: api.PlanReport,
    as_json: bool,
    plot: Path | None,
    export: str | None,
    out: Path,
    page: Path | None,
    ranged: api.RangeReport | None = None,
    length: RunLength | None = None,
    job_file: JobFile | None = None,
) -> None:
    from nestplan.report.run import range_json, render_range, render_run

    best = report.plan.with_run(ranged.length if ranged else length)
    notes, written = _write_plan_outputs(best, report, plot, export, out, page, ranged)
    for note in notes:
        say(note)
    console = make_console()
    if as_json:
        reported = report.to_dict()
        runners = {key: reported[key] for key in ("runners_up", "search_stats")}
        ranges = {} if ranged is None else {"devices_range": range_json(ranged.choice)}
        print_json(best.to_dict() | runners | ranges | _named(job_file))
    else:
        _render_report(console, best, report)
        render_run(console, best.run)
        if ranged is not None:
            render_range(console, ranged.choice)
        print_paths(console, "wrote", written)
    if page is not None:
        say(f"nestplan: wrote the report {page}")


def _write_plan_outputs(
    best: Plan,
    report: api.PlanReport,
    plot: Path | None,
    export: str | None,
    out: Path,
    page: Path | None,
    ranged: api.RangeReport | None = None,
) -> tuple[list[str], list[Path]]:
    """The plan's plots, export and report, written before anything is printed and undone together on a
    failure (cli/output.LateOutputs): (the export's note lines, the files written)."""
    from nestplan.report.html import plan_report

    late = LateOutputs()
    written = late.write(plot, lambda: plots(plot, lambda folder: api.plot_plan(best, folder))) if plot else []
    notes: list[str] = []
    if export is not None:

        def write_export() -> list[Path]:
            with output("--out", out):
                paths, result = api.export_plan(best, export, out)
            notes.extend(f"{export}: note: {note}" for note in result.notes)
            return paths

        written = written + late.write(out, write_export)
    if page is not None:
        choice = None if ranged is None else ranged.choice
        late.write(page, lambda: write_report(page, lambda: plan_report(best, report.runners_up, choice), quiet=True))
    return notes, written


def _render_report(console: Console, best: Plan, report: api.PlanReport) -> None:
    from nestplan.report.answer import why_this_plan
    from nestplan.report.text import render_plan, render_runners_up, render_schedules

    render_plan(console, best)
    render_runners_up(console, report.best, report.runners_up, best.trust)
    console.print(f"why this plan: {escape(why_this_plan(best, report.runners_up))}")
    render_schedules(console, report.best, report.schedule_alternatives())
    s = report.stats
    console.print(
        f"search: {s.solve_time_s:.2f} s, {s.configurations:,} configurations, {s.enumerated:,} groups "
        f"({s.groups:,} solved; {s.skipped_bound:,} skipped by the bound, {s.skipped_memory:,} that fit "
        f"nowhere, {s.skipped_zero:,} by ZeRO escalation), {s.depths:,} pipeline depths, "
        f"{s.pruned_memory:,} pruned by memory, {s.pruned_bound:,} by the bound, {s.candidates:,} splits "
        "costed"
        + (
            f"; {s.unrefined:,} finalists ranked on the search's split, unrefined (bound: planner.REFINED_CELLS)"
            if s.unrefined
            else ""
        )
    )


@app.command("compare")
@run_options(ranged=False)
def compare_command(
    model: str | None = typer.Option(None, "--model", help="catalog name or path to a config.json"),
    cluster: str | None = typer.Option(None, "--cluster", help="catalog name or path to a cluster file"),
    devices: str = typer.Option("64,128,256", "--devices", help="device counts, e.g. 64,128,256"),
    mbs: str = typer.Option("1", "--mbs", help="microbatch sizes, e.g. 1,2,4,8"),
    baselines: str = typer.Option("manual,phaze,mcmc,alpa", "--baselines"),
    global_batch_size: int = typer.Option(api.DEFAULT_GLOBAL_BATCH, "--global-batch-size", parser=GLOBAL_BATCH),
    seq_len: int | None = typer.Option(None, "--seq-len", parser=SEQ_LEN),
    plot: Path | None = typer.Option(None, "--plot", help="PNG file (with --paper: a folder)"),
    csv_path: Path | None = typer.Option(None, "--csv", help="CSV file (with --paper: a folder)"),
    paper: bool = typer.Option(False, "--paper", help="the NEST paper's grid (Figure 5, Table 3 setting)"),
    report: Path | None = opt.REPORT,
    framework: Framework = typer.Option(Framework.MEGATRON, "--framework", help="the software every plan runs on"),
    profile: str | None = opt.PROFILE,
    run: dict[str, object] | None = None,
) -> None:
    """Compare nestplan with baseline planners over device counts (and microbatch sizes); with --tokens or
    --steps, each plan's whole run too."""
    from nestplan.report.compare import plot as draw
    from nestplan.report.compare import write_csv
    from nestplan.report.text import render_compare

    mbs_list = int_list(mbs, "--mbs", MAX_MICRO_BATCH, MAX_LIST_ENTRIES)
    if paper:
        cases = api.paper_cases()
    elif not model or not cluster:
        raise ConfigError("compare needs --model and --cluster (or --paper)", field="model")
    else:
        cases = [
            api.CompareCase(
                model, cluster, int_list(devices, "--devices", MAX_DEVICES, MAX_LIST_ENTRIES), mbs_list, seq_len
            )
        ]
    cases = [replace(case, framework=framework, profile=profile) for case in cases]
    length = api.run_length(run["tokens"], run["steps"])
    if length is not None:
        cases = [replace(case, cluster=_run_inputs(api.resolve_cluster(case.cluster), run)[0]) for case in cases]
    for option, path in (("--plot", plot), ("--csv", csv_path)):
        if path is not None:
            check_output(option, path, folder=paper)
    if report is not None:
        check_output("--report", report, folder=False)
    console = make_console()
    results = api.compare(cases, baselines.split(","), global_batch_size, length)
    for result in results:
        render_compare(console, result.title, result.rows, result.normalised)
        if csv_path is not None:
            target = csv_path / f"{result.tag}.csv" if paper else csv_path
            with output("--csv", target), replacing(target, "--csv") as partial:
                write_csv(partial, result.rows, result.normalised)
        if plot is not None:
            target = plot / f"{result.tag}.png" if paper else plot
            with drawing("--plot", target), replacing(target, "--plot") as partial:
                draw(partial, result.rows, result.normalised, result.title)
    if report is not None:
        from nestplan.report.html import compare_report

        write_report(report, lambda: compare_report(results))


@app.command("export")
def export_command(
    plan_file: Path = typer.Argument(..., help="a plan JSON file (nestplan plan --json > plan.json)"),
    framework: str = typer.Option(
        ..., "--framework", help="megatron, torchtitan, deepspeed or megatron-bridge (alias nemo)"
    ),
    out: Path = typer.Option(Path("nestplan-export"), "--out", help="folder for the files"),
    model: str | None = typer.Option(
        None, "--model", help="default: the model the plan holds (a plan of schema nestplan.plan/1: the model it names)"
    ),
    cluster: str | None = typer.Option(
        None,
        "--cluster",
        help="default: the cluster the plan holds (a plan of schema nestplan.plan/1: the cluster it names)",
    ),
) -> None:
    """Write a framework's launch settings for a saved plan (--model and --cluster replace its own)."""
    from nestplan.export import check_framework

    check_framework(framework)
    plan = api.load_plan(plan_file, model=model, cluster=cluster)
    check_output("--out", out, folder=True)
    with output("--out", out):
        paths, result = api.export_plan(plan, framework, out)
    for note in result.notes:
        say(f"{framework}: note: {note}")
    print_paths(make_console(), "wrote", paths)
