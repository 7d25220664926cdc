"""Reading the plan JSON: the schema check and each section read back into its typed value, the
arithmetic between the fields checked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from nestplan.cluster import Cluster, cluster_from_dict, load_cluster
from nestplan.errors import ConfigError, brief, printable
from nestplan.inputs import check_string
from nestplan.job import Job, Optimizer
from nestplan.model.config import load_model, parse_config
from nestplan.model.spec import ModelSpec
from nestplan.network.graph import MAX_GRAPH_NODES
from nestplan.network.topology import MAX_LEVELS
from nestplan.profile import calibrated_cluster
from nestplan.settings import Framework
from nestplan.plan.fields import (
    bool_field,
    choice_field,
    count_value,
    field_value,
    float_field,
    int_field,
    list_field,
    name_field,
    object_field,
    refusal,
    terms_field,
)
from nestplan.plan.schema import CALIBRATION_RANGE, MAX_COUNT, MAX_STATISTIC, SCHEMA, SCHEMAS, UNSAVED_JOB_SETTINGS
from nestplan.plan.summary import PredictionSummary, StageSummary, frozen
from nestplan.search.stats import SearchStats
from nestplan.settings import RunSettings, Setting, setting_table
from nestplan.strategy.dims import AXES, ParallelDims, layout_problem
from nestplan.strategy.enums import Recompute, Schedule, ZeroStage
from nestplan.units import DTYPE_BYTES


_PARALLEL_INTS = ("tp", "pp", "dp", "cp", "ep", "micro_batch_size", "num_microbatches", "virtual_stages")


def check_schema(data: Any) -> None:
    """One clear line for anything that is not a plan object of a schema this nestplan reads, or
    whose model or cluster is not a clean name."""
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"a plan must be a JSON object of schema {SCHEMA}, got {type(data).__name__}", field="schema", limit=SCHEMA
        )
    schema = data.get("schema")
    if schema not in SCHEMAS:
        raise ConfigError(
            f"plan JSON schema is {brief(schema)}; this nestplan reads {' and '.join(SCHEMAS)} plans",
            field="schema",
            value=schema,
            limit=list(SCHEMAS),
        )
    name_field(data, "model")
    name_field(data, "cluster")


def read_dims(data: Any) -> ParallelDims:
    """The parallel section, its batch arithmetic and its layers per stage checked."""
    par, job = object_field(data, "parallel", ""), object_field(data, "job", "")
    ints = {k: int_field(par, k, "parallel.") for k in _PARALLEL_INTS}
    layers = _read_layers(par, ints["pp"], ints["virtual_stages"])
    product = ints["tp"] * ints["cp"] * ints["ep"] * ints["pp"] * ints["dp"]
    used = int_field(data, "devices_used", "")
    if product != used:
        raise ConfigError(
            f"plan JSON degrees multiply to tp x cp x ep x pp x dp = {product}, not devices_used = {used}",
            field="devices_used",
            value=used,
            limit=product,
        )
    batch = int_field(job, "global_batch_size", "job.")
    per_step = ints["dp"] * ints["ep"] * ints["micro_batch_size"] * ints["num_microbatches"]
    if per_step != batch:
        raise ConfigError(
            f"plan JSON batch: dp x ep x micro-batch size x microbatches = {per_step}, "
            f"not the global batch size {batch}",
            field="job.global_batch_size",
            value=batch,
            limit=per_step,
        )
    bad = [n for n in layers if n % ints["virtual_stages"]] if len(layers) == ints["pp"] else []
    if bad:
        raise ConfigError(
            f"plan JSON stage of {bad[0]} layers does not split into {ints['virtual_stages']} virtual stages",
            field="parallel.virtual_stages",
            value=ints["virtual_stages"],
            limit=bad[0],
        )
    # etp: written since parallel folding; a plan without it splits its experts over tp
    etp = int_field(par, "etp", "parallel.", 1, ints["tp"]) if "etp" in par else None
    if etp is not None and "expert_parallel" in par:
        folded = ints["ep"] * ints["tp"] // etp if ints["tp"] % etp == 0 else None
        if int_field(par, "expert_parallel", "parallel.") != folded:
            raise ConfigError(
                f"plan JSON parallel.expert_parallel must be ep x tp / etp = {ints['ep']} x "
                f"{ints['tp']} / {etp}, got {brief(par['expert_parallel'])}",
                field="parallel.expert_parallel",
                value=par["expert_parallel"],
                limit=folded,
            )
    return ParallelDims(
        tp=ints["tp"],
        pp=ints["pp"],
        dp=ints["dp"],
        cp=ints["cp"],
        ep=ints["ep"],
        etp=etp,
        sp=bool_field(par, "sp", "parallel."),
        zero=ZeroStage(int_field(par, "zero_stage", "parallel.", 0, 3)),
        recompute=Recompute(choice_field(par, "recompute", "parallel.", [e.value for e in Recompute])),
        micro_batch_size=ints["micro_batch_size"],
        schedule=Schedule(choice_field(par, "schedule", "parallel.", [e.value for e in Schedule])),
        virtual_stages=ints["virtual_stages"],
        layers_per_stage=layers,
    )


def _read_layers(par: Mapping[str, Any], pp: int, virtual_stages: int) -> tuple[int, ...]:
    """``parallel.layers_per_stage``: pp counts, or with v > 1 pp x v counts (virtual stages in model
    order, the first and last of which may be 0: ``strategy.dims.layout_problem``)."""
    lengths = (pp, pp * virtual_stages) if virtual_stages > 1 else (pp,)
    given = list_field(par, "layers_per_stage", "parallel.", maximum=max(lengths))
    layers = tuple(count_value(n, f"parallel.layers_per_stage[{i}]", 0) for i, n in enumerate(given))
    problem = layout_problem(layers, pp, virtual_stages)
    if problem is not None:
        raise ConfigError(
            f"plan JSON field 'parallel.layers_per_stage' {problem}",
            field="parallel.layers_per_stage",
            value=len(layers),
            limit=problem,
        )
    return layers


def read_job(data: Any, version2: bool) -> Job:
    """What is trained and every run setting of the field table; a /1 plan written before the job's
    gradient dtype, optimizer and flash setting were recorded reads them as ``UNSAVED_JOB_SETTINGS``;
    a setting recorded later than its plan (absent) takes its default."""
    job = object_field(data, "job", "")
    unsaved = {key: value for key, value in UNSAVED_JOB_SETTINGS.items() if not version2 and key not in job}
    optimizer = unsaved.get("optimizer") or choice_field(job, "optimizer", "job.", [o.value for o in Optimizer])
    settings = {
        entry.name: unsaved[entry.name] if entry.name in unsaved else _read_setting(job, entry)
        for entry in setting_table()
        if entry.name in job or entry.name in unsaved or (version2 and entry.name in UNSAVED_JOB_SETTINGS)
    }
    return Job(
        global_batch_size=int_field(job, "global_batch_size", "job."),
        seq_len=int_field(job, "seq_len", "job."),
        dtype=choice_field(job, "dtype", "job.", tuple(DTYPE_BYTES)),
        optimizer=optimizer,
        settings=RunSettings.from_mapping(settings),
    )


def _read_setting(job: Mapping[str, Any], entry: Setting) -> Any:
    """One run setting of the plan's job object, read by its kind in the field table."""
    if entry.optional and job.get(entry.name, entry.default) is None:
        return None
    if entry.kind is bool:
        return bool_field(job, entry.name, "job.")
    if entry.kind is int:
        low, high = entry.bounds or (1, MAX_COUNT)
        return int_field(job, entry.name, "job.", int(low), int(high))
    if entry.kind is float:
        return float_field(job, entry.name, "job.")
    return choice_field(job, entry.name, "job.", entry.choices)


def read_axis_order(data: Any) -> tuple[str, ...]:
    placement = object_field(data, "placement", "")
    order = field_value(placement, "axis_order", "placement.")
    if not isinstance(order, list) or not all(isinstance(a, str) for a in order) or sorted(order) != sorted(AXES):
        raise ConfigError(
            f"plan JSON field 'placement.axis_order' must list each of {', '.join(AXES)} once, got {brief(order)}",
            field="placement.axis_order",
            value=order,
            limit=list(AXES),
        )
    return tuple(order)


def _calibration(data: Any) -> dict[str, float]:
    table = object_field(data, "model_calibration", "")
    low, high = CALIBRATION_RANGE
    out = {}
    for key in ("traced_flops_scale", "traced_activation_scale"):
        value = float_field(table, key, "model_calibration.")
        if not low <= value <= high:
            raise refusal(f"model_calibration.{key}", f"in [{low:g}, {high:g}]", value, f"[{low:g}, {high:g}]")
        out[key] = value
    return out


def read_model(data: Any, given: str | ModelSpec | None, version2: bool) -> ModelSpec:
    """The model given, else the plan's config (/2) or its name (/1)."""
    if isinstance(given, ModelSpec):
        return given
    if given is not None:
        return load_model(given)
    if not version2:
        return load_model(data["model"])
    config = object_field(data, "model_config", "")
    return replace(parse_config(dict(config), data["model"]), **_calibration(data))


def _device_order(data: Any, devices: int) -> tuple[int, ...] | None:
    """The graph's device of every rank (a cluster derived from a graph, the only one that has the
    field), else None."""
    if "device_order" not in data:
        return None
    order = [
        count_value(d, f"device_order[{i}]", 0, MAX_GRAPH_NODES - 1)
        for i, d in enumerate(list_field(data, "device_order", "", length=devices))
    ]
    if len(set(order)) != len(order):
        raise ConfigError(
            "plan JSON field 'device_order' names a device twice", field="device_order", limit="distinct device ids"
        )
    return tuple(order)


def read_cluster(
    data: Any, given: str | Cluster | None, devices_total: int, version2: bool, framework: Framework
) -> Cluster:
    """The cluster given (a name loaded with ``devices_total`` devices), else the plan's definition
    (/2) or its name (/1); one loaded by name as ``plan`` and ``evaluate`` calibrate it, with the catalog's
    profile for its accelerator and ``framework`` (nestplan.profile), where it has one."""
    if isinstance(given, Cluster):
        return given
    if given is not None or not version2:
        return calibrated_cluster(load_cluster(given or data["cluster"], devices_total), framework)
    cluster = cluster_from_dict(object_field(data, "cluster_definition", ""), origin="in plan JSON cluster_definition")
    if cluster.name != data["cluster"]:
        raise ConfigError(
            f"plan JSON field 'cluster' is '{printable(data['cluster'])}' but its cluster_definition "
            f"names '{printable(cluster.name)}'",
            field="cluster",
            value=printable(data["cluster"]),
            limit=printable(cluster.name),
        )
    if cluster.devices != devices_total:
        raise ConfigError(
            f"plan JSON devices_total = {devices_total} is not the {cluster.devices} devices of its cluster_definition",
            field="devices_total",
            value=devices_total,
            limit=cluster.devices,
        )
    return replace(cluster, device_order=_device_order(data, cluster.devices))


def _read_stage(stage: Any, where: str) -> StageSummary:
    layers = list_field(stage, "layers", where, length=2)
    return StageSummary(
        first_layer=count_value(layers[0], f"{where}layers[0]", 0),
        last_layer=count_value(layers[1], f"{where}layers[1]", 0),
        has_embedding=bool_field(stage, "embedding", where),
        has_head=bool_field(stage, "head", where),
        devices=int_field(stage, "devices", where),
        forward_s=float_field(stage, "forward_s", where),
        backward_s=float_field(stage, "backward_s", where),
        cycle_s=float_field(stage, "time_s", where),
        memory_bytes=float_field(stage, "memory_bytes", where),
        memory_breakdown_bytes=terms_field(stage, "memory_breakdown_bytes", where),
    )


def _read_stages(data: Any, dims: ParallelDims) -> tuple[StageSummary, ...]:
    """One entry per stage, holding the blocks ``parallel.layers_per_stage`` gives it on tp x cp x ep devices."""
    stages = tuple(
        _read_stage(s, f"stages[{i}].") for i, s in enumerate(list_field(data, "stages", "", length=dims.pp))
    )
    first = 0
    per_stage = dims.stage_layers(sum(dims.layers_per_stage or ()))  # all of a stage's chunks together
    for i, (stage, count) in enumerate(zip(stages, per_stage)):
        if (stage.first_layer, stage.last_layer) != (first, first + count - 1):
            raise ConfigError(
                f"plan JSON field 'stages[{i}].layers' is [{stage.first_layer}, {stage.last_layer}]; "
                f"parallel.layers_per_stage gives [{first}, {first + count - 1}]",
                field=f"stages[{i}].layers",
                value=[stage.first_layer, stage.last_layer],
                limit=[first, first + count - 1],
            )
        if stage.devices != dims.stage_devices:
            raise ConfigError(
                f"plan JSON field 'stages[{i}].devices' is {stage.devices}, not tp x cp x ep = {dims.stage_devices}",
                field=f"stages[{i}].devices",
                value=stage.devices,
                limit=dims.stage_devices,
            )
        first += count
    return stages


def _level_names(placement: Mapping[str, Any]) -> list[str]:
    names = list_field(placement, "level_names", "placement.", maximum=MAX_LEVELS)
    if not names:
        raise ConfigError(
            "plan JSON field 'placement.level_names' lists no level",
            field="placement.level_names",
            value=names,
            limit=f"1..{MAX_LEVELS} names",
        )
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise refusal(f"placement.level_names[{i}]", "a string", name, "a level name")
        check_string(name, f"placement.level_names[{i}]", "plan JSON")
    return names


def read_predicted(data: Any, dims: ParallelDims) -> PredictionSummary:
    pred, placement = object_field(data, "prediction", ""), object_field(data, "placement", "")
    spans = object_field(placement, "levels_spanned", "placement.")
    if sorted(spans) != sorted(AXES):
        raise ConfigError(
            f"plan JSON field 'placement.levels_spanned' must give a level for each of "
            f"{', '.join(AXES)}, got {brief(sorted(spans))}",
            field="placement.levels_spanned",
            value=sorted(spans),
            limit=list(AXES),
        )
    top = len(_level_names(placement)) - 1  # levels are indices into placement.level_names

    def level(value: Any, field: str) -> int:
        return count_value(value, field, 0, top)

    boundaries = list_field(placement, "pp_boundary_levels", "placement.", length=dims.pp - 1)
    return PredictionSummary(
        step_time_s=float_field(pred, "step_time_s", "prediction."),
        breakdown_s=terms_field(pred, "breakdown_s", "prediction."),
        tokens_per_s=float_field(pred, "tokens_per_s", "prediction."),
        model_tflops_per_device=float_field(pred, "model_tflops_per_device", "prediction."),
        hardware_tflops_per_device=float_field(pred, "hardware_tflops_per_device", "prediction."),
        mfu=float_field(pred, "mfu", "prediction."),
        peak_memory_bytes_per_device=float_field(pred, "peak_memory_bytes_per_device", "prediction."),
        memory_breakdown_bytes=terms_field(pred, "memory_breakdown_bytes", "prediction."),
        memory_capacity_bytes=float_field(pred, "memory_capacity_bytes", "prediction."),
        fits=bool_field(pred, "fits", "prediction."),
        memory_excess_bytes=float_field(pred, "memory_excess_bytes", "prediction."),
        stages=_read_stages(data, dims),
        levels_spanned=frozen({str(axis): level(spans[axis], f"placement.levels_spanned.{axis}") for axis in AXES}),
        pp_boundary_levels=tuple(level(v, f"placement.pp_boundary_levels[{i}]") for i, v in enumerate(boundaries)),
    )


def read_search(data: Any) -> SearchStats:
    search = object_field(data, "search", "")
    return SearchStats(
        float_field(search, "solve_time_s", "search."),
        int_field(search, "candidates", "search.", 0, MAX_STATISTIC),
        int_field(search, "pruned_memory", "search.", 0, MAX_STATISTIC),
    )
