"""The ``nestplan`` command line: a thin typer shell over :mod:`nestplan.api`.

Exit codes: 0 done; 2 bad input, one line on stderr naming the option or field, the value and
what is allowed; 3 the job fits nowhere, one line. Integer options take plain decimal digits
within the bounds below. Output paths are checked before any work, and a file nestplan writes
itself appears whole or not at all. Text from the input is printed with its control characters
escaped, and on a pipe rich output never wraps.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import re
import sys
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console

from nestplan import __version__, api
from nestplan.cost.schedules import named as named_schedule
from nestplan.errors import ConfigError, PlannerError, brief, printable
from nestplan.job import MAX_GLOBAL_BATCH_SIZE, MAX_SEQ_LEN, Optimizer
from nestplan.settings import CpCommType, Setting, setting_table
from nestplan.network.topology import MAX_DEVICES  # --devices, and each parallel degree
from nestplan.plan import Plan
from nestplan.search.space import DEFAULT_MEMORY_MARGIN
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, Schedule
from nestplan.strategy.placement import DEFAULT_AXIS_ORDER

MAX_MICRO_BATCH = MAX_GLOBAL_BATCH_SIZE
MAX_VIRTUAL_STAGES = 1024  # model chunks per pipeline stage
MAX_STAGES = 1024  # entries of --layers-per-stage (pp, or pp x v), NxK repeats counted
MAX_LIST_ENTRIES = 64  # entries of compare's --devices and --mbs
PIPE_WIDTH = 10_000  # columns of rich output that is not on a terminal: rows stay one line

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help text is plain: "[trace]" is an extra's name, not markup
    help="Network- and memory-aware planner for distributed LLM training.",
)


# -- integers: plain decimal digits within bounds --------------------------------------------------
_DIGITS = re.compile(r"-?[0-9]+")

FP8_OPTION = typer.Option(
    False, "--fp8", help="FP8 GEMMs in the transformer blocks (Transformer Engine), the rest in --dtype"
)


def _shown(text: str, limit: int = 40) -> str:
    text = printable(text)
    return text if len(text) <= limit else text[:limit] + "..."


def _parse_int(option: str, text: str, low: int, high: int) -> int:
    """``text`` as an integer in low..high: digits 0-9 only (a minus sign reads as out of range);
    no '+', '_', exponent, decimal point or space."""
    if not _DIGITS.fullmatch(text):
        raise ConfigError(
            f"{option} '{_shown(text)}' is not a plain decimal integer (digits 0-9 only); allowed: {low}..{high}",
            field=option,
            value=_shown(text),
            limit=f"{low}..{high}",
        )
    if len(text.lstrip("-0")) > len(str(high)) or not low <= int(text) <= high:
        raise ConfigError(
            f"{option} {_shown(text)} is out of range; allowed: {low}..{high}",
            field=option,
            value=_shown(text),
            limit=f"{low}..{high}",
        )
    return int(text)


def _schedule_list(text: str | None) -> tuple[Schedule, ...] | None:
    """``--schedules``: comma-separated schedule names."""
    if text is None:
        return None
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    known = [s.value for s in Schedule]
    for name in names:
        if name not in known:
            raise ConfigError(
                f"--schedules names '{printable(name)}'; choose from: {', '.join(known)}",
                field="schedules",
                value=printable(name),
                limit=known,
            )
    if not names:
        raise ConfigError(
            "--schedules is empty; name at least one of: " + ", ".join(known),
            field="schedules",
            value=text,
            limit=known,
        )
    return tuple(Schedule(n) for n in names)


MAX_ETP_VALUES = 8  # --etp entries: the divisors of any tp nestplan searches (at most 64) are 7


def _expert_tp_list(text: str | None) -> tuple[int | None, ...] | None:
    """``plan --etp``: comma-separated expert tensor-parallel degrees, 'tp' for etp = tp (no folding)."""
    if text is None:
        return None
    parts = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not parts or len(parts) > MAX_ETP_VALUES:
        raise ConfigError(
            f"--etp takes 1 to {MAX_ETP_VALUES} comma-separated values ('tp' or integers), got {printable(text)!r}",
            field="etp",
            value=printable(text),
            limit=MAX_ETP_VALUES,
        )
    out: list[int | None] = []
    for part in parts:
        if part == "tp":
            out.append(None)
        elif part.isdigit() and 1 <= int(part) <= MAX_DEVICES:
            out.append(int(part))
        else:
            raise ConfigError(
                f"--etp value '{printable(part)}' is neither 'tp' nor an integer in 1..{MAX_DEVICES}",
                field="etp",
                value=printable(part),
                limit=f"tp or 1..{MAX_DEVICES}",
            )
    return tuple(out)


ETP_HELP = (
    "expert tensor parallelism (MoE parallel folding): each expert split over etp consecutive ranks of a tp "
    "group, the tp / etp ranks of each tp group joining the ep ranks in expert parallelism (Megatron's "
    "--expert-model-parallel-size = ep x tp / etp)"
)


def _fraction(option: str) -> Callable[[object], float]:
    """A typer parser for a fraction option (a number; its range is checked where it is used)."""

    def parse(value: object) -> float:
        if isinstance(value, float):
            return value
        try:
            number = float(str(value))
        except ValueError:
            raise ConfigError(
                f"{option} must be a number, got {brief(value)}", field=option.lstrip("-"), value=brief(value)
            ) from None
        if number != number:  # NaN
            raise ConfigError(f"{option} must be a number, got nan", field=option.lstrip("-"), value="nan")
        return number

    return parse


def _integer(option: str, low: int, high: int) -> Callable[[object], int]:
    """A typer parser for the integer option ``option`` (its default passes as it is)."""

    def parse(value: object) -> int:
        return value if isinstance(value, int) else _parse_int(option, str(value), low, high)

    return parse


# context parallelism (job settings shared by evaluate and plan; Megatron-LM's names)
def _int_list(text: str, option: str, high: int, entries: int) -> tuple[int, ...]:
    """Comma-separated integers in 1..high, at most ``entries`` of them."""
    items = [x.strip() for x in text.split(",")]
    if len(items) > entries:
        raise ConfigError(
            f"{option} has {len(items)} entries; at most {entries} allowed",
            field=option,
            value=len(items),
            limit=entries,
        )
    if not any(items):
        raise ConfigError(
            f"{option} '{_shown(text)}' needs comma-separated integers, e.g. 64,128", field=option, value=_shown(text)
        )
    return tuple(_parse_int(option, x, 1, high) for x in items)


DEVICES = _integer("--devices", 1, MAX_DEVICES)
GLOBAL_BATCH = _integer("--global-batch-size", 1, MAX_GLOBAL_BATCH_SIZE)
SEQ_LEN = _integer("--seq-len", 1, MAX_SEQ_LEN)


# -- run settings: one option per entry of the field table (settings.RunSettings) ------------------
SEARCHED_HELP = "; plan: the search tries every value that runs, this option narrows it"


def _setting_option(entry: Setting, searched: bool) -> tuple[object, object]:
    """The annotation and typer option of one run setting on ``evaluate`` (``searched`` False: the
    value costed) or ``plan`` (a searched setting: what the search may try)."""
    narrows = searched and entry.searched
    help_text = entry.help + (SEARCHED_HELP if narrows else "")
    if entry.kind is bool:
        default = True if narrows else entry.default  # plan: allowed unless --no-...
        return bool, typer.Option(default, f"{entry.flag}/--no-{entry.flag[2:]}", help=help_text)
    default = None if narrows else entry.default
    if entry.kind is int:
        low, high = entry.bounds
        parser = _integer(entry.flag, int(low), int(high))
        return int, typer.Option(default, entry.flag, parser=parser, help=help_text)
    if entry.kind is float:
        low, high = entry.bounds
        return float | None, typer.Option(default, entry.flag, min=low, max=high, help=help_text)
    kind = str if entry.kind == "dtype" else entry.kind
    optional = entry.optional or default is None
    return (kind | None if optional else kind), typer.Option(default, entry.flag, help=help_text)


def run_setting_options(searched: bool) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command one option per run setting, after its own; it receives them as one dict,
    ``run_settings`` (by setting name), in place of its parameter of that name."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        hints = typing.get_type_hints(command)
        own = [
            p.replace(annotation=hints[p.name])
            for p in inspect.signature(command).parameters.values()
            if p.name != "run_settings"
        ]
        added = []
        for entry in setting_table():
            annotation, option = _setting_option(entry, searched)
            added.append(
                inspect.Parameter(entry.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)
            )

        @functools.wraps(command)
        def run(**given: object) -> None:
            settings = {entry.name: given.pop(entry.name) for entry in setting_table()}
            command(**given, run_settings=settings)

        run.__signature__ = inspect.Signature(own + added)
        run.__annotations__ = {p.name: p.annotation for p in own + added}
        return run

    return decorate


# -- output: rich consoles, stderr lines, JSON --------------------------------------------------
def _console(stderr: bool = False) -> Console:
    """A rich Console as wide as the terminal, or on a pipe so wide that nothing wraps."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else PIPE_WIDTH)


def _say(text: str) -> None:
    """One line on stderr, control characters escaped."""
    sys.stderr.write(printable(text) + "\n")


def _print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, allow_nan=False) + "\n")


def _print_paths(console: Console, label: str, paths: list[Path]) -> None:
    if paths:
        console.print(f"{label}: " + ", ".join(printable(str(p)) for p in paths), markup=False)


# -- output paths ---------------------------------------------------------------------------------
def _os_reason(exc: OSError, path: Path | None = None) -> str:
    """The system's reason, naming the file when it is not ``path`` itself."""
    named = exc.filename is not None and (path is None or str(exc.filename) != str(path))
    return (exc.strerror or printable(str(exc))) + (f" ('{printable(str(exc.filename))}')" if named else "")


@contextmanager
def _output(option: str, path: Path) -> Iterator[None]:
    """An OSError while writing ``path`` (given by ``option``) as one ConfigError naming both."""
    try:
        yield
    except OSError as exc:
        raise ConfigError(
            f"{option} '{printable(str(path))}' cannot be written: {_os_reason(exc, path)}",
            field=option,
            value=printable(str(path)),
        ) from None


@contextmanager
def _drawing(option: str, path: Path) -> Iterator[None]:
    """:func:`_output` for figures, a missing matplotlib included."""
    with _output(option, path):
        try:
            yield
        except ImportError as exc:
            raise ConfigError(
                f"{option} '{printable(str(path))}' needs matplotlib (pip install matplotlib): {printable(str(exc))}",
                field=option,
                value=printable(str(path)),
            ) from None


def _check_output(option: str, path: Path, folder: bool) -> None:
    """Refuse, before any work, an output that cannot be written: a file where a folder is wanted
    or the reverse, a name too long, a parent that is a file or not writable."""
    shown = printable(str(path))
    with _output(option, path):
        probe = path
        while not probe.exists() and probe.parent != probe:
            probe = probe.parent
        if probe == path and folder and not path.is_dir():
            raise ConfigError(f"{option} '{shown}' is not a folder", field=option, value=shown)
        if probe == path and not folder and path.is_dir():
            raise ConfigError(f"{option} '{shown}' is a folder; a file name is needed", field=option, value=shown)
        if probe != path and not probe.is_dir():
            raise ConfigError(
                f"{option} '{shown}': '{printable(str(probe))}' is not a folder", field=option, value=shown
            )
        if not os.access(probe, os.W_OK):
            raise ConfigError(
                f"{option} '{shown}': '{printable(str(probe))}' is not writable", field=option, value=shown
            )


@contextmanager
def _replacing(path: Path) -> Iterator[Path]:
    """A temporary file beside ``path`` to write, moved over ``path`` once complete, so that a
    failure (a full disk) leaves no half-written file; a link or a special file (/dev/stdout) is
    written through."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        yield path
        return
    temporary = path.with_name(f".nestplan-{os.getpid()}.partial{path.suffix}")
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _plots(out: Path, draw: Callable[[Path], list[Path]]) -> list[Path]:
    """The plan's figures written into ``out`` (``--plot``); a failure is one ConfigError."""
    with _drawing("--plot", out):
        return draw(out)


REPORT_OPTION = typer.Option(None, "--report", help="write a self-contained HTML report to this file")


def _write_report(path: Path, page: Callable[[], str]) -> None:
    """The HTML report ``page`` builds, written whole to ``path`` (``--report``; missing folders created);
    one line on stderr names it."""
    text = page()
    with _output("--report", path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with _replacing(path) as partial:
            partial.write_text(text, encoding="utf-8")
    _say(f"nestplan: wrote the report {path}")


# -- commands -------------------------------------------------------------------------------------
_LAYER_ITEM = re.compile(r"([0-9]+)(?:x([0-9]+))?")  # a count, or NxK: the count N repeated K times


def _layers(text: str | None) -> tuple[int, ...] | None:
    """``--layers-per-stage``: comma-separated counts (0 allowed: the dims say where), each a plain
    decimal integer or NxK (N repeated K times: 1,2x62,1 is 1, 62 twos, 1), at most MAX_STAGES in all."""
    if not text:
        return None
    option, counts = "--layers-per-stage", []
    for item in (x.strip() for x in text.split(",")):
        match = _LAYER_ITEM.fullmatch(item)
        if match is None:
            raise ConfigError(
                f"{option} '{_shown(item)}' is not a plain decimal integer or NxK (N repeated K "
                "times, digits 0-9), e.g. 1,2x62,1",
                field=option,
                value=_shown(item),
            )
        count = _parse_int(option, match[1], 0, MAX_DEVICES)
        repeat = _parse_int(option, match[2], 1, MAX_STAGES) if match[2] else 1
        if len(counts) + repeat > MAX_STAGES:
            raise ConfigError(
                f"{option} has more than {MAX_STAGES} entries; at most {MAX_STAGES} allowed",
                field=option,
                value=_shown(text),
                limit=MAX_STAGES,
            )
        counts += [count] * repeat
    return tuple(counts)


def _axis_order(text: str) -> tuple[str, ...]:
    return tuple(a.strip() for a in text.replace("-", ",").split(","))


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
def evaluate(
    model: str = typer.Option(..., "--model", help="catalog name or path to a Hugging Face config.json"),
    cluster: str = typer.Option(..., "--cluster", help="catalog name or path to a cluster TOML/JSON file"),
    devices: int | None = typer.Option(None, "--devices", parser=DEVICES, help="use the first N devices"),
    tp: int = typer.Option(1, "--tp", parser=_integer("--tp", 1, MAX_DEVICES)),
    pp: int = typer.Option(1, "--pp", parser=_integer("--pp", 1, MAX_DEVICES)),
    dp: int = typer.Option(
        1,
        "--dp",
        parser=_integer("--dp", 1, MAX_DEVICES),
        help="data-parallel replicas, not counting ep (Megatron-LM's count is converted)",
    ),
    cp: int = typer.Option(1, "--cp", parser=_integer("--cp", 1, MAX_DEVICES)),
    ep: int = typer.Option(
        1,
        "--ep",
        parser=_integer("--ep", 1, MAX_DEVICES),
        help="data-parallel ranks whose experts differ (with --etp below tp, expert parallelism is ep x tp / etp)",
    ),
    etp: int | None = typer.Option(
        None, "--etp", parser=_integer("--etp", 1, MAX_DEVICES), help=ETP_HELP + "; default tp (Megatron-LM's default)"
    ),
    sp: bool = typer.Option(False, "--sp", help="sequence parallelism (needs tp > 1)"),
    zero: int = typer.Option(0, "--zero", parser=_integer("--zero", 0, 3), help="ZeRO stage 0-3"),
    recompute: Recompute = typer.Option(Recompute.NONE, "--recompute"),
    mbs: int = typer.Option(1, "--mbs", parser=_integer("--mbs", 1, MAX_MICRO_BATCH), help="microbatch size"),
    schedule: Schedule = typer.Option(Schedule.ONE_F_ONE_B, "--schedule"),
    virtual_stages: int = typer.Option(
        1,
        "--virtual-stages",
        parser=_integer("--virtual-stages", 1, MAX_VIRTUAL_STAGES),
        help="model chunks per stage; v > 1 with --schedule 1f1b (the default) runs interleaved 1F1B",
    ),
    layers_per_stage: str | None = typer.Option(
        None,
        "--layers-per-stage",
        help="per stage, e.g. 10,11,11,10; with --virtual-stages V > 1 also pp x V "
        "virtual stages in model order, NxK = N repeated K times, e.g. 1,2x62,1",
    ),
    global_batch_size: int = typer.Option(..., "--global-batch-size", parser=GLOBAL_BATCH, help="sequences per step"),
    seq_len: int | None = typer.Option(
        None, "--seq-len", parser=SEQ_LEN, help="default: the model's context, at most 8192"
    ),
    dtype: str | None = typer.Option(None, "--dtype", help="default: bf16, or fp16 where the accelerator lacks it"),
    optimizer: Optimizer = typer.Option(Optimizer.ADAM, "--optimizer"),
    fp8: bool = FP8_OPTION,
    axis_order: str = typer.Option(",".join(DEFAULT_AXIS_ORDER), "--axis-order", help="rank grid, fastest first"),
    as_json: bool = typer.Option(False, "--json", help="print only the plan JSON"),
    plot: Path | None = typer.Option(None, "--plot", help="write timeline.png, memory.png, placement.png here"),
    report: Path | None = REPORT_OPTION,
    run_settings: dict[str, object] | None = None,
) -> None:
    """Predict step time, its breakdown and memory per device of one plan. A plan that does not fit
    is still predicted (exit 0): a warning on stderr, the verdict in the first line, "fits" in JSON."""
    if plot is not None:
        _check_output("--plot", plot, folder=True)
    if report is not None:
        _check_output("--report", report, folder=False)
    spec = api.resolve_model(model)
    schedule = named_schedule(schedule, virtual_stages)  # the registry's rule: 1f1b with v > 1 is interleaved
    plan = ParallelDims(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        ep=ep,
        etp=etp,
        sp=sp,
        zero=zero,
        recompute=recompute,
        micro_batch_size=mbs,
        schedule=schedule,
        virtual_stages=virtual_stages,
        layers_per_stage=_layers(layers_per_stage),
    )
    plan, note = _from_megatron_dp(plan, devices)
    full = api.resolve_cluster(cluster)
    job = api.job_for(spec, full, global_batch_size, seq_len, dtype=dtype, optimizer=optimizer, fp8=fp8, **run_settings)
    result = api.evaluate_full(spec, full, plan, job, devices=devices, axis_order=_axis_order(axis_order))
    if note:
        _say(note)
    typed = result.plan
    from nestplan.report.text import fit_verdict, render_plan

    if not typed.predicted.fits:
        _say(f"nestplan: warning: the plan {fit_verdict(typed.predicted)}")
    console = _console()
    if as_json:
        _print_json(typed.to_dict())
    else:
        render_plan(console, typed)
    written = _plots(plot, result.plot) if plot is not None else []
    if not as_json:
        _print_paths(console, "plots", written)
    if report is not None:
        from nestplan.report.html import plan_report

        _write_report(report, lambda: plan_report(typed))


@app.command("plan")
@run_setting_options(searched=True)
def plan_command(
    model: str = typer.Option(..., "--model", help="catalog name or path to a Hugging Face config.json"),
    cluster: str = typer.Option(..., "--cluster", help="catalog name or path to a cluster TOML/JSON file"),
    devices: int | None = typer.Option(None, "--devices", parser=DEVICES, help="use the first N devices"),
    global_batch_size: int = typer.Option(
        api.DEFAULT_GLOBAL_BATCH, "--global-batch-size", parser=GLOBAL_BATCH, help="sequences per step"
    ),
    seq_len: int | None = typer.Option(
        None, "--seq-len", parser=SEQ_LEN, help="default: the model's context, at most 8192"
    ),
    dtype: str | None = typer.Option(None, "--dtype", help="default: bf16, or fp16 where the accelerator lacks it"),
    optimizer: Optimizer = typer.Option(Optimizer.ADAM, "--optimizer"),
    fp8: bool = FP8_OPTION,
    top: int = typer.Option(5, "--top", parser=_integer("--top", 0, api.MAX_TOP), help="runner-up plans to show"),
    as_json: bool = typer.Option(False, "--json", help="print only the plan JSON"),
    plot: Path | None = typer.Option(None, "--plot", help="write timeline.png, memory.png, placement.png here"),
    export: str | None = typer.Option(
        None, "--export", help="megatron, torchtitan, deepspeed or megatron-bridge (alias nemo)"
    ),
    out: Path = typer.Option(Path("nestplan-export"), "--out", help="folder for --export's files"),
    schedules: str | None = typer.Option(
        None,
        "--schedules",
        help="comma-separated pipeline schedules the plan "
        "may use (default: all; with --export: those the framework runs)",
    ),
    expert_tp: str | None = typer.Option(
        None,
        "--etp",
        help=ETP_HELP + "; comma-separated values tried, 'tp' "
        "for etp = tp (default: tp,1; with --export: what the framework runs)",
    ),
    memory_margin: float = typer.Option(
        DEFAULT_MEMORY_MARGIN,
        "--memory-margin",
        parser=_fraction("--memory-margin"),
        help="fraction of device memory the plan leaves free (fragmentation, NCCL buffers, CUDA graphs)",
    ),
    trace: bool = typer.Option(
        False,
        "--trace",
        help="calibrate the model's block FLOPs and activations on its traced PyTorch graph first (extra [trace])",
    ),
    report_path: Path | None = REPORT_OPTION,
    run_settings: dict[str, object] | None = None,
) -> None:
    """Find the fastest plan that fits (NEST's network- and memory-aware dynamic program)."""
    if plot is not None:
        _check_output("--plot", plot, folder=True)
    if report_path is not None:
        _check_output("--report", report_path, folder=False)
    if export is not None:
        from nestplan.export import check_framework

        check_framework(export)
        _check_output("--out", out, folder=True)
    rows = _print_trace(model, seq_len, _console(stderr=True)) if trace else None
    spec = api.resolve_model(model)
    if export is not None:
        api.check_exportable(spec, export)  # before the search: a model the framework cannot build
    if rows:
        spec = api.calibrate(spec, rows)
        _say(
            f"planning with the traced block FLOPs x {spec.traced_flops_scale:.4f} and saved "
            f"activations x {spec.traced_activation_scale:.4f} of the formulas"
        )
    cl = api.resolve_cluster(cluster, devices)
    space = api.search_space(
        schedules=_schedule_list(schedules),
        export=export,
        cp_comm_types=None if run_settings["cp_comm_type"] is None else (CpCommType(run_settings["cp_comm_type"]),),
        memory_margin=memory_margin,
        expert_tp=_expert_tp_list(expert_tp),
        moe_comm_overlap=bool(run_settings.pop("moe_comm_overlap")),
        model=spec,
    )
    assert space.cp_comm_types
    job = api.job_for(
        spec,
        cl,
        global_batch_size,
        seq_len,
        dtype=dtype,
        optimizer=optimizer,
        fp8=fp8,
        **{**run_settings, "cp_comm_type": space.cp_comm_types[0]},
    )
    with _progress() as advance:
        report = api.plan(spec, cl, job, top=top, progress=advance, space=space)
    best = report.plan
    console = _console()
    if as_json:
        _print_json(best.to_dict())
    else:
        _render_report(console, best, report)
    written = _plots(plot, lambda folder: api.plot_plan(best, folder)) if plot is not None else []
    if export is not None:
        with _output("--out", out):
            paths, result = api.export_plan(best, export, out)
        written += paths
        for note in result.notes:
            _say(f"{export}: note: {note}")
    if not as_json:
        _print_paths(console, "wrote", written)
    if report_path is not None:
        from nestplan.report.html import plan_report

        _write_report(report_path, lambda: plan_report(best, report.runners_up))


def _render_report(console: Console, best: Plan, report: api.PlanReport) -> None:
    from nestplan.report.text import render_plan, render_runners_up, render_schedules

    render_plan(console, best)
    render_runners_up(console, report.best, report.runners_up)
    render_schedules(console, report.best, report.schedule_alternatives())
    s = report.stats
    console.print(
        f"search: {s.solve_time_s:.2f} s, {s.configurations:,} configurations, {s.enumerated:,} groups "
        f"({s.groups:,} solved; {s.skipped_bound:,} skipped by the bound, {s.skipped_memory:,} that fit "
        f"nowhere, {s.skipped_zero:,} by ZeRO escalation), {s.depths:,} pipeline depths, "
        f"{s.pruned_memory:,} pruned by memory, {s.pruned_bound:,} by the bound, {s.candidates:,} splits "
        "costed"
    )


class _progress:
    """A transient rich progress bar on stderr (only on a terminal): yields an advance callback."""

    def __init__(self, unit: str = "groups", every: int = 64) -> None:
        self._unit, self._every = unit, every

    def __enter__(self):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(
            TextColumn("planning"),
            BarColumn(),
            TextColumn("{task.completed} " + self._unit),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
            disable=not sys.stderr.isatty(),
        )
        self._bar.__enter__()
        task = self._bar.add_task("plan", total=None)
        return lambda i: self._bar.update(task, completed=i + 1) if i % self._every == 0 else None

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)


@app.command("compare")
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
    report: Path | None = REPORT_OPTION,
) -> None:
    """Compare nestplan with baseline planners over device counts (and microbatch sizes)."""
    from nestplan.report.compare import plot as draw
    from nestplan.report.compare import write_csv
    from nestplan.report.text import render_compare

    mbs_list = _int_list(mbs, "--mbs", MAX_MICRO_BATCH, MAX_LIST_ENTRIES)
    if paper:
        cases = api.paper_cases()
    elif not model or not cluster:
        raise ConfigError("compare needs --model and --cluster (or --paper)", field="model")
    else:
        cases = [
            api.CompareCase(
                model, cluster, _int_list(devices, "--devices", MAX_DEVICES, MAX_LIST_ENTRIES), mbs_list, seq_len
            )
        ]
    for option, path in (("--plot", plot), ("--csv", csv_path)):
        if path is not None:
            _check_output(option, path, folder=paper)
    if report is not None:
        _check_output("--report", report, folder=False)
    console = _console()
    results = api.compare(cases, baselines.split(","), global_batch_size)
    for result in results:
        render_compare(console, result.title, result.rows, result.normalised)
        if csv_path is not None:
            target = csv_path / f"{result.tag}.csv" if paper else csv_path
            with _output("--csv", target), _replacing(target) as partial:
                write_csv(partial, result.rows, result.normalised)
        if plot is not None:
            target = plot / f"{result.tag}.png" if paper else plot
            with _drawing("--plot", target), _replacing(target) as partial:
                draw(partial, result.rows, result.normalised, result.title)
    if report is not None:
        from nestplan.report.html import compare_report

        _write_report(report, lambda: compare_report(results))


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
    _check_output("--out", out, folder=True)
    with _output("--out", out):
        paths, result = api.export_plan(plan, framework, out)
    for note in result.notes:
        _say(f"{framework}: note: {note}")
    _print_paths(_console(), "wrote", paths)


@app.command("trace")
def trace_command(
    model: str = typer.Option(..., "--model", help="catalog name or path to a Hugging Face config.json"),
    seq_len: int | None = typer.Option(
        None, "--seq-len", parser=SEQ_LEN, help="default: the model's context, at most 2048"
    ),
) -> None:
    """Measure per-block FLOPs and saved activations from the PyTorch model (extra [trace])."""
    _print_trace(model, seq_len, _console())


def _print_trace(model: str, seq_len: int | None, console: Console) -> list:
    from rich.table import Table

    result, rows = api.trace(model, seq_len)
    table = Table(title=f"{result.model_type}: {result.tokens} tokens, traced in {result.seconds:.1f} s")
    for col in ("block", "traced GFLOP", "closed form GFLOP", "traced MiB saved", "closed form MiB saved"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            f"{r['block']}{' (MoE)' if r['moe'] else ''}",
            f"{r['traced_flops'] / 1e9:,.1f}",
            f"{r['closed_flops'] / 1e9:,.1f}",
            f"{r['traced_saved_bytes'] / 2**20:,.1f}",
            f"{r['closed_saved_bytes'] / 2**20:,.1f}",
        )
    console.print(table)
    return rows


@app.command("sweep")
def sweep_command(
    target: str = typer.Argument(..., help="SPEC.toml to run, or the word 'report'"),
    folder: Path | None = typer.Argument(None, help="with 'report': the sweep's output folder"),
    out: Path = typer.Option(Path("sweep-out"), "--out", help="folder of results.sqlite (and the report)"),
    workers: int = typer.Option(
        2, "--workers", parser=_integer("--workers", 1, api.MAX_WORKERS), help="local worker processes"
    ),
    ray: str | None = typer.Option(None, "--ray", help="run on Ray: local, auto or ray://host:port"),
) -> None:
    """Run a sweep spec (resuming where a previous run stopped), or `sweep report DIR`."""
    console = _console()
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
    _check_output("--out", out, folder=True)
    with _progress("cases", every=1) as advance:
        summary = api.sweep(target, out, workers=workers, ray=ray, progress=lambda done, total: advance(done - 1))
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
        _check_output("OUTPUT.json", output_path, folder=False)
    with _progress("groups") as step:
        inp, out, result = api.nest_solve(input_path, progress=step)
    text = json.dumps(out, indent=2, allow_nan=False) + "\n"
    if output_path is not None:
        with _output("OUTPUT.json", output_path), _replacing(output_path) as partial:
            partial.write_text(text)
    else:
        sys.stdout.write(text)
    if explain:
        lines = api.nest_explain(inp, result, model=model, cluster=cluster)
        stream = sys.stderr if output_path is None else sys.stdout
        stream.write("".join(printable(line) + "\n" for line in lines))


@app.command()
def validate(
    runs: Path = typer.Argument(..., help='runs file: measured runs as JSON (docs/formats.md, "Runs file")'),
    as_json: bool = typer.Option(False, "--json", help="print the rows and summaries as JSON"),
) -> None:
    """Predict every measured run of a runs file as it ran and print the error of each, with the
    median and largest per precision, model and tp degree. A row that cannot be evaluated is
    reported in one line; the others still are."""
    from nestplan.report.validation import render_validation, validation_dict

    results = api.validate(runs)
    if as_json:
        _print_json(validation_dict(results))
    else:
        render_validation(_console(), results)


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
        _print_json(entries)
        return
    from nestplan.report.text import render_catalog

    render_catalog(_console(), kind.strip().lower(), entries)


def _print_version(value: bool) -> None:
    if value:
        sys.stdout.write(f"nestplan {__version__}\n")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="print nestplan's version and exit"
    ),
) -> None:
    """Network- and memory-aware planner for distributed LLM training."""


# -- entry point ----------------------------------------------------------------------------------
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


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app, turning every user error into one line on stderr."""
    command = typer.main.get_command(app)
    mods = _click_exceptions()
    usage_errors = tuple(m.ClickException for m in mods)
    help_requests = tuple(m.NoArgsIsHelpError for m in mods if hasattr(m, "NoArgsIsHelpError"))
    exits = tuple({m.Exit for m in mods if hasattr(m, "Exit")} | {typer.Exit})
    aborts = tuple({m.Abort for m in mods if hasattr(m, "Abort")} | {typer.Abort})
    try:
        command.main(args=argv, prog_name="nestplan", standalone_mode=False)
    except PlannerError as exc:
        _say(f"nestplan: error: {exc}")
        sys.exit(exc.exit_code)
    except help_requests as exc:  # no command: the help on stdout, the error on stderr
        sys.stdout.write(exc.format_message().rstrip("\n") + "\n")
        _say("nestplan: error: no command given; choose one of the commands listed above")
        sys.exit(2)
    except usage_errors as exc:
        _say(f"nestplan: error: {exc.format_message().strip()}")
        sys.exit(2)
    except exits as exc:
        sys.exit(exc.exit_code)
    except aborts:
        sys.exit(130)
    except OSError as exc:  # a file the commands did not foresee failing (their outputs are checked)
        _say(f"nestplan: error: {_os_reason(exc)}")
        sys.exit(2)


if __name__ == "__main__":
    main()
