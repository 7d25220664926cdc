"""The ``nestplan`` command line: a thin typer shell over :mod:`nestplan.api`.

Errors a user can fix print one line on stderr and exit 2 (3: the job does not fit).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from nestplan import api
from nestplan.errors import ConfigError, PlannerError
from nestplan.job import Optimizer
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, Schedule
from nestplan.strategy.placement import DEFAULT_AXIS_ORDER

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Network- and memory-aware planner for distributed LLM training.")


def _layers(text: Optional[str]) -> Optional[tuple[int, ...]]:
    if not text:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--layers-per-stage '{text}' must be comma-separated integers, e.g. 10,11,11,10",
                          field="layers_per_stage", value=text) from None


def _axis_order(text: str) -> tuple[str, ...]:
    return tuple(a.strip() for a in text.replace("-", ",").split(","))


@app.command()
def evaluate(
    model: str = typer.Option(..., "--model", help="catalog name or path to a Hugging Face config.json"),
    cluster: str = typer.Option(..., "--cluster", help="catalog name or path to a cluster TOML/JSON file"),
    devices: Optional[int] = typer.Option(None, "--devices", help="use the first N devices of the cluster"),
    tp: int = typer.Option(1, "--tp"), pp: int = typer.Option(1, "--pp"), dp: int = typer.Option(1, "--dp"),
    cp: int = typer.Option(1, "--cp"), ep: int = typer.Option(1, "--ep"),
    sp: bool = typer.Option(False, "--sp", help="sequence parallelism (needs tp > 1)"),
    zero: int = typer.Option(0, "--zero", min=0, max=3, help="ZeRO stage 0-3"),
    recompute: Recompute = typer.Option(Recompute.NONE, "--recompute"),
    mbs: int = typer.Option(1, "--mbs", help="microbatch size"),
    schedule: Schedule = typer.Option(Schedule.ONE_F_ONE_B, "--schedule"),
    virtual_stages: int = typer.Option(1, "--virtual-stages"),
    layers_per_stage: Optional[str] = typer.Option(None, "--layers-per-stage", help="e.g. 10,11,11,10"),
    global_batch_size: int = typer.Option(..., "--global-batch-size", help="sequences per step"),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="default: the model's context, at most 8192"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="default: bf16, or fp16 where the accelerator lacks it"),
    optimizer: Optimizer = typer.Option(Optimizer.ADAM, "--optimizer"),
    flash: bool = typer.Option(True, "--flash/--no-flash", help="fused (flash) attention"),
    axis_order: str = typer.Option(",".join(DEFAULT_AXIS_ORDER), "--axis-order", help="rank grid, fastest first"),
    as_json: bool = typer.Option(False, "--json", help="print only the plan JSON"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="write timeline.png, memory.png, placement.png here"),
) -> None:
    """Predict step time, its breakdown and memory per device of one plan."""
    spec = api.resolve_model(model)
    if schedule is Schedule.ONE_F_ONE_B and virtual_stages > 1:
        schedule = Schedule.INTERLEAVED
    plan = ParallelDims(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, sp=sp, zero=zero, recompute=recompute,
                        micro_batch_size=mbs, schedule=schedule, virtual_stages=virtual_stages,
                        layers_per_stage=_layers(layers_per_stage))
    full = api.resolve_cluster(cluster)
    job = api.make_job(spec, global_batch_size, seq_len, dtype=dtype or api.default_dtype(full), optimizer=optimizer,
                       flash_attention=flash)
    result = api.evaluate_full(spec, full, plan, job, devices=devices, axis_order=_axis_order(axis_order))
    data = result.to_dict()
    written = result.plot(plot) if plot is not None else []
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return
    from nestplan.report.text import render_plan
    render_plan(Console(), data, result.prediction)
    if written:
        Console().print("plots: " + ", ".join(str(p) for p in written))


@app.command("plan")
def plan_command(
    model: str = typer.Option(..., "--model", help="catalog name or path to a Hugging Face config.json"),
    cluster: str = typer.Option(..., "--cluster", help="catalog name or path to a cluster TOML/JSON file"),
    devices: Optional[int] = typer.Option(None, "--devices", help="use the first N devices of the cluster"),
    global_batch_size: int = typer.Option(api.DEFAULT_GLOBAL_BATCH, "--global-batch-size",
                                          help="sequences per step"),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="default: the model's context, at most 8192"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="default: bf16, or fp16 where the accelerator lacks it"),
    optimizer: Optimizer = typer.Option(Optimizer.ADAM, "--optimizer"),
    flash: bool = typer.Option(True, "--flash/--no-flash", help="fused (flash) attention"),
    top: int = typer.Option(5, "--top", min=0, help="runner-up plans to show"),
    as_json: bool = typer.Option(False, "--json", help="print only the plan JSON"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="write timeline.png, memory.png, placement.png here"),
    export: Optional[str] = typer.Option(None, "--export", help="megatron, torchtitan, deepspeed or nemo"),
    out: Path = typer.Option(Path("nestplan-export"), "--out", help="folder for --export's files"),
    trace: bool = typer.Option(False, "--trace", help="calibrate the model's block FLOPs and activations on its "
                                                       "traced PyTorch graph first (extra [trace])"),
) -> None:
    """Find the fastest plan that fits (NEST's network- and memory-aware dynamic program)."""
    rows = _print_trace(model, seq_len, Console(stderr=True)) if trace else None
    if export is not None:
        from nestplan.export import check_framework
        check_framework(export)
    spec = api.resolve_model(model)
    if rows:
        spec = api.calibrate(spec, rows)
        Console(stderr=True).print(f"planning with the traced block FLOPs x {spec.traced_flops_scale:.4f} and saved "
                                   f"activations x {spec.traced_activation_scale:.4f} of the formulas")
    for name, value in (("--devices", devices), ("--global-batch-size", global_batch_size), ("--seq-len", seq_len)):
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value}", field=name, value=value, limit=">= 1")
    cl = api.resolve_cluster(cluster, devices)
    job = api.make_job(spec, global_batch_size, seq_len, dtype=dtype or api.default_dtype(cl), optimizer=optimizer,
                       flash_attention=flash)
    with _progress() as advance:
        report = api.plan(spec, cl, job, top=top, progress=advance)
    data = report.to_dict()
    written = report.plot(plot) if plot is not None else []
    if export is not None:
        paths, result = api.export_plan(data, export, out, model=spec, cluster=cl)
        written += paths
        for note in result.notes:
            Console(stderr=True).print(f"{export}: note: {note}", markup=False)
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return
    from nestplan.report.text import render_plan, render_runners_up
    console = Console()
    render_plan(console, data, report.best)
    render_runners_up(console, report.best, report.runners_up)
    s = report.stats
    console.print(f"search: {s.solve_time_s:.2f} s, {s.groups} groups, {s.depths} pipeline depths, "
                  f"{s.pruned_memory} pruned by memory, {s.pruned_bound} by the bound, {s.candidates} splits costed")
    if written:
        console.print("wrote: " + ", ".join(str(p) for p in written))


class _progress:
    """A transient rich progress bar on stderr (only on a terminal): yields an advance callback."""

    def __init__(self, unit: str = "groups", every: int = 64) -> None:
        self._unit, self._every = unit, every

    def __enter__(self):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("planning"), BarColumn(), TextColumn("{task.completed} " + self._unit),
                             TimeElapsedColumn(), console=Console(stderr=True), transient=True,
                             disable=not sys.stderr.isatty())
        self._bar.__enter__()
        task = self._bar.add_task("plan", total=None)
        return lambda i: self._bar.update(task, completed=i + 1) if i % self._every == 0 else None

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)


PAPER_MODELS = {"bert-large": 512, "llama2-7b": 4096, "llama3-70b": 4096, "gpt3-175b": 2048, "mixtral-8x7b": 4096}
PAPER_GRID = (("tpuv4-fattree", (64, 128, 256, 512, 1024)), ("h100-spine-leaf", (128, 256, 512, 1024)))
PAPER_MBS_SWEEP = (("bert-large", "llama2-7b", "llama3-70b"), "tpuv4-fattree", (256,), (1, 2, 4, 8))   # Figure 6
PAPER_ZERO_ABLATION = (("llama3-70b", 24 * 2**30), ("bert-large", 120 * 2**20))   # Table 7: device memory, bytes


def _int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{name} '{text}' must be comma-separated integers", field=name, value=text) from None
    if not values or min(values) < 1:
        raise ConfigError(f"{name} '{text}' needs positive integers", field=name, value=text, limit=">= 1")
    return values


@app.command("compare")
def compare_command(
    model: Optional[str] = typer.Option(None, "--model", help="catalog name or path to a config.json"),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="catalog name or path to a cluster file"),
    devices: str = typer.Option("64,128,256", "--devices", help="device counts, e.g. 64,128,256"),
    mbs: str = typer.Option("1", "--mbs", help="microbatch sizes, e.g. 1,2,4,8"),
    baselines: str = typer.Option("manual,phaze,mcmc,alpa", "--baselines"),
    global_batch_size: int = typer.Option(api.DEFAULT_GLOBAL_BATCH, "--global-batch-size"),
    seq_len: Optional[int] = typer.Option(None, "--seq-len"),
    plot: Optional[str] = typer.Option(None, "--plot", help="PNG file (with --paper: a folder)"),
    csv_path: Optional[str] = typer.Option(None, "--csv", help="CSV file (with --paper: a folder)"),
    paper: bool = typer.Option(False, "--paper", help="the NEST paper's grid (Figure 5, Table 3 setting)"),
) -> None:
    """Compare nestplan with baseline planners over device counts (and microbatch sizes)."""
    from nestplan.report.compare import plot as draw, write_csv
    from nestplan.search.compare import check_baselines, normalise

    names = check_baselines(baselines.split(","))
    if paper:
        cases = [(m, c, ns) for c, ns in PAPER_GRID for m in PAPER_MODELS]
    else:
        if not model or not cluster:
            raise ConfigError("compare needs --model and --cluster (or --paper)", field="model")
        cases = [(model, cluster, _int_list(devices, "--devices"))]
    console = Console()
    mbs_list = _int_list(mbs, "--mbs")
    jobs = [(m, c, ns, mbs_list, names, global_batch_size, PAPER_MODELS.get(m) if paper else seq_len, None)
            for m, c, ns in cases]
    if paper:
        models, cl, ns, sweep = PAPER_MBS_SWEEP
        jobs += [(m, cl, ns, sweep, names, global_batch_size, PAPER_MODELS[m], None) for m in models]
        jobs += [(m, "tpuv4-fattree", (1024,), (1,), names, global_batch_size, PAPER_MODELS[m], hbm)
                 for m, hbm in PAPER_ZERO_ABLATION]
    if len(jobs) > 1:   # independent cases: one process per core
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
            results = list(pool.map(_compare_rows, jobs))
    else:
        results = [_compare_rows(jobs[0])]
    for (m, c, ns, mb, *_), (title, rows) in zip(jobs, results):
        norm = normalise(rows)
        _render_compare(console, title, rows, norm)
        tag = title.replace(" on ", "_").replace(" ", "_").replace(",", "")
        if csv_path:
            write_csv(Path(csv_path) / f"{tag}.csv" if paper else Path(csv_path), rows, norm)
        if plot:
            draw(Path(plot) / f"{tag}.png" if paper else Path(plot), rows, norm, title)


def _compare_rows(args: tuple) -> tuple[str, list]:
    """One model x cluster of a comparison (a top-level function, so it runs in a worker process)."""
    from nestplan.search.compare import run_compare

    m, c, ns, mbs_list, names, gbs, seq, hbm = args
    spec = api.resolve_model(m)
    job = api.make_job(spec, gbs, seq, dtype=api.default_dtype(api.resolve_cluster(c)))

    def load(n: int):
        cluster = api.resolve_cluster(c, n)
        if hbm is None:
            return cluster
        # the paper's hypothetical small devices: no framework reserve (2 GiB would exceed 120 MiB)
        return replace(cluster, accelerator=replace(cluster.accelerator, hbm_bytes=float(hbm), reserved_bytes=0.0))

    rows = run_compare(spec, load, job, ns, mbs_list, names)
    title = f"{spec.name} on {c}"
    if hbm is not None:
        title += f" with {hbm / 2**30:g} GiB devices" if hbm >= 2**30 else f" with {hbm / 2**20:g} MiB devices"
    elif len(mbs_list) > 1:
        title += f" mbs {','.join(map(str, mbs_list))}"
    return title, rows


def _render_compare(console: Console, title: str, rows, norm) -> None:
    from rich.table import Table

    table = Table(title=title)
    for col in ("devices", "mbs", "planner", "tokens/s", "normalised", "solve s", "plan"):
        table.add_column(col, justify="left" if col in ("planner", "plan") else "right")
    for r, x in zip(rows, norm):
        table.add_row(str(r.devices), str(r.micro_batch_size), r.planner,
                      f"{r.tokens_per_s:,.0f}" if r.feasible else "-", f"{x:.2f}" if r.feasible else "-",
                      f"{r.solve_time_s:.2f}", r.plan)
    console.print(table)


@app.command("export")
def export_command(
    plan_file: Path = typer.Argument(..., help="a plan JSON file (nestplan plan --json > plan.json)"),
    framework: str = typer.Option(..., "--framework", help="megatron, torchtitan, deepspeed or nemo"),
    out: Path = typer.Option(Path("nestplan-export"), "--out", help="folder for the files"),
    model: Optional[str] = typer.Option(None, "--model", help="default: the model the plan names"),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="default: the cluster the plan names"),
) -> None:
    """Write a framework's launch settings for a saved plan."""
    try:
        data = json.loads(plan_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"plan file '{plan_file}' is not readable JSON: {exc}", field="plan",
                          value=str(plan_file)) from None
    paths, result = api.export_plan(data, framework, out, model=model, cluster=cluster)
    for note in result.notes:
        Console(stderr=True).print(f"{framework}: note: {note}", markup=False)
    Console().print("wrote: " + ", ".join(str(p) for p in paths))


@app.command("trace")
def trace_command(
    model: str = typer.Option(..., "--model", help="catalog name or path to a Hugging Face config.json"),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="default: the model's context, at most 2048"),
) -> None:
    """Measure per-block FLOPs and saved activations from the PyTorch model (extra [trace])."""
    _print_trace(model, seq_len, Console())


def _print_trace(model: str, seq_len: Optional[int], console: Console) -> list:
    from rich.table import Table

    result, rows = api.trace(model, seq_len)
    table = Table(title=f"{result.model_type}: {result.tokens} tokens, traced in {result.seconds:.1f} s")
    for col in ("block", "traced GFLOP", "closed form GFLOP", "traced MiB saved", "closed form MiB saved"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r['block']}{' (MoE)' if r['moe'] else ''}", f"{r['traced_flops'] / 1e9:,.1f}",
                      f"{r['closed_flops'] / 1e9:,.1f}", f"{r['traced_saved_bytes'] / 2**20:,.1f}",
                      f"{r['closed_saved_bytes'] / 2**20:,.1f}")
    console.print(table)
    return rows


@app.command("sweep")
def sweep_command(
    target: str = typer.Argument(..., help="SPEC.toml to run, or the word 'report'"),
    folder: Optional[Path] = typer.Argument(None, help="with 'report': the sweep's output folder"),
    out: Path = typer.Option(Path("sweep-out"), "--out", help="folder of results.sqlite (and the report)"),
    workers: int = typer.Option(2, "--workers", min=1, help="local worker processes"),
    ray: Optional[str] = typer.Option(None, "--ray", help="run on Ray: local, auto or ray://host:port"),
) -> None:
    """Run a sweep spec (resuming where a previous run stopped), or `sweep report DIR`."""
    console = Console()
    if target == "report":
        from rich.table import Table

        from nestplan.sweep.report import plan_text, variant
        rows, written = api.sweep_report(folder or out)
        table = Table(title=f"sweep {folder or out}: {len(rows)} cases")
        for col in ("model", "cluster variant", "devices", "status", "tok/s/device", "MFU", "plan"):
            table.add_column(col, justify="right" if col in ("devices", "tok/s/device", "MFU") else "left")
        for r in rows:
            ok = r["status"] == "ok"
            table.add_row(r["model"], variant(r), str(r["devices"]), r["status"],
                          f"{r['tokens_per_s_per_device']:,.0f}" if ok else "-", f"{r['mfu']:.1%}" if ok else "-",
                          plan_text(r["plan"]))
        console.print(table)
        console.print("wrote " + ", ".join(str(p) for p in written))
        return
    if folder is not None:
        raise ConfigError(f"unexpected argument '{folder}': use --out DIR for a sweep's output folder",
                          field="folder", value=str(folder))
    with _progress("cases", every=1) as advance:
        summary = api.sweep(target, out, workers=workers, ray=ray, progress=lambda done, total: advance(done - 1))
    console.print(f"sweep: {summary.total} cases, {summary.skipped} already done, {summary.finished} solved now "
                  f"({summary.failed} failed) in {summary.elapsed_s:.1f} s -> {summary.store}")


@app.command("nest-solve")
def nest_solve_command(
    input_path: str = typer.Argument(..., metavar="INPUT.json", help="the NEST authors' solver input (dp_input.json)"),
    output_path: Optional[str] = typer.Argument(None, metavar="[OUTPUT.json]", help="where to write their output schema"),
    explain: bool = typer.Option(False, "--explain", help="take the time per batch apart; nestplan's own view"),
    model: Optional[str] = typer.Option(None, "--model", help="with --explain: catalog model of the input"),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="with --explain: catalog cluster of the input"),
) -> None:
    """Drop-in for the NEST authors' solver: their input, their cost semantics, their output."""
    with _progress("groups") as step:
        inp, out, result = api.nest_solve(input_path, progress=step)
    text = json.dumps(out, indent=2)
    if output_path:
        Path(output_path).write_text(text + "\n")
    else:
        print(text)
    if explain:
        console = Console(stderr=output_path is None, highlight=False, soft_wrap=True)
        for line in api.nest_explain(inp, result, model=model, cluster=cluster):
            console.print(line, markup=False)


@app.command("list")
def list_items(kind: str = typer.Argument(..., help="models, accelerators or clusters")) -> None:
    """List the catalog's models, accelerators or clusters."""
    names = api.catalog_names(kind)
    sys.stdout.write("\n".join(names) + "\n")


def _click_exceptions() -> list:
    """The click exception modules in use: typer >= 0.20 vendors click as ``typer._click``."""
    modules = []
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            continue
    assert modules, "typer needs click, vendored or installed"
    return modules


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: run the app, turning every user error into one line on stderr."""
    command = typer.main.get_command(app)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    mods = _click_exceptions()
    usage_errors = tuple(m.ClickException for m in mods)
    exits = tuple({getattr(m, "Exit") for m in mods if hasattr(m, "Exit")} | {typer.Exit})
    aborts = tuple({getattr(m, "Abort") for m in mods if hasattr(m, "Abort")} | {typer.Abort})
    try:
        command.main(args=argv, prog_name="nestplan", standalone_mode=False)
    except PlannerError as exc:
        err.print(f"nestplan: error: {exc}", markup=False)
        sys.exit(exc.exit_code)
    except usage_errors as exc:
        message = exc.format_message().strip().replace("\n", " ")
        if message:   # NoArgsIsHelpError has printed the help already
            err.print(f"nestplan: error: {message}", markup=False)
        sys.exit(2)
    except exits as exc:
        sys.exit(exc.exit_code)
    except aborts:
        sys.exit(130)


if __name__ == "__main__":
    main()
