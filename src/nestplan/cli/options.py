"""Options shared by several commands, and the run settings' options derived from the field table
(nestplan.settings)."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from nestplan.api import DEFAULT_GLOBAL_BATCH, MAX_TOP
from nestplan.cli.parse import DEVICES as DEVICES_PARSER
from nestplan.cli.parse import ETP_HELP, MAX_MICRO_BATCH, MAX_VIRTUAL_STAGES, fraction, integer, number
from nestplan.cost.run import MAX_STEPS, MAX_TOKENS
from nestplan.hardware.facility import MAX_SPARE_HOSTS, PRICE_PER_GPU_HOUR_RANGE, PRICE_PER_KWH_RANGE
from nestplan.search.sizes import Objective
from nestplan.cli.parse import GLOBAL_BATCH as GLOBAL_BATCH_PARSER
from nestplan.cli.parse import SEQ_LEN as SEQ_LEN_PARSER
from nestplan.job import Optimizer
from nestplan.network.topology import MAX_DEVICES
from nestplan.search.space import DEFAULT_MEMORY_MARGIN
from nestplan.strategy.enums import Recompute, Schedule
from nestplan.strategy.placement import DEFAULT_AXIS_ORDER
from nestplan.settings import Setting, setting_table

# -- run settings: one option per entry of the field table (settings.RunSettings) ------------------
SEARCHED_HELP = "; plan: the search tries every value that runs, this option narrows it"


def _setting_option(entry: Setting, searched: bool) -> tuple[object, object]:
    """The annotation and typer option of one run setting on ``evaluate`` (``searched`` False: the
    value costed) or ``plan`` (a searched setting: what the search may try). An option not given is
    None: the framework's preset, else the field's default (``RunSettings.from_mapping``)."""
    narrows = searched and entry.searched
    help_text = entry.help + (SEARCHED_HELP if narrows else "")
    if entry.kind is bool:
        default = True if narrows else None  # plan: allowed unless --no-...
        return bool | None, typer.Option(default, f"{entry.flag}/--no-{entry.flag[2:]}", help=help_text)
    if entry.kind is int:
        low, high = entry.bounds
        parser = integer(entry.flag, int(low), int(high))
        return int | None, typer.Option(None, entry.flag, parser=parser, help=help_text)
    if entry.kind is float:
        low, high = entry.bounds
        return float | None, typer.Option(None, entry.flag, min=low, max=high, help=help_text)
    # a choice parsed by the field table's own check: one line naming the closest choices, not typer's message
    choices = "[" + "|".join(entry.choices) + "]"
    return object, typer.Option(None, entry.flag, parser=entry.check, metavar=choices, help=help_text)


def run_setting_options(searched: bool) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command one option per run setting, after its own; it receives those given as one dict,
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
            command(**given, run_settings={name: value for name, value in settings.items() if value is not None})

        run.__signature__ = inspect.Signature(own + added)
        run.__annotations__ = {p.name: p.annotation for p in own + added}
        return run

    return decorate


SAVED_PLAN = typer.Option(None, "--plan", help="a saved plan (plan --json) to evaluate again")
CHANGES = typer.Option(
    None,
    "--set",
    help="with --plan: KEY=VALUE,... (tp, pp, dp, cp, ep, etp, sp, zero, recompute, mbs, "
    "schedule, virtual_stages, layers_per_stage, or a run setting by name)",
)
PROFILE = typer.Option(
    None,
    "--profile",
    help="calibration profile (nestplan calibrate's TOML); default: the catalog's for the accelerator and "
    "framework, if any; 'none': the published figures",
)
REPORT = typer.Option(None, "--report", help="write a self-contained HTML report to this file")
FP8 = typer.Option(False, "--fp8", help="FP8 GEMMs in the transformer blocks (Transformer Engine), the rest in --dtype")


# -- the model, cluster and job ---------------------------------------------------------------------
MODEL_HELP = "catalog name or path to a Hugging Face config.json"
CLUSTER_HELP = "catalog name or path to a cluster TOML/JSON file"
MODEL = typer.Option(..., "--model", help=MODEL_HELP)
CLUSTER = typer.Option(..., "--cluster", help=CLUSTER_HELP)
DEVICES = typer.Option(None, "--devices", parser=DEVICES_PARSER, help="use the first N devices")
GPUS_PER_DOMAIN = typer.Option(
    None,
    "--gpus-per-domain",
    parser=integer("--gpus-per-domain", 1, MAX_DEVICES),
    help="GPUs used per unit of the cluster's innermost level (NVLink domain) where the job does not fill them, "
    "whole hosts (default: the cluster file's, else the most whole hosts per domain that divide the job)",
)
GLOBAL_BATCH = typer.Option(
    DEFAULT_GLOBAL_BATCH, "--global-batch-size", parser=GLOBAL_BATCH_PARSER, help="sequences per step"
)
REQUIRED_GLOBAL_BATCH = typer.Option(..., "--global-batch-size", parser=GLOBAL_BATCH_PARSER, help="sequences per step")
SEQ_LEN = typer.Option(None, "--seq-len", parser=SEQ_LEN_PARSER, help="default: the model's context, at most 8192")
DTYPE = typer.Option(None, "--dtype", help="default: bf16, or fp16 where the accelerator lacks it")
OPTIMIZER = typer.Option(Optimizer.ADAM, "--optimizer")
JSON = typer.Option(False, "--json", help="print only the plan JSON")
PLOT = typer.Option(None, "--plot", help="write timeline.png, memory.png, placement.png here")


# -- one plan's degrees (evaluate) ------------------------------------------------------------------
def degree(flag: str, help: str | None = None) -> Any:
    """A parallel degree's option: 1 by default, 1 to MAX_DEVICES."""
    return typer.Option(1, flag, parser=integer(flag, 1, MAX_DEVICES), help=help)


EP_HELP = "data-parallel ranks whose experts differ (with --etp below tp, expert parallelism is ep x tp / etp)"
ETP = typer.Option(
    None, "--etp", parser=integer("--etp", 1, MAX_DEVICES), help=ETP_HELP + "; default tp (Megatron-LM's default)"
)
SP = typer.Option(False, "--sp", help="sequence parallelism (needs tp > 1)")
ZERO = typer.Option(0, "--zero", parser=integer("--zero", 0, 3), help="ZeRO stage 0-3")
RECOMPUTE = typer.Option(Recompute.NONE, "--recompute")
MBS = typer.Option(1, "--mbs", parser=integer("--mbs", 1, MAX_MICRO_BATCH), help="microbatch size")
SCHEDULE = typer.Option(Schedule.ONE_F_ONE_B, "--schedule")
VIRTUAL_STAGES = typer.Option(
    None,
    "--virtual-stages",
    parser=integer("--virtual-stages", 1, MAX_VIRTUAL_STAGES),
    help="model chunks per stage; v > 1 with --schedule 1f1b (the default) runs interleaved 1F1B; default: "
    "the chunks the schedule always runs (2 for zbv and dualpipev), else 1",
    show_default=False,
)
LAYERS_PER_STAGE = typer.Option(
    None,
    "--layers-per-stage",
    help="per stage, e.g. 10,11,11,10; with --virtual-stages V > 1 also pp x V "
    "virtual stages in model order, NxK = N repeated K times, e.g. 1,2x62,1",
)
AXIS_ORDER = typer.Option(
    None,
    "--axis-order",
    help="rank grid, fastest first (default: the framework's own, tp-cp-ep-dp-pp for Megatron-LM and NeMo; "
    f"{','.join(DEFAULT_AXIS_ORDER)} for fsdp)",
)


# -- the search (plan) ------------------------------------------------------------------------------
TOP = typer.Option(5, "--top", parser=integer("--top", 0, MAX_TOP), help="runner-up plans to show")
EXPORT = typer.Option(None, "--export", help="megatron, torchtitan, deepspeed or megatron-bridge (alias nemo)")
EXPORT_OUT = typer.Option(Path("nestplan-export"), "--out", help="folder for --export's files")
SCHEDULES = typer.Option(
    None,
    "--schedules",
    help="comma-separated pipeline schedules the plan may use (default: all; with --export: those the framework runs)",
)
ETP_LIST = typer.Option(
    None,
    "--etp",
    help=ETP_HELP + "; comma-separated values tried, 'tp' for etp = tp (default: tp,1; with --export: what the "
    "framework runs)",
)
MEMORY_MARGIN = typer.Option(
    DEFAULT_MEMORY_MARGIN,
    "--memory-margin",
    parser=fraction("--memory-margin"),
    help="fraction of device memory the plan leaves free (fragmentation, NCCL buffers, CUDA graphs)",
)
TRACE = typer.Option(
    False,
    "--trace",
    help="calibrate the model's block FLOPs and activations on its traced PyTorch graph first (extra [trace])",
)


# -- a whole run (evaluate and plan; plan alone: objectives, limits, a range of device counts) -----
# the run options of evaluate and plan (a whole run: its length, prices and spares), and plan's device range
RUN_SPECS: tuple[tuple[str, object, object], ...] = (
    (
        "tokens",
        float | None,
        typer.Option(
            None,
            "--tokens",
            parser=number("--tokens", 1, MAX_TOKENS),
            help="train this many tokens: the whole run (days, GPU-hours, energy, failures)",
        ),
    ),
    (
        "steps",
        int | None,
        typer.Option(None, "--steps", parser=integer("--steps", 1, MAX_STEPS), help="or this many steps"),
    ),
    (
        "price_per_gpu_hour_usd",
        float | None,
        typer.Option(
            None,
            "--price-per-gpu-hour",
            parser=number("--price-per-gpu-hour", *PRICE_PER_GPU_HOUR_RANGE),
            help="USD per GPU-hour (default: the cluster file's [facility])",
        ),
    ),
    (
        "price_per_kwh_usd",
        float | None,
        typer.Option(
            None,
            "--price-per-kwh",
            parser=number("--price-per-kwh", *PRICE_PER_KWH_RANGE),
            help="USD per kWh of the facility's energy, added to the cost",
        ),
    ),
    (
        "spare_hosts",
        int | None,
        typer.Option(
            None,
            "--spare-hosts",
            parser=integer("--spare-hosts", 0, MAX_SPARE_HOSTS),
            help="hosts held back for failures (default: the count that costs the fewest device-hours)",
        ),
    ),
)
RANGE_SPECS: tuple[tuple[str, object, object], ...] = (
    (
        "devices_range",
        str | None,
        typer.Option(
            None,
            "--devices-range",
            help="plan each power-of-two device count in LOW..HIGH (whole hosts) "
            "and choose one by --objective, e.g. 256..16384",
        ),
    ),
    (
        "max_devices",
        int | None,
        typer.Option(
            None,
            "--max-devices",
            parser=integer("--max-devices", 1, MAX_DEVICES),
            help="with --objective: the range 1..N",
        ),
    ),
    ("objective", Objective, typer.Option(Objective.TIME, "--objective", help="what a range minimises")),
    (
        "max_days",
        float | None,
        typer.Option(None, "--max-days", parser=number("--max-days", 1e-6, 1e6), help="wall-clock days at most"),
    ),
    (
        "max_cost",
        float | None,
        typer.Option(None, "--max-cost", parser=number("--max-cost", 0, 1e15), help="cost in USD at most"),
    ),
)


def _run_parameters(ranged: bool) -> list[inspect.Parameter]:
    """The run's options as keyword parameters (file units: prices in USD)."""
    specs = RUN_SPECS + (RANGE_SPECS if ranged else ())
    return [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind)
        for name, kind, option in specs
    ]


def _grouped(group: str, added: list[inspect.Parameter]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the options ``added``, after its own; it receives them as one dict, ``group``, in place of
    its parameter of that name."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command)
        own = [p for p in signature.parameters.values() if p.name != group]
        names = [p.name for p in added]

        @functools.wraps(command)
        def run(**given: object) -> None:
            inputs = {name: given.pop(name) for name in names}
            command(**given, **{group: inputs})

        run.__signature__ = signature.replace(parameters=own + added)
        run.__annotations__ = {**getattr(command, "__annotations__", {}), **{p.name: p.annotation for p in added}}
        run.__annotations__.pop(group, None)
        return run

    return decorate


def run_options(ranged: bool) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the run's options, after its own; it receives them as one dict, ``run``."""
    return _grouped("run", _run_parameters(ranged))


def degree_options() -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command one plan's degrees and strategy (evaluate's), after its own; it receives them as one
    dict, ``degrees``, by ParallelDims's names (``mbs`` for the microbatch size)."""
    specs = (
        ("tp", int, degree("--tp")),
        ("pp", int, degree("--pp")),
        ("dp", int, degree("--dp", "data-parallel replicas, not counting ep (Megatron-LM's count is converted)")),
        ("cp", int, degree("--cp")),
        ("ep", int, degree("--ep", EP_HELP)),
        ("etp", int | None, ETP),
        ("sp", bool, SP),
        ("zero", int, ZERO),
        ("recompute", Recompute, RECOMPUTE),
        ("mbs", int, MBS),
        ("schedule", Schedule, SCHEDULE),
        ("virtual_stages", int | None, VIRTUAL_STAGES),
        ("layers_per_stage", str | None, LAYERS_PER_STAGE),
    )
    return _grouped(
        "degrees",
        [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=o, annotation=k) for n, k, o in specs],
    )
