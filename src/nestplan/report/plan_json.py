"""The plan JSON's shared fields in the layout of schema ``nestplan.plan/1``, for callers that hold a
prediction and names only: the sweep's stored details and ``bench/compare_plans.py``, whose output
stays comparable across versions. A whole plan file (schema ``nestplan.plan/2``, with the model's
config and the cluster's definition) is ``nestplan.plan.Plan.to_dict``; both write the shared
fields through ``nestplan.plan.sections``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nestplan.cost.prediction import Prediction
from nestplan.job import Job
from nestplan.plan import SCHEMA_V1, PredictionSummary, sections
from nestplan.search.stats import SearchStats

__all__ = ["SearchStats", "plan_to_dict"]


def plan_to_dict(
    pred: Prediction,
    *,
    model: str,
    cluster: str,
    devices_total: int,
    job: Job,
    level_names: list[str],
    search: SearchStats,
) -> dict[str, Any]:
    per_stage = tuple(s.last_layer - s.first_layer + 1 for s in pred.stages)
    dims = replace(pred.plan, layers_per_stage=pred.plan.layers_per_stage or per_stage)  # keeps a per-chunk layout
    return {
        "schema": SCHEMA_V1,
        "model": model,
        "cluster": cluster,
        "devices_total": devices_total,
        **sections(dims, pred.placement.axis_order, job, PredictionSummary.from_prediction(pred), level_names, search),
    }
