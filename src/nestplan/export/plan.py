"""What an exporter reads: the plan JSON (schema ``nestplan.plan/1``) and the model and cluster it is for.

Exports work from the plan object of DESIGN.md section 6, whether it comes from a
fresh search or from a saved file, so both paths share one reader. Every field an
exporter needs is checked here, once; a plan of another schema version, or one with
a missing or malformed field, is a ``ConfigError`` naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from nestplan.errors import ConfigError
from nestplan.model.spec import ModelSpec
from nestplan.report.plan_json import SCHEMA
from nestplan.strategy.dims import AXES
from nestplan.strategy.enums import Recompute, Schedule

_PARALLEL_INTS = ("tp", "pp", "dp", "cp", "ep", "zero_stage", "micro_batch_size", "num_microbatches",
                  "virtual_stages")


@dataclass(frozen=True)
class PlanSettings:
    """The plan's choices and prediction, as read from its JSON object."""

    model: str
    cluster: str
    devices: int
    global_batch_size: int
    seq_len: int
    dtype: str
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
class JobExtras:
    """Job choices the plan JSON does not carry (defaults: those of ``nestplan.Job``)."""

    optimizer: str = "adam"
    grad_dtype: str = "fp32"
    flash_attention: bool = True


@dataclass(frozen=True)
class ExportInput:
    """Everything an exporter needs: the plan, the model's shape, the cluster's node layout."""

    plan: PlanSettings
    model: ModelSpec
    level_names: tuple[str, ...]
    level_unit_devices: tuple[int, ...]   # devices per unit of each level (node first)
    extras: JobExtras = JobExtras()
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


def _int(data: Mapping[str, Any], key: str, where: str) -> int:
    value = _field(data, key, where)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"plan JSON field '{where}{key}' must be a non-negative integer, got {value!r}",
                          field=f"{where}{key}", value=value, limit=">= 0")
    return value


def _float(data: Mapping[str, Any], key: str, where: str) -> float:
    value = _field(data, key, where)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ConfigError(f"plan JSON field '{where}{key}' must be a number, got {value!r}",
                          field=f"{where}{key}", value=value)
    return float(value)


def _choice(enum: type, value: Any, field: str) -> Any:
    try:
        return enum(value)
    except ValueError:
        allowed = [e.value for e in enum]
        raise ConfigError(f"plan JSON field '{field}' is '{value}'; allowed: {', '.join(allowed)}",
                          field=field, value=value, limit=allowed) from None


def check_schema(data: Any) -> None:
    """One clear line for anything that is not a ``nestplan.plan/1`` object."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"a plan file must hold a JSON object of schema {SCHEMA}, got {type(data).__name__}",
                          field="schema", limit=SCHEMA)
    schema = data.get("schema")
    if schema != SCHEMA:
        raise ConfigError(f"plan JSON schema is {schema!r}; this nestplan exports {SCHEMA} plans only",
                          field="schema", value=schema, limit=SCHEMA)


def read_plan(data: Mapping[str, Any]) -> PlanSettings:
    """The settings of a plan JSON object (schema checked first)."""
    check_schema(data)
    job, par, pred = (_field(data, k, "") for k in ("job", "parallel", "prediction"))
    placement = _field(data, "placement", "")
    ints = {k: _int(par, k, "parallel.") for k in _PARALLEL_INTS}
    layers = _field(par, "layers_per_stage", "parallel.")
    if not isinstance(layers, list) or len(layers) != ints["pp"] or not all(
            isinstance(n, int) and n >= 1 for n in layers):
        raise ConfigError(f"plan JSON field 'parallel.layers_per_stage' must list pp = {ints['pp']} positive "
                          f"layer counts, got {layers!r}", field="parallel.layers_per_stage", value=layers)
    order = tuple(_field(placement, "axis_order", "placement."))
    if sorted(order) != sorted(AXES):
        raise ConfigError(f"plan JSON field 'placement.axis_order' must be a permutation of {','.join(AXES)}, "
                          f"got {order!r}", field="placement.axis_order", value=order, limit=AXES)
    settings = PlanSettings(
        model=str(_field(data, "model", "")), cluster=str(_field(data, "cluster", "")),
        devices=_int(data, "devices_used", ""), global_batch_size=_int(job, "global_batch_size", "job."),
        seq_len=_int(job, "seq_len", "job."), dtype=str(_field(job, "dtype", "job.")),
        tp=ints["tp"], pp=ints["pp"], dp=ints["dp"], cp=ints["cp"], ep=ints["ep"],
        sp=bool(_field(par, "sp", "parallel.")), zero=ints["zero_stage"],
        recompute=_choice(Recompute, _field(par, "recompute", "parallel."), "parallel.recompute"),
        micro_batch_size=ints["micro_batch_size"], num_microbatches=ints["num_microbatches"],
        schedule=_choice(Schedule, _field(par, "schedule", "parallel."), "parallel.schedule"),
        virtual_stages=ints["virtual_stages"], layers_per_stage=tuple(layers), axis_order=order,
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
    if min(p.tp, p.pp, p.dp, p.cp, p.ep, p.micro_batch_size, p.num_microbatches, p.virtual_stages) < 1:
        raise ConfigError("plan JSON parallel degrees, microbatch size and count must be >= 1",
                          field="parallel", limit=">= 1")
    if product != p.devices:
        raise ConfigError(f"plan JSON degrees multiply to tp x cp x ep x pp x dp = {product}, "
                          f"not devices_used = {p.devices}", field="devices_used", value=p.devices, limit=product)
    per_step = p.batch_replicas * p.micro_batch_size * p.num_microbatches
    if per_step != p.global_batch_size:
        raise ConfigError(f"plan JSON batch: dp x ep x micro-batch size x microbatches = {per_step}, "
                          f"not the global batch size {p.global_batch_size}",
                          field="job.global_batch_size", value=p.global_batch_size, limit=per_step)
    if not 0 <= p.zero <= 3:
        raise ConfigError(f"plan JSON ZeRO stage {p.zero} is not 0-3", field="parallel.zero_stage", value=p.zero,
                          limit="0-3")
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
