"""The tools beside planning: sweeps and their report, plan files, validation against measured runs,
exports, tracing and calibration, the NEST authors' solver."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nestplan.api.resolve import resolve_model
from nestplan.profile import NO_PROFILE, ProfileChoice
from nestplan.settings import Framework
from nestplan.cluster import Cluster
from nestplan.errors import ConfigError
from nestplan.job import check_context, default_seq_len
from nestplan.model import ModelSpec
from nestplan.plan import Plan
from nestplan.strategy.enums import Recompute

if TYPE_CHECKING:  # imported where used: the CLI starts without the search, the exports and the sweep
    from nestplan.compat.schema import NestInput
    from nestplan.compat.solve import NestResult
    from nestplan.export.common import Export
    from nestplan.model.trace import TraceResult
    from nestplan.sweep.run import SweepSummary
    from nestplan.calibrate import CalibrationResult
    from nestplan.validate import Miss, RowResult


MAX_WORKERS = 1024  # local worker processes of a sweep


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


def validate(runs: str | Path, profile: ProfileChoice = NO_PROFILE) -> list[RowResult]:
    """Every measured run of a runs file predicted as it ran (``nestplan.validate``), from the published
    figures unless ``profile`` calibrates the rows of its accelerator and framework; the files its rows
    name are read relative to the runs file."""
    from nestplan.validate import validate as validate_runs

    return validate_runs(runs, profile=profile)


def cross_validate(results: Sequence[RowResult]) -> list[tuple[str, str, CalibrationResult | str]]:
    """Per (accelerator, framework) of validate's evaluated rows: the profile ``nestplan calibrate`` fits on
    them with its leave-one-model-out error, or why none could be fitted (too few rows or models)."""
    from nestplan.calibrate import calibrate, evaluable

    runs = evaluable(results)
    pairs = sorted({(r.cluster.accelerator.name, r.job.settings.framework) for r in runs}, key=str)
    out: list[tuple[str, str, CalibrationResult | str]] = []
    for acc, fw in pairs:
        try:
            out.append((acc, fw.value, calibrate(runs, accelerator=acc, framework=fw)))
        except ConfigError as err:
            out.append((acc, fw.value, str(err)))
    return out


def calibrate_runs(
    runs: str | Path,
    *,
    accelerator: str | None = None,
    framework: Framework | None = None,
    factors: Sequence[str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> CalibrationResult:
    """A calibration profile fitted on a runs file's measured runs (``nestplan.calibrate``): the runs read and
    evaluated as ``validate`` does, those of one accelerator and framework fitted."""
    from nestplan.calibrate import calibrate, evaluable
    from nestplan.validate import validate as validate_runs

    tick = None if progress is None else (lambda: progress(1))
    runs_read = evaluable(validate_runs(runs, profile=NO_PROFILE))
    result = calibrate(runs_read, accelerator=accelerator, framework=framework, factors=factors, progress=tick)
    p = result.profile
    source = f"nestplan calibrate {Path(runs).name}: its {p.rows} runs of {p.framework.value} on {p.accelerator}"
    return replace(result, profile=replace(p, source=source))


def validation_misses(results: list[RowResult], tolerance_pct: float) -> list[Miss]:
    """The rows of :func:`validate`'s ``results`` that miss a tolerance of ``tolerance_pct`` percent: a step
    time or memory error beyond it, a run predicted not to fit, or a row not evaluated."""
    from nestplan.validate import misses

    return misses(results, tolerance_pct)


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
