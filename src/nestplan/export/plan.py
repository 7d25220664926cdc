"""What an exporter reads: the plan JSON (schema ``nestplan.plan/1``) and the model and cluster it is for.

Exports work from the plan object (docs/formats.md, "Plan JSON"), whether it comes from a
fresh search or from a saved file, so both paths share one reader. Every field an
exporter needs is checked here, once: names without control characters, integers
(not bools or floats) within bounds, categorical settings among their allowed values.
A plan of another schema version, or one with a missing or malformed field, is a
``ConfigError`` naming the field and what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nestplan.errors import ConfigError, brief
from nestplan.inputs import check_string
from nestplan.job import Optimizer
from nestplan.model.spec import ModelSpec
from nestplan.report.plan_json import SCHEMA
from nestplan.strategy.dims import AXES
from nestplan.strategy.enums import Recompute, Schedule
from nestplan.units import DTYPE_BYTES

# The job settings plan files did not always carry, and what exports assumed for them before they did.
UNSAVED_JOB_SETTINGS = {"grad_dtype": "fp32", "optimizer": "adam", "flash_attention": True}
_PARALLEL_INTS = ("tp", "pp", "dp", "cp", "ep", "micro_batch_size", "num_microbatches", "virtual_stages")
MAX_COUNT = 2**24   # the largest count a plan may give (devices, batch, tokens, degrees, layers): 16,777,216


@dataclass(frozen=True)
class PlanSettings:
    """The plan's choices and prediction, as read from its JSON object."""

    model: str
    cluster: str
    devices: int                     # devices the plan uses
    cluster_devices: int             # devices of the cluster it was planned on (devices_total)
    global_batch_size: int
    seq_len: int
    dtype: str
    grad_dtype: str
    optimizer: str                   # a nestplan.job.Optimizer value
    flash_attention: bool
    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    sp: bool
    zero: int
    recompute: Recompute
    micro_batch_size: int
    num_microbatches: int
    schedule: Schedule
    virtual_stages: int
    layers_per_stage: tuple[int, ...]
    axis_order: tuple[str, ...]      # rank grid, fastest-varying axis first
    step_time_s: float
    tokens_per_s: float
    mfu: float
    peak_memory_bytes: float
    memory_capacity_bytes: float

    @property
    def batch_replicas(self) -> int:
        """Ranks of one stage position that read distinct sequences: dp x ep (ep is carved out of dp)."""
        return self.dp * self.ep


@dataclass(frozen=True)
class ExportInput:
    """Everything an exporter needs: the plan, the model's shape, the cluster's node layout."""

    plan: PlanSettings
    model: ModelSpec
    level_names: tuple[str, ...]
    level_unit_devices: tuple[int, ...]   # devices per unit of each level (node first)
    version: str = ""
    alternative: Mapping[str, float] | None = None   # the plan's prediction under the framework's rank order

    @property
    def devices_per_node(self) -> int:
        return self.level_unit_devices[0]

    @property
    def nodes(self) -> int:
        return -(-self.plan.devices // self.devices_per_node)


def _field(data: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(data, Mapping) or key not in data:
        raise ConfigError(f"the plan JSON has no '{where}{key}' field; it is not a complete {SCHEMA} plan",
                          field=f"{where}{key}", limit=SCHEMA)
    return data[key]


def _count(value: Any, field: str, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    """An integer (not a bool, not a float) in ``minimum..maximum``."""
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise ConfigError(f"plan JSON field '{field}' must be an integer in {minimum}..{maximum}, got {brief(value)}",
                          field=field, value=value, limit=f"{minimum}..{maximum}")
    return value


def _int(data: Mapping[str, Any], key: str, where: str, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    return _count(_field(data, key, where), f"{where}{key}", minimum, maximum)


def _float(data: Mapping[str, Any], key: str, where: str) -> float:
    value = _field(data, key, where)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < math.inf:
        raise ConfigError(f"plan JSON field '{where}{key}' must be a finite number >= 0, got {brief(value)}",
                          field=f"{where}{key}", value=value, limit="a finite number >= 0")
    return float(value)


def _bool(data: Mapping[str, Any], key: str, where: str) -> bool:
    value = _field(data, key, where)
    if not isinstance(value, bool):
        raise ConfigError(f"plan JSON field '{where}{key}' must be true or false, got {brief(value)}",
                          field=f"{where}{key}", value=value, limit=[True, False])
    return value


def _choice(data: Mapping[str, Any], key: str, where: str, allowed: Sequence[str]) -> str:
    """A categorical setting: one of ``allowed``."""
    value = _field(data, key, where)
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"plan JSON field '{where}{key}' is {brief(value)}; allowed: {', '.join(allowed)}",
                          field=f"{where}{key}", value=value, limit=list(allowed))
    return value


def _name(data: Mapping[str, Any], key: str) -> str:
    """The model or cluster a plan is for: a non-empty string without control characters."""
    value = _field(data, key, "")
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"plan JSON field '{key}' must be a non-empty string, got {brief(value)}",
                          field=key, value=value, limit="a name or a path")
    return check_string(value, key, "plan JSON")


def _layers(par: Mapping[str, Any], pp: int) -> tuple[int, ...]:
    layers = _field(par, "layers_per_stage", "parallel.")
    if not isinstance(layers, list) or len(layers) != pp:
        raise ConfigError(f"plan JSON field 'parallel.layers_per_stage' must list pp = {pp} layer counts, "
                          f"got {brief(layers)}", field="parallel.layers_per_stage", value=layers, limit=pp)
    return tuple(_count(n, f"parallel.layers_per_stage[{i}]") for i, n in enumerate(layers))


def _axis_order(placement: Mapping[str, Any]) -> tuple[str, ...]:
    order = _field(placement, "axis_order", "placement.")
    if not isinstance(order, list) or not all(isinstance(a, str) for a in order) or sorted(order) != sorted(AXES):
        raise ConfigError(f"plan JSON field 'placement.axis_order' must list each of {', '.join(AXES)} once, "
                          f"got {brief(order)}", field="placement.axis_order", value=order, limit=list(AXES))
    return tuple(order)


def _job_settings(job: Mapping[str, Any]) -> dict[str, Any]:
    """Gradient dtype, optimizer and flash attention, each checked; absent (a plan written before the
    plan JSON carried them): ``UNSAVED_JOB_SETTINGS``."""
    read = {"grad_dtype": lambda: _choice(job, "grad_dtype", "job.", tuple(DTYPE_BYTES)),
            "optimizer": lambda: _choice(job, "optimizer", "job.", [o.value for o in Optimizer]),
            "flash_attention": lambda: _bool(job, "flash_attention", "job.")}
    return {key: value() if key in job else UNSAVED_JOB_SETTINGS[key] for key, value in read.items()}


def check_schema(data: Any) -> None:
    """One clear line for anything that is not a ``nestplan.plan/1`` object, or whose model or
    cluster is not a clean name (checked here, before a caller resolves them)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"a plan file must hold a JSON object of schema {SCHEMA}, got {type(data).__name__}",
                          field="schema", limit=SCHEMA)
    schema = data.get("schema")
    if schema != SCHEMA:
        raise ConfigError(f"plan JSON schema is {brief(schema)}; this nestplan exports {SCHEMA} plans only",
                          field="schema", value=schema, limit=SCHEMA)
    _name(data, "model")
    _name(data, "cluster")


def read_plan(data: Mapping[str, Any]) -> PlanSettings:
    """The settings of a plan JSON object (a parsed file or ``PlanReport.to_dict()``), every field
    checked: its type, its range or allowed values, and the arithmetic between them."""
    check_schema(data)
    job, par, pred = (_field(data, k, "") for k in ("job", "parallel", "prediction"))
    ints = {k: _int(par, k, "parallel.") for k in _PARALLEL_INTS}
    settings = PlanSettings(
        model=data["model"], cluster=data["cluster"],
        devices=_int(data, "devices_used", ""), cluster_devices=_int(data, "devices_total", ""),
        global_batch_size=_int(job, "global_batch_size", "job."),
        seq_len=_int(job, "seq_len", "job."), dtype=_choice(job, "dtype", "job.", tuple(DTYPE_BYTES)),
        **_job_settings(job),
        tp=ints["tp"], pp=ints["pp"], dp=ints["dp"], cp=ints["cp"], ep=ints["ep"],
        sp=_bool(par, "sp", "parallel."), zero=_int(par, "zero_stage", "parallel.", 0, 3),
        recompute=Recompute(_choice(par, "recompute", "parallel.", [e.value for e in Recompute])),
        micro_batch_size=ints["micro_batch_size"], num_microbatches=ints["num_microbatches"],
        schedule=Schedule(_choice(par, "schedule", "parallel.", [e.value for e in Schedule])),
        virtual_stages=ints["virtual_stages"], layers_per_stage=_layers(par, ints["pp"]),
        axis_order=_axis_order(_field(data, "placement", "")),
        step_time_s=_float(pred, "step_time_s", "prediction."),
        tokens_per_s=_float(pred, "tokens_per_s", "prediction."),
        mfu=_float(pred, "mfu", "prediction."),
        peak_memory_bytes=_float(pred, "peak_memory_bytes_per_device", "prediction."),
        memory_capacity_bytes=_float(pred, "memory_capacity_bytes", "prediction."))
    _check_consistent(settings)
    return settings


def _check_consistent(p: PlanSettings) -> None:
    """The batch and device arithmetic an exporter relies on."""
    product = p.tp * p.cp * p.ep * p.pp * p.dp
    if product != p.devices:
        raise ConfigError(f"plan JSON degrees multiply to tp x cp x ep x pp x dp = {product}, "
                          f"not devices_used = {p.devices}", field="devices_used", value=p.devices, limit=product)
    if p.cluster_devices < p.devices:
        raise ConfigError(f"plan JSON devices_total = {p.cluster_devices} is fewer than the devices_used = "
                          f"{p.devices}", field="devices_total", value=p.cluster_devices, limit=f">= {p.devices}")
    per_step = p.batch_replicas * p.micro_batch_size * p.num_microbatches
    if per_step != p.global_batch_size:
        raise ConfigError(f"plan JSON batch: dp x ep x micro-batch size x microbatches = {per_step}, "
                          f"not the global batch size {p.global_batch_size}",
                          field="job.global_batch_size", value=p.global_batch_size, limit=per_step)
    bad = [n for n in p.layers_per_stage if n % p.virtual_stages]
    if bad:
        raise ConfigError(f"plan JSON stage of {bad[0]} layers does not split into {p.virtual_stages} virtual stages",
                          field="parallel.virtual_stages", value=p.virtual_stages, limit=bad[0])


def check_model(p: PlanSettings, model: ModelSpec) -> None:
    """The plan must be for this model's shape."""
    if sum(p.layers_per_stage) != model.num_layers:
        raise ConfigError(f"the plan's stages hold {sum(p.layers_per_stage)} layers but model {model.name} has "
                          f"{model.num_layers}; pass the model the plan was made for",
                          field="model", value=model.name, limit=sum(p.layers_per_stage))
    if p.ep > 1 and not model.is_moe:
        raise ConfigError(f"the plan has ep {p.ep} but model {model.name} is dense", field="model", value=model.name)
