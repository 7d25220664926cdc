"""The typed plan: what a search or an evaluation chose, for which model, cluster and job, and what
was predicted; it writes and reads the plan JSON (schema ``nestplan.plan/2``; every field:
docs/formats.md, "Plan JSON").

A :class:`Plan` holds the ``ParallelDims`` (degrees, layers per stage, schedule, virtual stages,
ZeRO, recomputation, micro-batch size), the rank grid's axis order, the ``Job`` with every
setting, the ``ModelSpec`` and the ``Cluster`` it was planned on, and the prediction's summary
(what the JSON carries: step time and its breakdown, throughput, memory, the stages, the levels
the groups span). ``Plan.from_dict(p.to_dict()) == p``: reading a plan file re-evaluates nothing.

The JSON carries the model as a Hugging Face ``config.json`` object (``model_config``, written by
``nestplan.model.config.config_dict``, read back by its inverse ``parse_config``) and the cluster
as a cluster-file table (``cluster_definition``, written by ``nestplan.cluster.cluster_to_dict``,
read back by ``cluster_from_dict``), so that the same checks apply as to those files. Plans of
schema ``nestplan.plan/1`` carry neither: their model and cluster are resolved by name. Every
other field is checked here: names without control characters, integers (not bools or floats)
within bounds, finite numbers, categorical settings among their allowed values, and the
arithmetic between them; a failure is one ``ConfigError`` naming the field and what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from nestplan.cluster import Cluster, cluster_from_dict, cluster_to_dict, load_cluster
from nestplan.cost.prediction import Prediction
from nestplan.errors import ConfigError, brief, printable
from nestplan.inputs import check_name, check_string
from nestplan.job import Job, Optimizer, check_context
from nestplan.model.config import config_dict, load_model, parse_config
from nestplan.model.layers import active_params, total_params
from nestplan.model.spec import ModelSpec
from nestplan.network.graph import MAX_GRAPH_NODES
from nestplan.network.topology import MAX_LEVELS
from nestplan.settings import RunSettings, Setting, setting_table
from nestplan.strategy.dims import AXES, ParallelDims, layout_problem
from nestplan.strategy.legality import check_against_model
from nestplan.search.stats import SearchStats
from nestplan.strategy.enums import Recompute, Schedule, ZeroStage
from nestplan.units import DTYPE_BYTES

SCHEMA = "nestplan.plan/2"
SCHEMA_V1 = "nestplan.plan/1"  # still read: no model config, no cluster definition
SCHEMAS = (SCHEMA, SCHEMA_V1)
# The job settings /1 plan files did not always carry, and what exports assumed for them before they did.
UNSAVED_JOB_SETTINGS = {"grad_dtype": "fp32", "optimizer": "adam", "flash_attention": True}
MAX_COUNT = 2**24  # the largest count a plan may give (devices, batch, tokens, degrees, layers): 16,777,216
MAX_STATISTIC = 2**53  # search statistics (splits costed, groups pruned)
MAX_TERMS = 64  # entries of a breakdown (step-time or memory terms)
CALIBRATION_RANGE = (1e-3, 1e3)  # a traced/closed-form ratio (nestplan plan --trace gives 0.9 to 1.1)
_PARALLEL_INTS = ("tp", "pp", "dp", "cp", "ep", "micro_batch_size", "num_microbatches", "virtual_stages")


# ---------------------------------------------------------------------------------------------
# the plan


@dataclass(frozen=True)
class StageSummary:
    """One pipeline stage of one replica, per device and per microbatch."""

    first_layer: int  # transformer blocks [first_layer, last_layer], 0-based
    last_layer: int
    has_embedding: bool
    has_head: bool
    devices: int  # tp x cp x ep
    forward_s: float
    backward_s: float
    cycle_s: float  # forward + backward
    memory_bytes: float  # peak per device
    memory_breakdown_bytes: Mapping[str, float]


@dataclass(frozen=True)
class PredictionSummary:
    """What was predicted for the plan, as the plan JSON carries it."""

    step_time_s: float
    breakdown_s: Mapping[str, float]
    tokens_per_s: float
    model_tflops_per_device: float
    hardware_tflops_per_device: float
    mfu: float
    peak_memory_bytes_per_device: float
    memory_breakdown_bytes: Mapping[str, float]
    memory_capacity_bytes: float
    fits: bool
    memory_excess_bytes: float
    stages: tuple[StageSummary, ...]
    levels_spanned: Mapping[str, int]  # axis -> network level its widest group spans
    pp_boundary_levels: tuple[int, ...]  # level of the link between stage i and i + 1

    @classmethod
    def from_prediction(cls, pred: Prediction) -> PredictionSummary:
        stages = tuple(
            StageSummary(
                s.first_layer,
                s.last_layer,
                s.has_embedding,
                s.has_head,
                s.devices,
                s.forward_s,
                s.backward_s,
                s.cycle_s,
                s.peak_memory_bytes,
                _frozen(s.memory_bytes),
            )
            for s in pred.stages
        )
        return cls(
            pred.step_time_s,
            _frozen(pred.breakdown_s),
            pred.tokens_per_s,
            pred.model_tflops_per_device,
            pred.hardware_tflops_per_device,
            pred.mfu,
            pred.peak_memory_bytes_per_device,
            _frozen(pred.memory_breakdown_bytes),
            pred.memory_capacity_bytes,
            pred.fits,
            pred.memory_excess_bytes,
            stages,
            _frozen({str(axis): level for axis, level in pred.placement.levels_spanned().items()}),
            tuple(pred.placement.pp_boundary_levels),
        )


@dataclass(frozen=True)
class Plan:
    """A plan with everything it was made for. ``dims.layers_per_stage`` is always given.

    ``prediction`` is the evaluator's own object where the plan was evaluated in this process
    (plots draw its schedule); it is not part of the plan's value and not written.
    """

    model: ModelSpec
    cluster: Cluster
    job: Job
    dims: ParallelDims
    axis_order: tuple[str, ...]  # rank grid, fastest-varying axis first
    predicted: PredictionSummary
    search: SearchStats
    prediction: Prediction | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        assert self.dims.layers_per_stage is not None, "a plan states its layers per stage"
        _check_model(self.dims, self.model)
        check_context(self.model, self.job.seq_len)
        check_against_model(self.dims, self.model, self.job.seq_len)
        self.dims.num_microbatches(self.job.global_batch_size)
        if self.cluster.devices < self.devices_used:
            raise ConfigError(
                f"the plan uses {self.devices_used} devices but cluster {printable(self.cluster.name)} "
                f"has {self.cluster.devices}",
                field="cluster",
                value=printable(self.cluster.name),
                limit=self.devices_used,
            )

    @classmethod
    def from_prediction(
        cls, pred: Prediction, model: ModelSpec, cluster: Cluster, job: Job, search: SearchStats
    ) -> Plan:
        """The plan ``pred`` (the evaluator's prediction of it on ``cluster``) was made for."""
        layers = pred.plan.layers_per_stage or tuple(s.last_layer - s.first_layer + 1 for s in pred.stages)
        return cls(
            model,
            cluster,
            job,
            replace(pred.plan, layers_per_stage=layers),
            tuple(str(axis) for axis in pred.placement.axis_order),
            PredictionSummary.from_prediction(pred),
            search,
            pred,
        )

    @property
    def devices_used(self) -> int:
        return self.dims.devices

    @property
    def num_microbatches(self) -> int:
        """Microbatches per replica per step."""
        return self.dims.num_microbatches(self.job.global_batch_size)

    @property
    def level_names(self) -> tuple[str, ...]:
        return tuple(lv.name for lv in self.cluster.topology.levels)

    def to_dict(self) -> dict[str, Any]:
        """The plan JSON object, schema ``nestplan.plan/2``."""
        order = self.cluster.device_order
        return {
            "schema": SCHEMA,
            "model": self.model.name,
            "model_params": int(total_params(self.model)),
            "model_active_params": int(active_params(self.model)),
            "cluster": self.cluster.name,
            "devices_total": self.cluster.devices,
            **sections(self.dims, self.axis_order, self.job, self.predicted, self.level_names, self.search),
            "model_config": config_dict(self.model),
            "model_calibration": {
                "traced_flops_scale": self.model.traced_flops_scale,
                "traced_activation_scale": self.model.traced_activation_scale,
            },
            "cluster_definition": cluster_to_dict(self.cluster),
            **({} if order is None else {"device_order": list(order)}),
        }

    @classmethod
    def from_dict(
        cls, data: Any, *, model: str | ModelSpec | None = None, cluster: str | Cluster | None = None
    ) -> Plan:
        """The plan of a plan JSON object (schema /2, or /1), every field checked.

        ``model`` and ``cluster`` replace the plan's own (needed for a /1 plan whose model or
        cluster is not in the catalog); a cluster named is loaded with the plan's ``devices_total``,
        a ``Cluster`` is used as it is."""
        check_schema(data)
        version2 = data["schema"] == SCHEMA
        dims, job, axis_order = _read_dims(data), _read_job(data, version2), _read_axis_order(data)
        spec = _read_model(data, model, version2)
        devices_total = _int(data, "devices_total", "")
        if devices_total < dims.devices:
            raise ConfigError(
                f"plan JSON devices_total = {devices_total} is fewer than the devices_used = {dims.devices}",
                field="devices_total",
                value=devices_total,
                limit=f">= {dims.devices}",
            )
        cl = _read_cluster(data, cluster, devices_total, version2)
        return cls(spec, cl, job, dims, axis_order, _read_predicted(data, dims), _read_search(data))


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


def _check_model(dims: ParallelDims, model: ModelSpec) -> None:
    """The plan's stages must hold the model's layers; ep needs experts."""
    layers = sum(dims.layers_per_stage or ())
    if layers != model.num_layers:
        raise ConfigError(
            f"the plan's stages hold {layers} layers but model {printable(model.name)} has "
            f"{model.num_layers}; pass the model the plan was made for",
            field="model",
            value=printable(model.name),
            limit=layers,
        )
    if dims.ep > 1 and not model.is_moe:
        raise ConfigError(
            f"the plan has ep {dims.ep} but model {printable(model.name)} is dense",
            field="model",
            value=printable(model.name),
        )


# ---------------------------------------------------------------------------------------------
# writing


def sections(
    dims: ParallelDims,
    axis_order: Sequence[str],
    job: Job,
    predicted: PredictionSummary,
    level_names: Sequence[str],
    search: SearchStats,
) -> dict[str, Any]:
    """The fields both schemas share after ``devices_total``: devices_used, job, parallel, stages,
    placement, prediction, search."""
    p = predicted
    return {
        "devices_used": dims.devices,
        "job": job.to_dict(),
        "parallel": {
            "tp": dims.tp,
            "pp": dims.pp,
            "dp": dims.dp,
            "cp": dims.cp,
            "ep": dims.ep,
            "sp": dims.sp_active,
            "etp": dims.expert_tp,
            "expert_parallel": dims.expert_parallel,
            "zero_stage": int(dims.zero),
            "recompute": dims.recompute.value,
            "micro_batch_size": dims.micro_batch_size,
            "num_microbatches": dims.num_microbatches(job.global_batch_size),
            "schedule": dims.schedule.value,
            "virtual_stages": dims.virtual_stages,
            "layers_per_stage": list(dims.layers_per_stage or ()),
        },
        "stages": [
            {
                "layers": [s.first_layer, s.last_layer],
                "embedding": s.has_embedding,
                "head": s.has_head,
                "devices": s.devices,
                "time_s": s.cycle_s,
                "forward_s": s.forward_s,
                "backward_s": s.backward_s,
                "memory_bytes": s.memory_bytes,
                "memory_breakdown_bytes": dict(s.memory_breakdown_bytes),
            }
            for s in p.stages
        ],
        "placement": {
            "axis_order": [str(a) for a in axis_order],
            "levels_spanned": dict(p.levels_spanned),
            "level_names": list(level_names),
            "pp_boundary_levels": list(p.pp_boundary_levels),
        },
        "prediction": {
            "step_time_s": p.step_time_s,
            "breakdown_s": dict(p.breakdown_s),
            "tokens_per_s": p.tokens_per_s,
            "model_tflops_per_device": p.model_tflops_per_device,
            "hardware_tflops_per_device": p.hardware_tflops_per_device,
            "mfu": p.mfu,
            "peak_memory_bytes_per_device": p.peak_memory_bytes_per_device,
            "memory_breakdown_bytes": dict(p.memory_breakdown_bytes),
            "memory_capacity_bytes": p.memory_capacity_bytes,
            "fits": p.fits,
            "memory_excess_bytes": p.memory_excess_bytes,
        },
        "search": {
            "solve_time_s": search.solve_time_s,
            "candidates": search.candidates,
            "pruned_memory": search.pruned_memory,
        },
    }


# ---------------------------------------------------------------------------------------------
# reading: fields


def _field(data: Any, key: str, where: str) -> Any:
    if not isinstance(data, Mapping) or key not in data:
        raise ConfigError(
            f"the plan JSON has no '{where}{key}' field; it is not a complete plan",
            field=f"{where}{key}",
            limit=" or ".join(SCHEMAS),
        )
    return data[key]


def _count(value: Any, field: str, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    """An integer (not a bool, not a float) in ``minimum..maximum``."""
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise ConfigError(
            f"plan JSON field '{field}' must be an integer in {minimum}..{maximum}, got {brief(value)}",
            field=field,
            value=value,
            limit=f"{minimum}..{maximum}",
        )
    return value


def _int(data: Any, key: str, where: str, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    return _count(_field(data, key, where), f"{where}{key}", minimum, maximum)


def _number(value: Any, field: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < math.inf:
        raise ConfigError(
            f"plan JSON field '{field}' must be a finite number >= 0, got {brief(value)}",
            field=field,
            value=value,
            limit="a finite number >= 0",
        )
    return float(value)


def _float(data: Any, key: str, where: str) -> float:
    return _number(_field(data, key, where), f"{where}{key}")


def _bool(data: Any, key: str, where: str) -> bool:
    value = _field(data, key, where)
    if not isinstance(value, bool):
        raise ConfigError(
            f"plan JSON field '{where}{key}' must be true or false, got {brief(value)}",
            field=f"{where}{key}",
            value=value,
            limit=[True, False],
        )
    return value


def _choice(data: Any, key: str, where: str, allowed: Sequence[str]) -> str:
    """A categorical setting: one of ``allowed``."""
    value = _field(data, key, where)
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(
            f"plan JSON field '{where}{key}' is {brief(value)}; allowed: {', '.join(allowed)}",
            field=f"{where}{key}",
            value=value,
            limit=list(allowed),
        )
    return value


def _list(data: Any, key: str, where: str, length: int | None = None, maximum: int = MAX_COUNT) -> list[Any]:
    """A list of ``length`` entries (any length up to ``maximum`` when None)."""
    value = _field(data, key, where)
    if not isinstance(value, list) or (len(value) != length if length is not None else len(value) > maximum):
        wanted = f"{length} entries" if length is not None else f"at most {maximum} entries"
        raise ConfigError(
            f"plan JSON field '{where}{key}' must be a list of {wanted}, got {brief(value)}",
            field=f"{where}{key}",
            value=value,
            limit=wanted,
        )
    return value


def _object(data: Any, key: str, where: str) -> Mapping[str, Any]:
    value = _field(data, key, where)
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"plan JSON field '{where}{key}' must be an object, got {brief(value)}",
            field=f"{where}{key}",
            value=value,
            limit="an object",
        )
    return value


def _terms(data: Any, key: str, where: str) -> Mapping[str, float]:
    """A breakdown: at most ``MAX_TERMS`` term names (plain names), each a finite number >= 0."""
    terms = _object(data, key, where)
    if len(terms) > MAX_TERMS:
        raise ConfigError(
            f"plan JSON field '{where}{key}' has {len(terms)} terms; at most {MAX_TERMS} allowed",
            field=f"{where}{key}",
            value=len(terms),
            limit=MAX_TERMS,
        )
    return _frozen(
        {
            check_name(term, f"{where}{key} term", "plan JSON"): _number(value, f"{where}{key}.{term}")
            for term, value in terms.items()
        }
    )


def _name(data: Any, key: str) -> str:
    """The model or cluster a plan is for: a non-empty string without control characters."""
    value = _field(data, key, "")
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f"plan JSON field '{key}' must be a non-empty string, got {brief(value)}",
            field=key,
            value=value,
            limit="a name or a path",
        )
    return check_string(value, key, "plan JSON")


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
    _name(data, "model")
    _name(data, "cluster")


# ---------------------------------------------------------------------------------------------
# reading: sections


def _read_dims(data: Any) -> ParallelDims:
    """The parallel section, its batch arithmetic and its layers per stage checked."""
    par, job = _object(data, "parallel", ""), _object(data, "job", "")
    ints = {k: _int(par, k, "parallel.") for k in _PARALLEL_INTS}
    layers = _read_layers(par, ints["pp"], ints["virtual_stages"])
    product = ints["tp"] * ints["cp"] * ints["ep"] * ints["pp"] * ints["dp"]
    used = _int(data, "devices_used", "")
    if product != used:
        raise ConfigError(
            f"plan JSON degrees multiply to tp x cp x ep x pp x dp = {product}, not devices_used = {used}",
            field="devices_used",
            value=used,
            limit=product,
        )
    batch = _int(job, "global_batch_size", "job.")
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
    etp = _int(par, "etp", "parallel.", 1, ints["tp"]) if "etp" in par else None
    if etp is not None and "expert_parallel" in par:
        folded = ints["ep"] * ints["tp"] // etp if ints["tp"] % etp == 0 else None
        if _int(par, "expert_parallel", "parallel.") != folded:
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
        sp=_bool(par, "sp", "parallel."),
        zero=ZeroStage(_int(par, "zero_stage", "parallel.", 0, 3)),
        recompute=Recompute(_choice(par, "recompute", "parallel.", [e.value for e in Recompute])),
        micro_batch_size=ints["micro_batch_size"],
        schedule=Schedule(_choice(par, "schedule", "parallel.", [e.value for e in Schedule])),
        virtual_stages=ints["virtual_stages"],
        layers_per_stage=layers,
    )


def _read_layers(par: Mapping[str, Any], pp: int, virtual_stages: int) -> tuple[int, ...]:
    """``parallel.layers_per_stage``: pp counts, or with v > 1 pp x v counts (virtual stages in model
    order, the first and last of which may be 0: ``strategy.dims.layout_problem``)."""
    lengths = (pp, pp * virtual_stages) if virtual_stages > 1 else (pp,)
    given = _list(par, "layers_per_stage", "parallel.", maximum=max(lengths))
    layers = tuple(_count(n, f"parallel.layers_per_stage[{i}]", 0) for i, n in enumerate(given))
    problem = layout_problem(layers, pp, virtual_stages)
    if problem is not None:
        raise ConfigError(
            f"plan JSON field 'parallel.layers_per_stage' {problem}",
            field="parallel.layers_per_stage",
            value=len(layers),
            limit=problem,
        )
    return layers


def _read_job(data: Any, version2: bool) -> Job:
    """What is trained and every run setting of the field table; a /1 plan written before the job's
    gradient dtype, optimizer and flash setting were recorded reads them as ``UNSAVED_JOB_SETTINGS``;
    a setting recorded later than its plan (absent) takes its default."""
    job = _object(data, "job", "")
    unsaved = {key: value for key, value in UNSAVED_JOB_SETTINGS.items() if not version2 and key not in job}
    optimizer = unsaved.get("optimizer") or _choice(job, "optimizer", "job.", [o.value for o in Optimizer])
    settings = {
        entry.name: unsaved[entry.name] if entry.name in unsaved else _read_setting(job, entry)
        for entry in setting_table()
        if entry.name in job or entry.name in unsaved or (version2 and entry.name in UNSAVED_JOB_SETTINGS)
    }
    return Job(
        global_batch_size=_int(job, "global_batch_size", "job."),
        seq_len=_int(job, "seq_len", "job."),
        dtype=_choice(job, "dtype", "job.", tuple(DTYPE_BYTES)),
        optimizer=optimizer,
        settings=RunSettings.from_mapping(settings),
    )


def _read_setting(job: Mapping[str, Any], entry: Setting) -> Any:
    """One run setting of the plan's job object, read by its kind in the field table."""
    if entry.optional and job.get(entry.name, entry.default) is None:
        return None
    if entry.kind is bool:
        return _bool(job, entry.name, "job.")
    if entry.kind is int:
        low, high = entry.bounds or (1, MAX_COUNT)
        return _int(job, entry.name, "job.", int(low), int(high))
    if entry.kind is float:
        return _float(job, entry.name, "job.")
    return _choice(job, entry.name, "job.", entry.choices)


def _read_axis_order(data: Any) -> tuple[str, ...]:
    placement = _object(data, "placement", "")
    order = _field(placement, "axis_order", "placement.")
    if not isinstance(order, list) or not all(isinstance(a, str) for a in order) or sorted(order) != sorted(AXES):
        raise ConfigError(
            f"plan JSON field 'placement.axis_order' must list each of {', '.join(AXES)} once, got {brief(order)}",
            field="placement.axis_order",
            value=order,
            limit=list(AXES),
        )
    return tuple(order)


def _calibration(data: Any) -> dict[str, float]:
    table = _object(data, "model_calibration", "")
    low, high = CALIBRATION_RANGE
    out = {}
    for key in ("traced_flops_scale", "traced_activation_scale"):
        value = _float(table, key, "model_calibration.")
        if not low <= value <= high:
            raise ConfigError(
                f"plan JSON field 'model_calibration.{key}' must be in [{low:g}, {high:g}], got {brief(value)}",
                field=f"model_calibration.{key}",
                value=value,
                limit=f"[{low:g}, {high:g}]",
            )
        out[key] = value
    return out


def _read_model(data: Any, given: str | ModelSpec | None, version2: bool) -> ModelSpec:
    """The model given, else the plan's config (/2) or its name (/1)."""
    if isinstance(given, ModelSpec):
        return given
    if given is not None:
        return load_model(given)
    if not version2:
        return load_model(data["model"])
    config = _object(data, "model_config", "")
    return replace(parse_config(dict(config), data["model"]), **_calibration(data))


def _device_order(data: Any, devices: int) -> tuple[int, ...] | None:
    """The graph's device of every rank (a cluster derived from a graph, the only one that has the
    field), else None."""
    if "device_order" not in data:
        return None
    order = [
        _count(d, f"device_order[{i}]", 0, MAX_GRAPH_NODES - 1)
        for i, d in enumerate(_list(data, "device_order", "", length=devices))
    ]
    if len(set(order)) != len(order):
        raise ConfigError(
            "plan JSON field 'device_order' names a device twice", field="device_order", limit="distinct device ids"
        )
    return tuple(order)


def _read_cluster(data: Any, given: str | Cluster | None, devices_total: int, version2: bool) -> Cluster:
    """The cluster given (a name loaded with ``devices_total`` devices), else the plan's definition
    (/2) or its name (/1)."""
    if isinstance(given, Cluster):
        return given
    if given is not None or not version2:
        return load_cluster(given or data["cluster"], devices_total)
    cluster = cluster_from_dict(_object(data, "cluster_definition", ""), origin="in plan JSON cluster_definition")
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
    layers = _list(stage, "layers", where, length=2)
    return StageSummary(
        first_layer=_count(layers[0], f"{where}layers[0]", 0),
        last_layer=_count(layers[1], f"{where}layers[1]", 0),
        has_embedding=_bool(stage, "embedding", where),
        has_head=_bool(stage, "head", where),
        devices=_int(stage, "devices", where),
        forward_s=_float(stage, "forward_s", where),
        backward_s=_float(stage, "backward_s", where),
        cycle_s=_float(stage, "time_s", where),
        memory_bytes=_float(stage, "memory_bytes", where),
        memory_breakdown_bytes=_terms(stage, "memory_breakdown_bytes", where),
    )


def _read_stages(data: Any, dims: ParallelDims) -> tuple[StageSummary, ...]:
    """One entry per stage, holding the blocks ``parallel.layers_per_stage`` gives it on tp x cp x ep devices."""
    stages = tuple(_read_stage(s, f"stages[{i}].") for i, s in enumerate(_list(data, "stages", "", length=dims.pp)))
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
    names = _list(placement, "level_names", "placement.", maximum=MAX_LEVELS)
    if not names:
        raise ConfigError(
            "plan JSON field 'placement.level_names' lists no level",
            field="placement.level_names",
            value=names,
            limit=f"1..{MAX_LEVELS} names",
        )
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise ConfigError(
                f"plan JSON field 'placement.level_names[{i}]' must be a string, got {brief(name)}",
                field=f"placement.level_names[{i}]",
                value=name,
                limit="a level name",
            )
        check_string(name, f"placement.level_names[{i}]", "plan JSON")
    return names


def _read_predicted(data: Any, dims: ParallelDims) -> PredictionSummary:
    pred, placement = _object(data, "prediction", ""), _object(data, "placement", "")
    spans = _object(placement, "levels_spanned", "placement.")
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
        return _count(value, field, 0, top)

    boundaries = _list(placement, "pp_boundary_levels", "placement.", length=dims.pp - 1)
    return PredictionSummary(
        step_time_s=_float(pred, "step_time_s", "prediction."),
        breakdown_s=_terms(pred, "breakdown_s", "prediction."),
        tokens_per_s=_float(pred, "tokens_per_s", "prediction."),
        model_tflops_per_device=_float(pred, "model_tflops_per_device", "prediction."),
        hardware_tflops_per_device=_float(pred, "hardware_tflops_per_device", "prediction."),
        mfu=_float(pred, "mfu", "prediction."),
        peak_memory_bytes_per_device=_float(pred, "peak_memory_bytes_per_device", "prediction."),
        memory_breakdown_bytes=_terms(pred, "memory_breakdown_bytes", "prediction."),
        memory_capacity_bytes=_float(pred, "memory_capacity_bytes", "prediction."),
        fits=_bool(pred, "fits", "prediction."),
        memory_excess_bytes=_float(pred, "memory_excess_bytes", "prediction."),
        stages=_read_stages(data, dims),
        levels_spanned=_frozen({str(axis): level(spans[axis], f"placement.levels_spanned.{axis}") for axis in AXES}),
        pp_boundary_levels=tuple(level(v, f"placement.pp_boundary_levels[{i}]") for i, v in enumerate(boundaries)),
    )


def _read_search(data: Any) -> SearchStats:
    search = _object(data, "search", "")
    return SearchStats(
        _float(search, "solve_time_s", "search."),
        _int(search, "candidates", "search.", 0, MAX_STATISTIC),
        _int(search, "pruned_memory", "search.", 0, MAX_STATISTIC),
    )
