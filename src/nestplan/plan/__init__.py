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

Modules: ``typed`` (the ``Plan``), ``summary`` (``StageSummary``, ``PredictionSummary``), ``writer``
(``sections``, the fields both schemas share), ``reader`` (``check_schema`` and each section read
back), ``fields`` (the checked getters of single fields), ``schema`` (the schema names and bounds).
"""

from nestplan.plan.reader import check_schema
from nestplan.plan.schema import (
    CALIBRATION_RANGE,
    MAX_COUNT,
    MAX_STATISTIC,
    MAX_TERMS,
    SCHEMA,
    SCHEMA_V1,
    SCHEMAS,
    UNSAVED_JOB_SETTINGS,
)
from nestplan.plan.summary import PredictionSummary, StageSummary
from nestplan.plan.typed import Plan
from nestplan.plan.writer import sections
from nestplan.search.stats import SearchStats

__all__ = [
    "CALIBRATION_RANGE",
    "MAX_COUNT",
    "MAX_STATISTIC",
    "MAX_TERMS",
    "SCHEMA",
    "SCHEMAS",
    "SCHEMA_V1",
    "UNSAVED_JOB_SETTINGS",
    "Plan",
    "PredictionSummary",
    "SearchStats",
    "StageSummary",
    "check_schema",
    "sections",
]
