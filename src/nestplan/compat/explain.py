"""``nest-solve --explain``: the authors' time per batch taken apart, what it becomes with one
time unit, and what nestplan's physical cost model says of the same plan.

The authors' layer latencies are estimator cycles / frequency (1.05e6: milliseconds of a
1.05 GHz clock), their transfers and all-reduces seconds; added as they are, the network
is ~1e-5 of a time per batch and cannot steer a plan. Read in seconds (latency x 1e-3),
the same plan shows its real network share, and the search may choose another plan.
"""

from __future__ import annotations

import dataclasses

from nestplan.compat.schema import NestInput, NestLayer
from nestplan.compat.solve import NestPlan, NestResult, solve
from nestplan.errors import PlannerError
from nestplan.units import GiB

ESTIMATOR_UNIT_S = 1e-3  # cycles / 1.05e6 at a 1.05 GHz clock: milliseconds
PHYSICAL_BATCH = 4096  # sequences per step of the physical prediction (the NEST paper's global batch)


def breakdown(inp: NestInput, plan: NestPlan, unit_s: float = 1.0) -> dict[str, float]:
    """Time per batch in parts; ``unit_s`` converts the layer latencies (1: the authors' mix)."""
    s = max(range(len(plan.loads)), key=plan.loads.__getitem__)
    rounds = -(-inp.microbatches // plan.replicas) + plan.depth - 1
    compute = (plan.loads[s] - plan.transfers[s]) * unit_s * rounds
    transfer = plan.transfers[s] * rounds
    total = compute + transfer + plan.allreduce
    return {
        "compute": compute,
        "transfer": transfer,
        "allreduce": plan.allreduce,
        "total": total,
        "network_share": (transfer + plan.allreduce) / total,
        "rounds": rounds,
    }


def in_seconds(inp: NestInput) -> NestInput:
    """The same input with layer latencies converted to seconds (one unit throughout)."""
    graphs = tuple(
        dataclasses.replace(g, embedding=_scaled(g.embedding), layers=tuple(_scaled(x) for x in g.layers))
        for g in inp.graphs
    )
    return dataclasses.replace(inp, graphs=graphs)


def _scaled(node: NestLayer) -> NestLayer:
    return dataclasses.replace(node, fw=node.fw * ESTIMATOR_UNIT_S, bw=node.bw * ESTIMATOR_UNIT_S)


def describe(plan: NestPlan) -> str:
    parts = ",".join(map(str, plan.parts))
    zero = ", ZeRO over the replicas" if plan.zero else ""
    return f"t {plan.width}, d {plan.replicas}, p {plan.depth} (nodes per stage {parts}){zero}"


def explain(
    inp: NestInput, result: NestResult, *, model: str | None = None, cluster: str | None = None, mbs: int | None = None
) -> list[str]:
    """Lines for the terminal."""
    plan = result.plan
    mix, si = breakdown(inp, plan), breakdown(inp, plan, ESTIMATOR_UNIT_S)
    lines = [
        f"plan: {describe(plan)}; finalTimePerBatch {plan.time_per_batch:.10g}",
        f"search: {result.stats.groups} (width, replicas) groups, {result.stats.depths} depths, "
        f"{result.stats.candidates} candidates costed, {result.wall_s:.2f} s",
        f"authors' units: {mix['rounds']} rounds x bottleneck; compute {mix['compute']:.6g} (estimator unit) + "
        f"pipeline transfers {mix['transfer']:.3g} s + all-reduce {mix['allreduce']:.3g} s: the network is "
        f"{mix['network_share']:.1e} of the time per batch, too little to change any plan",
        f"in seconds (latencies x {ESTIMATOR_UNIT_S:g}): compute {si['compute']:.4g} s + transfers "
        f"{si['transfer']:.4g} s + all-reduce {si['allreduce']:.4g} s = {si['total']:.4g} s per batch; the "
        f"network is {100 * si['network_share']:.1f}% of it",
    ]
    try:
        consistent = solve(in_seconds(inp)).plan
        same = (consistent.width, consistent.replicas, consistent.parts) == (plan.width, plan.replicas, plan.parts)
        lines.append(
            "searched in seconds, the best plan is the same"
            if same
            else f"searched in seconds, the best plan is {describe(consistent)}: "
            f"{consistent.time_per_batch:.7g} s per batch against {si['total']:.7g} s"
        )
    except PlannerError as exc:
        lines.append(f"searched in seconds: {exc}")
    lines.append(physical(inp, plan, model, cluster, mbs))
    return lines


def physical(inp: NestInput, plan: NestPlan, model: str | None, cluster: str | None, mbs: int | None) -> str:
    """nestplan's own prediction of the same plan on a catalog model and cluster."""
    if not model or not cluster:
        return (
            "nestplan's physical model: pass --model and --cluster (catalog names or files) to see its "
            "prediction of this plan"
        )
    from nestplan.cluster import load_cluster
    from nestplan.cost.evaluator import evaluate_plan
    from nestplan.job import make_job
    from nestplan.model import load_model
    from nestplan.strategy.dims import ParallelDims
    from nestplan.strategy.enums import Recompute

    try:
        spec = load_model(model)
        if spec.num_layers != inp.num_layers:
            return (
                f"nestplan's physical model: {spec.name} has {spec.num_layers} layers, the input "
                f"{inp.num_layers}: not the same model"
            )
        micro = mbs or max(1, round(PHYSICAL_BATCH / (inp.microbatches * inp.ep_degree)))
        layers = (plan.parts[0] - 1,) + plan.parts[1:]
        dims = ParallelDims(
            tp=plan.width,
            pp=len(plan.parts),
            dp=plan.replicas,
            ep=inp.ep_degree,
            cp=inp.cp_degree,
            sp=inp.sp_enabled,
            micro_batch_size=micro,
            recompute=Recompute.FULL if inp.recompute else Recompute.NONE,
            layers_per_stage=layers if len(plan.parts) > 1 else None,
        )
        pred = evaluate_plan(spec, load_cluster(cluster, dims.devices), dims, make_job(spec, PHYSICAL_BATCH))
    except PlannerError as exc:
        return f"nestplan's physical model cannot run this plan: {exc}"
    peak, limit = pred.peak_memory_bytes_per_device, pred.memory_capacity_bytes
    fit = "" if peak <= limit else f" (does not fit: {limit / GiB:.0f} GiB devices)"
    comm_terms = ("tp_comm", "cp_comm", "ep_comm", "zero_comm", "pp_comm", "dp_sync")
    comm = sum(pred.breakdown_s.get(k, 0.0) for k in comm_terms)
    return (
        f"nestplan's physical model ({spec.name} on {cluster}, {dims.devices} devices): step "
        f"{pred.step_time_s:.4g} s for {PHYSICAL_BATCH} samples, {pred.tokens_per_s:,.0f} tokens/s, "
        f"MFU {100 * pred.mfu:.1f}%, communication and sync {100 * comm / pred.step_time_s:.1f}% of the step, "
        f"peak memory {peak / GiB:.1f} GiB{fit}"
    )
