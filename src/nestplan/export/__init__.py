"""Launch settings for real frameworks from a typed plan (``nestplan.plan.Plan``; ``--export``,
``nestplan export``).

``export`` runs one framework's exporter on an ``ExportInput`` (the plan, the nestplan version,
the prediction under the framework's rank order). Each exporter writes files whose header states
the plan, its prediction and the nestplan version, and notes anything the framework runs
differently from what nestplan costed; a plan it cannot launch at all is a ConfigError (exit 2).
"""

from __future__ import annotations

from nestplan.cost.evaluator import evaluate_plan
from nestplan.errors import UnknownNameError
from nestplan.export import deepspeed, megatron, nemo, torchtitan
from nestplan.export.common import Export, choose_order
from nestplan.export.plan import ExportInput
from nestplan.model.spec import ModelSpec
from nestplan.plan import Plan
from nestplan.settings import CpCommType, Framework
from nestplan.strategy.enums import Schedule

EXPORTERS = {m.NAME: m for m in (megatron, torchtitan, deepspeed, nemo)}
FRAMEWORKS = tuple(EXPORTERS)
ALIASES = {alias: nemo.NAME for alias in nemo.ALIASES}  # older framework names, still accepted
# the software each export runs on: Megatron-Bridge runs NeMo's recipes on Megatron-Core
EXPORT_FRAMEWORKS = {
    megatron.NAME: Framework.MEGATRON,
    nemo.NAME: Framework.NEMO,
    torchtitan.NAME: Framework.TORCHTITAN,
    deepspeed.NAME: Framework.DEEPSPEED,
}
# the export each framework's plans are narrowed as (plain FSDP has none: search/space.py FSDP_SPACE)
FRAMEWORK_EXPORTS = {fw: name for name, fw in EXPORT_FRAMEWORKS.items()}


def default_order(framework: str) -> tuple[str, ...]:
    """The rank order (fastest axis first) ``framework`` lays ranks out in unless told otherwise, whatever
    the plan: Megatron-core's without --use-tp-pp-dp-mapping, torchtitan's device mesh, DeepSpeed's
    pipeline topology."""
    if framework in (megatron.NAME, nemo.NAME):
        return next(iter(megatron.ORDERS))
    return torchtitan.STAGE_MAJOR if framework == torchtitan.NAME else deepspeed.STAGE_MAJOR


def framework_orders(framework: str, plan: Plan) -> list[tuple[str, ...]]:
    """The rank orders (fastest axis first) the framework can run this plan with, its default first."""
    if framework in (megatron.NAME, nemo.NAME):
        return megatron.orders(plan)
    return [default_order(framework)]


def framework_schedules(framework: str) -> tuple[Schedule, ...]:
    """The pipeline schedules ``framework`` (a name check_framework accepted) runs as nestplan costs them."""
    return EXPORTERS[framework].COSTED_SCHEDULES


def framework_cp_comm(framework: str) -> tuple[CpCommType, ...]:
    """The context-parallel exchanges ``framework`` runs as costed."""
    return EXPORTERS[framework].CP_EXCHANGES


def framework_expert_tp(framework: str) -> tuple[int | None, ...] | None:
    """The expert tensor parallelism ``framework`` runs as costed (search.space.SearchSpace.etp values;
    None: any)."""
    return EXPORTERS[framework].EXPERT_TP


# what a framework runs beyond its schedules, exchanges and expert tensor parallelism, as SearchSpace fields
SEARCH_LIMITS = {deepspeed.NAME: deepspeed.SEARCH_LIMITS}


def framework_search_limits(framework: str) -> dict[str, object]:
    """The SearchSpace fields that keep ``framework``'s plans to what it runs (its export would refuse the
    rest): DeepSpeed's Ulysses without tensor or pipeline ranks, its pipeline engine with ZeRO 0 and 1."""
    return SEARCH_LIMITS.get(framework, {})


def framework_moe_overlap(framework: str, model: ModelSpec) -> bool:
    """Whether ``framework`` runs ``model``'s MoE all-to-alls under another microbatch's compute
    (RunSettings.moe_comm_overlap)."""
    return EXPORTERS[framework].moe_comm_overlap(model)


def exports_running(schedule: Schedule) -> tuple[str, ...]:
    """The exports whose framework runs ``schedule`` as nestplan costs it (the schedule table of
    docs/workflow.md)."""
    return tuple(name for name in EXPORTERS if schedule in framework_schedules(name))


def schedule_caveat(plan: Plan) -> str:
    """Where the plan's framework does not run its pipeline schedule (a zero-bubble or V schedule planned for
    Megatron-LM, whose search keeps every schedule nestplan costs): which exports do, and how to plan for
    the framework's own; else ""."""
    framework, schedule = plan.job.settings.framework, plan.dims.schedule
    export = FRAMEWORK_EXPORTS.get(framework)
    running = exports_running(schedule)
    if export is None or export in running:
        return ""
    return (
        f"; {framework.value} does not run the {schedule.value} schedule ({', '.join(running) or 'no export'} "
        f"does): plan with --export {export} for a plan it runs"
    )


def check_model(framework: str, model: ModelSpec) -> None:
    """Refuse, before any search, a model ``framework`` cannot build (the one-line error its export gives)."""
    EXPORTERS[framework].check_model(model)


def check_framework(name: str) -> str:
    """The canonical name of the framework ``name`` names (itself or an older alias, such as nemo)."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in EXPORTERS:
        raise UnknownNameError("framework", name, list(FRAMEWORKS) + list(ALIASES), files=False)
    return key


def export(framework: str, inp: ExportInput) -> Export:
    return EXPORTERS[check_framework(framework)].export(inp)


def build(plan: Plan, framework: str, version: str) -> Export:
    """``framework``'s export of ``plan`` (nestplan ``version`` in its header), quoting nestplan's
    prediction under the framework's rank order where that differs from the one costed."""
    key = check_framework(framework)
    order = choose_order(plan, framework_orders(key, plan))
    alternative = None
    if tuple(order) != plan.axis_order:
        other = evaluate_plan(plan.model, plan.cluster, plan.dims, plan.job, order)
        alternative = {"step_time_s": other.step_time_s, "tokens_per_s": other.tokens_per_s}
    return export(key, ExportInput(plan, version, alternative))
