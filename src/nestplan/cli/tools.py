"""The other commands: trace, sweep, nest-solve, validate and list."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from nestplan import api
from nestplan.cli.app import app
from nestplan.cli.output import print_trace, check_output, make_console, output, print_json, progress, replacing
from nestplan.cli.parse import SEQ_LEN, fraction, integer
from nestplan.errors import ConfigError, printable


@app.command("trace")
def trace_command(
    model: str = typer.Option(..., "--model", help="catalog name or path to a Hugging Face config.json"),
    seq_len: int | None = typer.Option(
        None, "--seq-len", parser=SEQ_LEN, help="default: the model's context, at most 2048"
    ),
) -> None:
    """Measure per-block FLOPs and saved activations from the PyTorch model (extra [trace])."""
    print_trace(model, seq_len, make_console())


@app.command("sweep")
def sweep_command(
    target: str = typer.Argument(..., help="SPEC.toml to run, or the word 'report'"),
    folder: Path | None = typer.Argument(None, help="with 'report': the sweep's output folder"),
    out: Path = typer.Option(Path("sweep-out"), "--out", help="folder of results.sqlite (and the report)"),
    workers: int = typer.Option(
        2, "--workers", parser=integer("--workers", 1, api.MAX_WORKERS), help="local worker processes"
    ),
    ray: str | None = typer.Option(None, "--ray", help="run on Ray: local, auto or ray://host:port"),
) -> None:
    """Run a sweep spec (resuming where a previous run stopped), or `sweep report DIR`."""
    console = make_console()
    if target == "report":
        from nestplan.sweep.report import report_table

        rows, written = api.sweep_report(folder or out)
        console.print(report_table(rows, f"sweep {folder or out}: {len(rows)} cases"))
        console.print("wrote " + ", ".join(printable(str(p)) for p in written), markup=False)
        return
    if folder is not None:
        raise ConfigError(
            f"unexpected argument '{printable(str(folder))}': use --out DIR for a sweep's output folder",
            field="folder",
            value=printable(str(folder)),
        )
    check_output("--out", out, folder=True)
    with progress("cases", every=1, verb="sweep") as advance:
        summary = api.sweep(
            target, out, workers=workers, ray=ray, progress=lambda done, total: advance(done - 1, total)
        )
    console.print(
        f"sweep: {summary.total} cases, {summary.skipped} already done, {summary.finished} solved now "
        f"({summary.failed} failed) in {summary.elapsed_s:.1f} s -> {printable(str(summary.store))}",
        markup=False,
    )


@app.command("nest-solve")
def nest_solve_command(
    input_path: str = typer.Argument(..., metavar="INPUT.json", help="the NEST authors' solver input (dp_input.json)"),
    output_path: Path | None = typer.Argument(None, metavar="[OUTPUT.json]", help="where to write their output schema"),
    explain: bool = typer.Option(False, "--explain", help="take the time per batch apart; nestplan's own view"),
    model: str | None = typer.Option(None, "--model", help="with --explain: catalog model of the input"),
    cluster: str | None = typer.Option(None, "--cluster", help="with --explain: catalog cluster of the input"),
) -> None:
    """Drop-in for the NEST authors' solver: their input, their cost semantics, their output."""
    if output_path is not None:
        check_output("OUTPUT.json", output_path, folder=False)
    with progress("groups") as step:
        inp, out, result = api.nest_solve(input_path, progress=step)
    text = json.dumps(out, indent=2, allow_nan=False) + "\n"
    if output_path is not None:
        with output("OUTPUT.json", output_path), replacing(output_path, "OUTPUT.json") as partial:
            partial.write_text(text)
    else:
        sys.stdout.write(text)
    if explain:
        lines = api.nest_explain(inp, result, model=model, cluster=cluster)
        stream = sys.stderr if output_path is None else sys.stdout
        stream.write("".join(printable(line) + "\n" for line in lines))


def _tolerance(value: object) -> float:
    """--tolerance: a percentage, its range checked before any row is evaluated."""
    from nestplan.validate import check_tolerance

    return check_tolerance(fraction("--tolerance")(value))


@app.command()
def validate(
    runs: Path = typer.Argument(..., help='runs file: measured runs as JSON (docs/formats.md, "Runs file")'),
    as_json: bool = typer.Option(False, "--json", help="print the rows and summaries as JSON"),
    tolerance: float | None = typer.Option(
        None,
        "--tolerance",
        parser=_tolerance,
        metavar="PCT",
        help="a percentage (10 = 10%): exit 1 when any row's step time or memory error is beyond it, a row "
        "that ran is predicted not to fit, or a row is not evaluated",
    ),
    profile: str | None = typer.Option(
        None, "--profile", help="a calibration profile for the rows of its accelerator and framework (default none)"
    ),
    cross_validate: bool = typer.Option(
        True,
        "--cross-validate/--no-cross-validate",
        help="also fit a profile per accelerator and framework (nestplan calibrate) and print its "
        "leave-one-model-out error",
    ),
) -> None:
    """Predict every measured run of a runs file as it ran and print the error of each, with the
    median and largest per precision, model and tp degree. A row that cannot be evaluated is
    reported in one line; the others still are. Files a row names are read relative to the runs file."""
    from nestplan.report.calibration import cross_validation_dict, render_cross_validation
    from nestplan.report.validation import render_validation, validation_dict

    results = api.validate(runs, profile=profile or "none")
    missed = [] if tolerance is None else api.validation_misses(results, tolerance)
    published = results if (profile or "none").strip().lower() == "none" else api.validate(runs, profile="none")
    fits = api.cross_validate(published) if cross_validate else []  # fitted from the published figures
    if as_json:
        print_json(validation_dict(results, tolerance, missed) | {"cross_validation": cross_validation_dict(fits)})
    else:
        render_validation(make_console(), results, tolerance, missed)
        render_cross_validation(make_console(), fits)
    if missed:  # exit 1: the check failed (click, run with standalone_mode=False, would return typer.Exit's code)
        sys.exit(1)


@app.command("list")
def list_items(
    kind: str = typer.Argument(..., help="models, accelerators or clusters"),
    as_json: bool = typer.Option(False, "--json", help="print the entries as JSON"),
    names: bool = typer.Option(False, "--names", help="print the names only, one a line"),
) -> None:
    """List the catalog's models, accelerators or clusters with their sizes and sources."""
    if names:
        sys.stdout.write("\n".join(api.catalog_names(kind)) + "\n")
        return
    entries = api.catalog_entries(kind)
    if as_json:
        print_json(entries)
        return
    from nestplan.report.text import render_catalog

    render_catalog(make_console(), kind.strip().lower(), entries)
