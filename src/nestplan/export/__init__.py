"""Launch settings for real frameworks from a plan (``--export``; the plan JSON: docs/formats.md).

``build_input`` turns a plan JSON object (schema ``nestplan.plan/1``, from a fresh search or a
saved file), the model and the cluster into an ``ExportInput``; ``export`` runs one framework's
exporter on it. Each exporter writes files whose header states the plan, its prediction and the
nestplan version, and notes anything the framework runs differently from what nestplan costed;
a plan it cannot launch at all is a ConfigError (exit 2).
"""

from __future__ import annotations

from typing import Any, Mapping

from nestplan.errors import ConfigError
from nestplan.export import deepspeed, megatron, nemo, torchtitan
from nestplan.export.common import Export
from nestplan.export.plan import ExportInput, PlanSettings, check_model, read_plan
from nestplan.model.spec import ModelSpec

EXPORTERS = {m.NAME: m for m in (megatron, torchtitan, deepspeed, nemo)}
FRAMEWORKS = tuple(EXPORTERS)


def framework_orders(framework: str, plan: PlanSettings) -> list[tuple[str, ...]]:
    """The rank orders (fastest axis first) the framework can run this plan with, its default first."""
    if framework in ("megatron", "nemo"):
        return megatron.orders(plan)
    return [torchtitan.STAGE_MAJOR if framework == "torchtitan" else deepspeed.STAGE_MAJOR]


def check_framework(name: str) -> str:
    key = name.strip().lower()
    if key not in EXPORTERS:
        raise ConfigError(f"unknown framework '{name}'; choose one of: {', '.join(FRAMEWORKS)}", field="export",
                          value=name, limit=list(FRAMEWORKS))
    return key


def build_input(plan: Mapping[str, Any], model: ModelSpec, topology, version: str,
                alternative: Mapping[str, float] | None = None) -> ExportInput:
    settings = read_plan(plan)
    check_model(settings, model)
    names = tuple(lv.name for lv in topology.levels)
    units = tuple(topology.unit_devices(i) for i in range(topology.num_levels))
    return ExportInput(settings, model, names, units, version, alternative)


def export(framework: str, inp: ExportInput) -> Export:
    return EXPORTERS[check_framework(framework)].export(inp)
