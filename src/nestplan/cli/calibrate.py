"""``nestplan calibrate``: fit a calibration profile on measured runs (nestplan.calibrate)."""

from __future__ import annotations

from pathlib import Path

import typer

from nestplan import api
from nestplan.cli.app import app
from nestplan.cli.output import check_output, make_console, output, print_json, progress, replacing, say
from nestplan.settings import Framework


@app.command()
def calibrate(
    runs: Path = typer.Argument(..., help='runs file: measured runs as JSON (docs/formats.md, "Runs file")'),
    out: Path = typer.Option(..., "--out", help="the profile file to write (TOML)"),
    framework: Framework | None = typer.Option(None, "--framework", help="fit the runs of this framework"),
    accelerator: str | None = typer.Option(None, "--accelerator", help="fit the runs on this accelerator"),
    factors: str | None = typer.Option(
        None, "--factors", help="comma-separated factors to fit (default: every one the runs inform)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the fit as JSON"),
) -> None:
    """Fit a profile's factors (GEMM, FP8 GEMM, attention, HBM and collective efficiency) for one accelerator
    and framework on measured runs, bounded and pulled toward the published figures; print each factor
    before and after and the leave-one-model-out error; write the profile for --profile."""
    from nestplan.report.calibration import calibration_dict, render_calibration

    check_output("--out", out, folder=False)
    names = None if factors is None else [n.strip() for n in factors.split(",") if n.strip()]
    with progress() as advance:
        result = api.calibrate_runs(runs, accelerator=accelerator, framework=framework, factors=names, progress=advance)
    with output("--out", out), replacing(out, "--out") as partial:
        partial.write_text(result.profile.to_toml())
    if as_json:
        print_json(calibration_dict(result))
    else:
        render_calibration(make_console(), result)
    say(f"nestplan: wrote {out}")
