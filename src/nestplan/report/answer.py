"""The answer first: a plan's report opens with what to run, what it is predicted to give, how much memory it
leaves, and why it beats the best alternative the search kept (``--report``'s first section).

Pure functions of the plan and its runner-ups: every figure is read from the plan (its prediction, its trust
band, its run), none computed here but the runner-up's margin. A runner-up that differs from the plan in its
rank order alone (the same degrees, split and settings placed another way) is a twin, not an alternative: the
comparison is with the first runner-up that differs in more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nestplan.cost.prediction import Prediction
from nestplan.export import schedule_caveat
from nestplan.plan import Plan
from nestplan.profile import is_tie
from nestplan.report.run import energy, money
from nestplan.report.text import fit_verdict
from nestplan.settings import RunSettings, plain_value, setting_table
from nestplan.strategy.describe import describe
from nestplan.strategy.dims import ParallelDims


@dataclass(frozen=True)
class Alternative:
    """The first runner-up that differs from the plan in more than rank order, and by how much it is slower."""

    changes: tuple[str, ...]  # "pp 8 → 4": the runner-up's value → the plan's, one entry per fact that differs
    slower_s: float  # its step time minus the plan's
    slower: float  # as a fraction of the plan's step time
    tie: bool  # within the plan's trust band (profile.is_tie)


def plan_facts(dims: ParallelDims, settings: RunSettings) -> dict[str, str]:
    """What a plan runs, fact by fact, as the changes name them: its degrees, schedule, split and run settings."""
    schedule = dims.schedule.value + (f" v{dims.virtual_stages}" if dims.virtual_stages > 1 else "")
    facts = {
        "tp": f"{dims.tp}{'+sp' if dims.sp_active else ''}",
        "cp": str(dims.cp),
        "ep": str(dims.ep),
        "etp": str(dims.expert_tp),
        "pp": str(dims.pp),
        "dp": str(dims.dp),
        "ZeRO": str(int(dims.zero)),
        "recompute": dims.recompute.value,
        "mbs": str(dims.micro_batch_size),
        "schedule": schedule,
        "layers per stage": ",".join(map(str, dims.layers_per_stage)) if dims.layers_per_stage else "even",
    }
    return facts | {entry.label: str(plain_value(getattr(settings, entry.name))) for entry in setting_table()}


def changes(plan: Plan, other: Prediction) -> tuple[str, ...]:
    """Each fact in which ``other`` differs from ``plan``, as ``name its value → the plan's``; () for a twin
    that differs in rank order alone."""
    mine, theirs = plan_facts(plan.dims, plan.job.settings), plan_facts(other.plan, other.settings)
    return tuple(f"{name} {theirs[name]} → {value}" for name, value in mine.items() if theirs[name] != value)


def best_alternative(plan: Plan, runners_up: Sequence[Prediction]) -> Alternative | None:
    """The first of ``runners_up`` (best first) that differs from ``plan`` in more than rank order; None where
    every one is a rank-order twin or there is none."""
    step = plan.predicted.step_time_s
    for other in runners_up:
        differs = changes(plan, other)
        if differs:
            tie = is_tie(other.step_time_s, step, plan.trust)
            return Alternative(differs, other.step_time_s - step, other.step_time_s / step - 1.0, tie)
    return None


def answer_lines(plan: Plan, runners_up: Sequence[Prediction] | None = None) -> list[tuple[str, str]]:
    """The answer in a few labelled lines: what to run, its step, its whole run (where the plan has one), its
    memory and, for a searched plan (``runners_up`` given, even empty), why it beats the alternative."""
    d, p, job = plan.dims, plan.predicted, plan.job
    exchange = f", cp exchange {job.settings.cp_comm_type.value}" if d.cp > 1 else ""
    lines = [
        (
            "what to run",
            f"{describe(d, plan.axis_order, long=True)}{exchange}; microbatches per replica per step: "
            f"{plan.num_microbatches}; "
            f"{job.settings.framework.value} on {plan.devices_used:,} of {plan.cluster.devices:,} devices of "
            f"{plan.cluster.name} ({plan.cluster.accelerator.name}){schedule_caveat(plan)}",
        ),
        (
            "predicted step",
            f"{p.step_time_s:.3f} s, {p.tokens_per_s:,.0f} tokens/s, MFU {p.mfu:.1%}; trust: {plan.trust['note']}",
        ),
    ]
    run = plan.run
    if run is not None:
        lines.append(
            (
                "whole run",
                f"{run.days:.2f} days, cost {money(run.cost_usd)}, {energy(run.energy_MWh)}, {run.gpu_hours:,.0f} "
                f"GPU-hours ({run.steps:,} steps, goodput {run.reliability.goodput:.1%})",
            )
        )
    lines.append(("memory", fit_verdict(p)))
    if runners_up is not None:
        lines.append(("why this plan", why_this_plan(plan, runners_up)))
    return lines


def why_this_plan(plan: Plan, runners_up: Sequence[Prediction]) -> str:
    """Against the first runner-up that differs in more than rank order: what differs and by how much it is
    slower, a tie within the trust band; or that no runner-up kept differs in more."""
    alternative = best_alternative(plan, runners_up)
    if alternative is None and not runners_up:
        return "no runner-up to compare with (--top K keeps K of them)"
    if alternative is None:
        return (
            f"no other plan to compare with: the {len(runners_up)} runner-ups kept differ from it in rank order "
            "alone (--top K keeps more)"
        )
    margin = f"{alternative.slower_s:.3f} s ({alternative.slower:.1%}) slower per step"
    differs = ", ".join(alternative.changes)
    if alternative.tie:
        return (
            f"a tie: the best runner-up that differs in more than rank order ({differs}; runner-up → this plan) "
            f"is {margin}, within the trust band"
        )
    return f"the best runner-up that differs in more than rank order ({differs}; runner-up → this plan) is {margin}"
