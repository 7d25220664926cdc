"""The typed plan: ``Plan``, what a search or an evaluation chose with everything it was made for."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from nestplan.cluster import Cluster, cluster_to_dict
from nestplan.profile import trust_band
from nestplan.cost.evaluator import evaluate_plan
from nestplan.cost.prediction import Prediction
from nestplan.cost.run import RunEstimate, RunLength, estimate_run, state_bytes
from nestplan.errors import ConfigError, printable
from nestplan.job import Job, check_context
from nestplan.model.config import config_dict
from nestplan.model.layers import active_params, total_params
from nestplan.model.spec import ModelSpec
from nestplan.plan.fields import int_field
from nestplan.plan.reader import (
    check_schema,
    read_axis_order,
    read_cluster,
    read_dims,
    read_job,
    read_model,
    read_predicted,
    read_search,
)
from nestplan.plan.run import read_run_length, run_section
from nestplan.plan.schema import SCHEMA
from nestplan.plan.summary import PredictionSummary
from nestplan.plan.writer import sections
from nestplan.search.stats import SearchStats
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.legality import check_against_accelerator, check_against_model


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
    run_length: RunLength | None = None  # the whole run's tokens or steps, where asked (``run``)

    def __post_init__(self) -> None:
        assert self.dims.layers_per_stage is not None, "a plan states its layers per stage"
        _check_model(self.dims, self.model)
        check_context(self.model, self.job.seq_len)
        check_against_model(self.dims, self.model, self.job.seq_len)
        check_against_accelerator(self.job.settings, self.cluster.accelerator)
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
    def trust(self) -> dict[str, Any]:
        """The prediction's trust band (nestplan.profile.trust_band): derived, not read back."""
        acc = self.cluster.accelerator
        return trust_band(acc.calibration, acc.name, self.job.settings.framework)

    @property
    def run(self) -> RunEstimate | None:
        """The whole run at this plan's step (cost/run.py), where a length was given."""
        if self.run_length is None:
            return None
        stages = [dict(s.memory_breakdown_bytes) for s in self.predicted.stages]
        state = state_bytes(self.dims, stages)
        return estimate_run(
            state, self.predicted.step_time_s, self.job, self.devices_used, self.cluster, self.run_length
        )

    def with_run(self, length: RunLength | None) -> Plan:
        """This plan with the run of ``length`` (None: without a run)."""
        return replace(self, run_length=length)

    @property
    def level_names(self) -> tuple[str, ...]:
        return tuple(lv.name for lv in self.cluster.topology.levels)

    def to_dict(self) -> dict[str, Any]:
        """The plan JSON object, schema ``nestplan.plan/2``."""
        order, run = self.cluster.device_order, self.run
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
            "trust": self.trust,
            **({} if order is None else {"device_order": list(order)}),
            **({} if run is None else {"run": run_section(self.run_length, run, self.cluster)}),
        }

    @classmethod
    def from_dict(
        cls, data: Any, *, model: str | ModelSpec | None = None, cluster: str | Cluster | None = None
    ) -> Plan:
        """The plan of a plan JSON object (schema /2, or /1), every field checked.

        ``model`` and ``cluster`` replace the plan's own (needed for a /1 plan whose model or
        cluster is not in the catalog); a cluster named is loaded with the plan's ``devices_total``,
        a ``Cluster`` is used as it is. With either given, the prediction is the evaluator's on them, not
        the one saved (which was made on the plan's own)."""
        check_schema(data)
        version2 = data["schema"] == SCHEMA
        dims, job, axis_order = read_dims(data), read_job(data, version2), read_axis_order(data)
        spec = read_model(data, model, version2)
        devices_total = int_field(data, "devices_total", "")
        if devices_total < dims.devices:
            raise ConfigError(
                f"plan JSON devices_total = {devices_total} is fewer than the devices_used = {dims.devices}",
                field="devices_total",
                value=devices_total,
                limit=f">= {dims.devices}",
            )
        cl = read_cluster(data, cluster, devices_total, version2, job.settings.framework)
        predicted, search = read_predicted(data, dims), read_search(data)
        plan = cls(spec, cl, job, dims, axis_order, predicted, search, run_length=read_run_length(data))
        if model is None and cluster is None:
            return plan
        # the saved prediction is the plan's on its own model and cluster: on those given, it is evaluated again
        pred = evaluate_plan(spec, cl, dims, job, axis_order)
        return replace(plan, predicted=PredictionSummary.from_prediction(pred), prediction=pred)


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
