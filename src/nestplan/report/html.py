"""A self-contained HTML report (``--report`` on ``plan``, ``evaluate`` and ``compare``).

One file that a browser opens with nothing else: the CSS is inline, the figures are PNGs inlined
as ``data:`` URIs, there is no script and nothing is fetched from the network. A plan's page opens
with the answer (report/answer.py), then holds the plan (degrees, placement, schedule, job settings),
its prediction and breakdown, the memory of every stage, the timeline, memory and placement figures,
the runner-ups and why each lost, every framework's export with its notes, what nestplan was checked
against on the plan's accelerator, and the plan JSON itself; a comparison's page holds each case's table and figure.

Every string that comes from the input (model and cluster names, level names, export files,
notes) is written through :func:`html.escape`: nothing from the input reaches the page as markup.
"""

from __future__ import annotations

import base64
import html
import json
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from nestplan.cost.evaluator import evaluate_plan
from nestplan.cost.prediction import Prediction
from nestplan.cost.run import RunEstimate
from nestplan.errors import PlannerError, printable
from nestplan.export import FRAMEWORKS, build
from nestplan.hardware.accelerator import Accelerator
from nestplan.plan import Plan, StageSummary
from nestplan.report.answer import answer_lines
from nestplan.report.text import compare_run_cells, fit_verdict, why_lost
from nestplan.report.run import money
from nestplan.search.compare import CompareRow
from nestplan.search.sizes import SizeChoice
from nestplan.strategy.describe import describe
from nestplan.strategy.dims import AXES
from nestplan.units import GiB
from nestplan.version import __version__

# What each catalog accelerator's predictions were checked against (tests/validation; the figures
# are in docs/validation.md, "The published sets"). An accelerator not listed has no published runs there.
MEASURED_SETS: Mapping[str, str] = {
    "a100-80gb": "Korthikanti et al. 2022 (Reducing Activation Recomputation in Large Transformer Models) on "
    "DGX A100: iteration times of Table 5, memory per GPU of Figures 1 and 7",
    "h100-sxm-80gb": "NVIDIA DGX Cloud benchmarking recipes v24.11.1 (NeMo on DGX H100): step times of Llama 3.1 "
    "8B, 70B and 405B, Nemotron-4 15B and 340B, GPT-3 175B and Grok-1 314B in BF16 and FP8, "
    "whose Llama 3.1 8B rows also calibrate the GEMM ceilings",
}

STYLE = """
body { font-family: sans-serif; margin: 1.5em auto; max-width: 80em; padding: 0 1em; color: #1a1a1a;
       background: #ffffff; line-height: 1.4; }
h1 { font-size: 1.5em; border-bottom: 2px solid #2b5d8a; padding-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 1.6em; color: #2b5d8a; }
h3 { font-size: 1em; }
nav a { margin-right: 1em; }
table { border-collapse: collapse; margin: 0.5em 0 1em 0; }
th, td { border: 1px solid #c8c8c8; padding: 0.2em 0.6em; text-align: right; }
td { white-space: nowrap; }
th { background: #eef3f8; }
td.text, th.text { text-align: left; }
pre { background: #f6f6f6; border: 1px solid #dddddd; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
img { max-width: 100%; border: 1px solid #dddddd; margin: 0.4em 0; }
.verdict-bad { color: #b00020; font-weight: bold; }
.note { color: #555555; }
table.answer { border: 2px solid #2b5d8a; }
table.answer th { text-align: left; vertical-align: top; }
table.answer td { text-align: left; white-space: normal; }
"""


# -- pages ----------------------------------------------------------------------------------------
def plan_report(plan: Plan, runners_up: Sequence[Prediction] | None = None, sizes: SizeChoice | None = None) -> str:
    """The report of ``plan`` (from ``plan`` or ``evaluate``) and, for a search, its runner-ups
    (best first; given, even empty, for a searched plan), its whole run where it has one and the device
    range it was chosen from: one HTML page that needs nothing else, opening with the answer
    (report/answer.py)."""
    pred = plan.prediction or evaluate_plan(plan.model, plan.cluster, plan.dims, plan.job, plan.axis_order)
    title = f"{plan.model.name} on {plan.cluster.name}"
    sections = [
        ("plan", "Plan", _plan_section(plan)),
        ("prediction", "Prediction", _prediction_section(plan)),
        ("memory", "Memory per stage", _memory_section(plan)),
        ("pictures", "Pictures", _pictures(lambda folder: _plan_figures(pred, plan, folder))),
    ]
    if plan.run is not None:
        sections.append(("run", "The whole run", run_section(plan.run)))
    if sizes is not None:
        sections.append(("devices", "How many devices", range_section(sizes, title)))
    if runners_up:
        sections.append(("runners-up", "Runner-ups", _runners_up_section(pred, runners_up)))
    sections += [
        ("exports", "Exports", _exports_section(plan)),
        ("validation", "Validation", _validation_section(plan.cluster.accelerator)),
        ("plan-json", "Plan JSON", _plan_json(plan)),
    ]
    return _page(f"nestplan report: {title}", _answer(plan, runners_up), sections)


class Comparison(Protocol):
    """One comparison case as ``api.compare`` returns it."""

    title: str
    rows: Sequence[CompareRow]
    normalised: Sequence[float]


def compare_report(comparisons: Sequence[Comparison]) -> str:
    """The report of ``nestplan compare``: each case's table and figure, on one HTML page."""
    sections = [(f"case-{i}", c.title, _comparison_section(c)) for i, c in enumerate(comparisons)]
    intro = (
        "<p>nestplan against the baseline planners, each over the same evaluator; throughput is normalised "
        "to manual at the smallest scale (to nestplan's where manual finds nothing), as in the NEST paper.</p>"
    )
    sections.append(("validation", "Validation", _validation_paragraph()))
    return _page("nestplan report: comparison with baseline planners", intro, sections)


def _page(title: str, intro: str, sections: Sequence[tuple[str, str, str]]) -> str:
    nav = " ".join(f'<a href="#{anchor}">{_e(heading)}</a>' for anchor, heading, _ in sections)
    body = "".join(
        f'<section id="{anchor}"><h2>{_e(heading)}</h2>{content}</section>\n' for anchor, heading, content in sections
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="icon" href="data:,"><title>{_e(title)}</title><style>{STYLE}</style></head>\n'
        f"<body><h1>{_e(title)}</h1>\n{intro}\n<nav>{nav}</nav>\n{body}"
        f'<p class="note">written by nestplan {_e(__version__)}</p></body></html>\n'
    )


# -- building blocks ------------------------------------------------------------------------------
def _e(value: object) -> str:
    """Any value as page text: markup escaped, quotes included, and every invisible character but the line
    breaks of a file shown whole shown as its escape (``printable``)."""
    return html.escape("\n".join(printable(line) for line in str(value).split("\n")), quote=True)


def _table(header: Sequence[str], rows: Iterable[Sequence[object]], text_columns: Sequence[int] = (0,)) -> str:
    """A table of escaped cells; the ``text_columns`` are left-aligned, the others (numbers) right."""

    def cell(tag: str, i: int, value: object) -> str:
        return f'<{tag} class="text">{_e(value)}</{tag}>' if i in text_columns else f"<{tag}>{_e(value)}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>\n" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table>\n"


def _pairs(items: Iterable[tuple[str, object]]) -> str:
    return _table(("setting", "value"), items, text_columns=(0, 1))


def _gib(x: float) -> str:
    return f"{x / GiB:.2f}"


def _ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


# -- the plan's sections --------------------------------------------------------------------------
def _answer(plan: Plan, runners_up: Sequence[Prediction] | None) -> str:
    """The page's first lines: what to run, its step, run and memory, and why it beats the alternative."""
    bad = not plan.predicted.fits
    rows = "".join(
        f"<tr><th>{_e(label)}</th>"
        + ('<td class="verdict-bad">' if bad and label == "memory" else "<td>")
        + f"{_e(text)}</td></tr>\n"
        for label, text in answer_lines(plan, runners_up)
    )
    return f'<section id="answer"><table class="answer"><tbody>\n{rows}</tbody></table></section>'


def _plan_section(plan: Plan) -> str:
    d, p, names = plan.dims, plan.predicted, plan.level_names
    degrees = [
        ("tp", f"{d.tp}" + (" with sequence parallelism" if d.sp_active else "")),
        ("cp", d.cp),
        ("ep", d.ep),
        *(
            [("expert tensor parallelism (etp)", f"{d.expert_tp}; experts over {d.expert_parallel} ranks")]
            if plan.model.is_moe
            else []
        ),
        ("pp", d.pp),
        ("dp", d.dp),
        ("ZeRO stage", int(d.zero)),
        ("recomputation", d.recompute.value),
        ("microbatch", f"{d.micro_batch_size} sequences; {plan.num_microbatches} microbatches per replica per step"),
        ("schedule", d.schedule.value + (f", {d.virtual_stages} virtual stages" if d.virtual_stages > 1 else "")),
        ("layers per stage", ",".join(map(str, d.layers_per_stage or ()))),
    ]
    spans = [(f"{axis} {d.degree(axis)}", names[p.levels_spanned[axis]]) for axis in AXES if d.degree(axis) > 1]
    boundaries = ", ".join(names[level] for level in p.pp_boundary_levels) or "none (one stage)"
    job = list(plan.job.to_dict().items())
    return (
        f"<h3>Parallelism and schedule</h3>{_pairs(degrees)}"
        f"<h3>Placement</h3><p>rank order {_e('-'.join(plan.axis_order))} (fastest axis first); the network "
        f"level each parallel group spans:</p>{_table(('group', 'level'), spans, (0, 1))}"
        f"<p>links between consecutive pipeline stages: {_e(boundaries)}</p>"
        f"<h3>Job settings</h3>{_pairs(job)}"
    )


def _prediction_section(plan: Plan) -> str:
    p = plan.predicted
    figures = [
        ("step time", f"{p.step_time_s:.4f} s"),
        ("throughput", f"{p.tokens_per_s:,.0f} tokens/s"),
        ("model TFLOP/s per device", f"{p.model_tflops_per_device:.1f}"),
        ("MFU", f"{p.mfu:.1%}"),
        ("hardware TFLOP/s per device", f"{p.hardware_tflops_per_device:.1f}"),
        ("peak memory per device", f"{_gib(p.peak_memory_bytes_per_device)} of {_gib(p.memory_capacity_bytes)} GiB"),
    ]
    breakdown = [
        (term, f"{value:.4f}", f"{value / p.step_time_s:.1%}") for term, value in p.breakdown_s.items() if value > 0
    ]
    return (
        _pairs(figures) + "<h3>Step time breakdown</h3>" + _table(("term", "seconds", "share of the step"), breakdown)
    )


def _stage_layers(s: StageSummary) -> str:
    """'E+0-11', '84-95+H': the blocks a stage holds, with the embedding and the output head."""
    return ("E+" if s.has_embedding else "") + f"{s.first_layer}-{s.last_layer}" + ("+H" if s.has_head else "")


def _memory_section(plan: Plan) -> str:
    p = plan.predicted
    terms = list(dict.fromkeys(term for s in p.stages for term in s.memory_breakdown_bytes))
    rows = [
        (
            i,
            _stage_layers(s),
            s.devices,
            _ms(s.forward_s),
            _ms(s.backward_s),
            _ms(s.cycle_s),
            *(_gib(s.memory_breakdown_bytes.get(term, 0.0)) for term in terms),
            _gib(s.memory_bytes),
        )
        for i, s in enumerate(p.stages)
    ]
    header = ("stage", "layers", "devices", "fwd ms", "bwd ms", "cycle ms", *(f"{t} GiB" for t in terms), "total GiB")
    return (
        f"<p>Per device and per microbatch; the device holds {_gib(p.memory_capacity_bytes)} GiB. "
        "E: the embedding, H: the output head.</p>"
        + _table(header, rows, text_columns=(1,))
        + ("" if p.fits else f'<p class="verdict-bad">{_e(fit_verdict(p))}</p>')
    )


def _plan_figures(pred: Prediction, plan: Plan, folder: Path) -> list[tuple[str, Path]]:
    from nestplan.report.plots import write_plan_plots

    title = f"{plan.model.name} on {plan.cluster.name}"
    paths = write_plan_plots(pred, plan.cluster.topology, folder, title, plan.cluster.host_devices)
    captions = (
        "Timeline: the pipeline schedule as the evaluator simulates it, then the step end; its length is "
        "the predicted step time.",
        "Memory per device of every stage, by term, against the device's capacity.",
        "Placement: every device of the cluster by pipeline stage and data-parallel replica; where a node is wide "
        "(an NVL72 rack) or the cluster large, a cell is a host or a block of devices, as the figure's titles say, "
        "coloured by its first device.",
    )
    return list(zip(captions, paths))


def _pictures(draw: Callable[[Path], list[tuple[str, Path]]]) -> str:
    """The figures ``draw`` writes into a scratch folder, inlined; one line where matplotlib is absent."""
    try:
        import matplotlib  # noqa: F401  (an optional dependency: the report says so where it is absent)
    except ImportError:
        return "<p>No pictures: matplotlib is not installed (pip install matplotlib).</p>"
    with tempfile.TemporaryDirectory(prefix="nestplan-report-") as scratch:
        figures = [
            (caption, base64.b64encode(path.read_bytes()).decode("ascii")) for caption, path in draw(Path(scratch))
        ]
    return "".join(
        f'<figure><img alt="{_e(caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{_e(caption)}</figcaption></figure>\n"
        for caption, data in figures
    )


def run_section(run: RunEstimate) -> str:
    """The run's figures (cost/run.py, cost/reliability.py): time, resources, failures and checkpoints."""
    r, c = run.reliability, run.reliability.checkpoint
    figures = [
        ("length", f"{run.steps:,} steps, {run.tokens:.4g} tokens"),
        ("devices", f"{run.devices:,} + {run.spare_devices:,} spare ({r.spare_hosts} hosts)"),
        ("wall-clock", f"{run.days:.2f} days (compute {run.compute_s / 86400:.2f} days)"),
        ("GPU-hours", f"{run.gpu_hours:,.0f}"),
        ("energy", "- (no board power)" if run.energy_MWh is None else f"{run.energy_MWh:,.1f} MWh"),
        ("cost", money(run.cost_usd)),
        ("goodput", f"{r.goodput:.1%}"),
        (
            "interruptions",
            f"{run.interruptions:,.1f}" + ("" if r.mtbi_s is None else f", one every {r.mtbi_s / 3600:.2f} h"),
        ),
        ("checkpoint interval", f"{r.interval_steps:,} steps ({r.interval_s / 60:.1f} min)"),
        (
            "checkpoint",
            f"{_gib(c.written_bytes_per_rank)} GiB written per rank of {_gib(c.held_bytes_per_rank)} held; write {c.write_s:.1f} s, {c.blocking_s:.2f} s blocking",
        ),
        ("restart", f"{r.restart_s / 60:.1f} min (read {c.read_s:.0f} s, waiting for a host {r.spare_wait_s:.0f} s)"),
    ]
    return (
        "<p>The plan's step times the run's steps, over its goodput (Daly's expected time under exponential "
        "failures, checkpoints at his optimum interval, restarts); the assumptions and their sources are in the "
        "plan JSON's <code>run</code> section.</p>" + _pairs(figures)
    )


def range_section(choice: SizeChoice, title: str) -> str:
    """A device range: every size's best plan and run, the chosen one, and days and cost against devices."""
    from nestplan.report.plots import write_range_plot

    rows = []
    for row in choice.rows:
        run = row.run
        mark = "chosen" if row.devices == choice.chosen.devices else row.note
        if run is None:
            rows.append((f"{row.devices:,}", "-", "-", "-", "-", "-", "-", "-", mark))
            continue
        mwh = "-" if run.energy_MWh is None else f"{run.energy_MWh:,.0f}"
        shown = (f"{run.step_time_s:.3f}", f"{run.days:.2f}", f"{run.reliability.goodput:.1%}", f"{run.gpu_hours:,.0f}")
        rows.append((f"{row.devices:,}", row.plan_text, *shown, mwh, money(run.cost_usd), mark))
    header = ("devices", "plan", "step s", "days", "goodput", "GPU-hours", "MWh", "cost", "note")
    table = _table(header, rows, text_columns=(1, 8))

    def draw(folder: Path) -> list[tuple[str, Path]]:
        path = write_range_plot(choice.rows, choice.chosen.devices, folder / "devices.png", title)
        return [("Days and cost (GPU-hours without a price) against devices; the goodput at each size.", path)]

    intro = (
        f"<p>The best plan at each size of the range, and the size chosen by the objective "
        f"<b>{_e(choice.objective)}</b>; a size whose floor (its GEMM FLOPs at the accelerator's ceiling) "
        "cannot beat the best run found is not planned.</p>"
    )
    return intro + table + (_pictures(draw) if any(row.run is not None for row in choice.rows) else "")


def _runners_up_section(best: Prediction, runners_up: Sequence[Prediction]) -> str:
    rows = [
        (
            describe(pred.plan, pred.placement.axis_order, long=True),
            f"{pred.step_time_s:.3f}",
            f"+{pred.step_time_s / best.step_time_s - 1:.1%}",
            why_lost(best, pred),
            _gib(pred.peak_memory_bytes_per_device),
        )
        for pred in runners_up
    ]
    return (
        "<p>The next-best plans the search kept, best first; why each lost is the step-time term that grew "
        "most against the best plan.</p>"
        + _table(("plan", "step s", "vs best", "why it lost", "memory GiB"), rows, text_columns=(0, 3))
    )


def _exports_section(plan: Plan) -> str:
    parts = [
        "<p>The launch settings of each framework for this plan, as <code>nestplan plan ... --export "
        "FRAMEWORK --out DIR</code> writes them (open a file's name to read it), with their notes.</p>"
    ]
    for framework in FRAMEWORKS:
        try:
            result = build(plan, framework, __version__)
        except PlannerError as exc:  # a framework that cannot run this plan: its reason, the others still shown
            parts.append(f'<h3>{_e(framework)}</h3><p class="note">not exported: {_e(exc)}</p>')
            continue
        notes = "".join(f"<li>{_e(note)}</li>" for note in result.notes)
        parts.append(f"<h3>{_e(framework)}</h3>" + (f"<ul>{notes}</ul>" if notes else "<p>no notes</p>"))
        parts += [f"<details><summary>{_e(f.name)}</summary><pre>{_e(f.text)}</pre></details>\n" for f in result.files]
    return "".join(parts)


def _validation_section(accelerator: Accelerator) -> str:
    measured = MEASURED_SETS.get(accelerator.name)
    checked = (
        f"On {_e(accelerator.name)} nestplan's predictions are checked in its test suite against {_e(measured)}."
        if measured
        else f"No published runs on {_e(accelerator.name)} are among those nestplan's predictions are checked "
        "against; its efficiency constants below are taken as stated, not measured here."
    )
    fp8 = accelerator.fp8_matmul_efficiency
    constants = [
        ("large GEMMs, fraction of the dense peak", f"{accelerator.matmul_efficiency:.3f}"),
        ("FP8 GEMMs, fraction of the FP8 peak", f"{fp8:.3f}" if fp8 is not None else "as the other GEMMs"),
        (
            "fused attention forward / backward, fraction of the peak",
            f"{accelerator.attention_efficiency:.2f} / {accelerator.attention_backward_efficiency:.2f}"
            if accelerator.attention_efficiency is not None
            else "at the GEMM efficiency of its shapes",
        ),
        ("memory-bound kernels, fraction of the HBM bandwidth", f"{accelerator.memory_efficiency:.2f}"),
        ("source", accelerator.source or "-"),
    ]
    return f"<p>{checked}</p>{_validation_paragraph()}<h3>Efficiency model of the accelerator</h3>{_pairs(constants)}"


def _validation_paragraph() -> str:
    return (
        "<p>The errors against each published set are in nestplan's docs/validation.md. How far "
        "nestplan is from your own cluster: put a few measured steps in a runs file and run "
        "<code>nestplan validate RUNS.json</code>, which predicts each run as it ran and prints its error.</p>"
    )


def _plan_json(plan: Plan) -> str:
    text = json.dumps(plan.to_dict(), indent=2, allow_nan=False)
    return (
        "<p>The plan file (<code>nestplan plan ... --json</code>); saved as plan.json, "
        "<code>nestplan export plan.json --framework megatron --out DIR</code> re-exports it.</p>"
        f"<details><summary>plan.json</summary><pre>{_e(text)}</pre></details>"
    )


# -- the comparison's sections --------------------------------------------------------------------
def _comparison_section(c: Comparison) -> str:
    from nestplan.report.compare import plot

    runs = any(r.days is not None for r in c.rows)
    rows = [
        (
            r.devices,
            r.micro_batch_size,
            r.planner,
            f"{r.tokens_per_s:,.0f}" if r.feasible else "-",
            f"{x:.2f}" if r.feasible else "-",
            f"{r.solve_time_s:.2f}",
            *(compare_run_cells(r) if runs else ()),
            r.plan,
        )
        for r, x in zip(c.rows, c.normalised)
    ]
    run_columns = ("days", "GPU-hours", "MWh", "cost", "goodput") if runs else ()
    header = ("devices", "mbs", "planner", "tokens/s", "normalised", "solve s", *run_columns, "plan")
    table = _table(header, rows, text_columns=(2, len(header) - 1))

    def draw(folder: Path) -> list[tuple[str, Path]]:
        path = folder / "compare.png"
        plot(path, c.rows, c.normalised, c.title)
        return [(f"{c.title}: normalised throughput per device count, and tokens/s per planner", path)]

    return table + _pictures(draw)
