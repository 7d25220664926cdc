"""The plan JSON's ``run`` section: the run's length as given, its figures (cost/run.py) and the
facility's assumptions with their sources (hardware/facility.py). Only the length is read back:
the figures follow from the plan, its cluster (whose ``cluster_definition`` carries a facility
that differs from the defaults) and the length, so a plan read and written again is unchanged."""

from __future__ import annotations

from typing import Any

from nestplan.cluster import Cluster
from nestplan.cost.reliability import Reliability
from nestplan.cost.run import MAX_STEPS, MAX_TOKENS, RunEstimate, RunLength
from nestplan.hardware.facility import DEFAULT_FACILITY, DEFAULTS, facility_to_dict
from nestplan.plan.fields import object_field, refusal


def run_section(length: RunLength, run: RunEstimate, cluster: Cluster) -> dict[str, Any]:
    """The ``run`` object of a plan JSON."""
    given = facility_to_dict(cluster.facility)
    defaults = facility_to_dict(DEFAULT_FACILITY)
    assumptions = {
        key: {
            "value": given.get(key),
            "source": DEFAULTS[key][1] if given.get(key) == defaults.get(key) else "the cluster file or an option",
        }
        for key in DEFAULTS
    }
    board = cluster.accelerator.board_power_W
    assumptions["board_power_W"] = {"value": board, "source": cluster.accelerator.source or "the accelerator table"}
    return {
        "length": {"tokens": length.tokens} if length.tokens is not None else {"steps": length.steps},
        "estimate": run_figures(run),
        "assumptions": assumptions,
    }


def run_figures(run: RunEstimate) -> dict[str, Any]:
    """A run's figures as plain JSON values (None where an input they need is not given)."""
    return {
        "steps": run.steps,
        "tokens": run.tokens,
        "devices": run.devices,
        "spare_devices": run.spare_devices,
        "compute_s": run.compute_s,
        "wall_s": run.wall_s,
        "days": run.days,
        "interruptions": run.interruptions,
        "gpu_hours": run.gpu_hours,
        "energy_MWh": run.energy_MWh,
        "cost_usd": run.cost_usd,
        "reliability": reliability_figures(run.reliability),
    }


def reliability_figures(r: Reliability) -> dict[str, Any]:
    c = r.checkpoint
    return {
        "mtbi_s": r.mtbi_s,
        "goodput": r.goodput,
        "checkpoint_interval_steps": r.interval_steps,
        "checkpoint_interval_s": r.interval_s,
        "checkpoint_held_bytes_per_rank": c.held_bytes_per_rank,
        "checkpoint_written_bytes_per_rank": c.written_bytes_per_rank,
        "checkpoint_job_bytes": c.job_bytes,
        "checkpoint_write_s": c.write_s,
        "checkpoint_blocking_s": c.blocking_s,
        "checkpoint_read_s": c.read_s,
        "restart_s": r.restart_s,
        "spare_hosts": r.spare_hosts,
        "spare_wait_s": r.spare_wait_s,
    }


def read_run_length(data: Any) -> RunLength | None:
    """The run's length of a plan JSON (None: the plan has no ``run`` section)."""
    if not isinstance(data, dict) or "run" not in data:
        return None
    length = object_field(object_field(data, "run", ""), "length", "run.")
    if sorted(length) == ["tokens"]:
        tokens = length["tokens"]
        if isinstance(tokens, bool) or not isinstance(tokens, (int, float)) or not 1 <= tokens <= MAX_TOKENS:
            raise refusal("run.length.tokens", f"a number in [1, {MAX_TOKENS:g}]", tokens, f"[1, {MAX_TOKENS:g}]")
        return RunLength(tokens=float(tokens))
    if sorted(length) == ["steps"]:
        steps = length["steps"]
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
            raise refusal("run.length.steps", f"an integer in 1..{MAX_STEPS}", steps, f"1..{MAX_STEPS}")
        return RunLength(steps=steps)
    raise refusal("run.length", "an object of tokens or of steps", sorted(length), ["tokens", "steps"])
