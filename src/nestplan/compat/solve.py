"""Drop-in for the NEST authors' solver: search with their semantics, re-cost their baselines,
write their output schema.

The search is nestplan's engine (search/engine.py) with compat/model.py's cost model: the
dynamic program over every (width, replicas, depth), exact for the authors' objective
max load * (ceil(m / d) + p - 1) + all-reduce. ZeRO (parameters and gradients sharded over
the replicas) is searched only for widths where nothing fits without it.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from nestplan.compat.model import NestCostModel, NestGroup, transfer_s
from nestplan.compat.schema import NestBaseline, NestInput
from nestplan.errors import InfeasibleError
from nestplan.search.engine import Candidate, Engine, SearchStats, run
from nestplan.search.partition import dp_split_matrix, stage_cost_matrix, suffix_bottlenecks
from nestplan.units import GiB


@dataclass(frozen=True)
class NestPlan:
    """A plan under the authors' semantics, fully costed."""

    width: int
    replicas: int
    depth: int  # p in the time formula (a baseline may have fewer stages)
    parts: tuple[int, ...]  # nodes per stage, embedding first
    loads: tuple[float, ...]  # per microbatch, the estimator's unit
    transfers: tuple[float, ...]  # the part of each load that is the entering transfer (s)
    allreduce: float  # seconds (the authors' unit mix)
    memory_bytes: tuple[float, ...]
    zero: bool
    time_per_batch: float

    @property
    def bottleneck(self) -> float:
        return max(self.loads)


@dataclass(frozen=True)
class NestResult:
    plan: NestPlan
    baselines: dict[str, NestPlan | None]
    stats: SearchStats
    wall_s: float


def evaluate(
    model: NestCostModel,
    width: int,
    replicas: int,
    parts: tuple[int, ...],
    *,
    depth: int | None = None,
    placed: bool = True,
    zero: bool = False,
) -> NestPlan:
    """Cost one plan with the stage tables the search uses. ``placed`` False costs it as the
    authors cost baselines: every transfer at the innermost level, recomputation on every stage."""
    inp = model.inp
    p, stages = depth or len(parts), len(parts)
    group = NestGroup(width, replicas, -(-inp.microbatches // replicas), p, zero)
    costs, starts, stashes = _table_rows(model, group, stages) if placed else _baseline_rows(model, width, p, stages)
    edges = np.concatenate([[0], np.cumsum(parts)])
    mem_rows = model.block_memory(group, stages)
    loads, transfers, memory = [], [], []
    for s in range(stages):
        lo, hi = int(edges[s]), int(edges[s + 1])
        move = float(starts[s, lo])
        loads.append(float(costs[s, lo:hi].sum()) + move)
        transfers.append(move)
        memory.append(float(mem_rows[s, lo:hi].sum() + stashes[s, lo]))
    reduce = model.extras(group, tuple(parts))
    time_per_batch = max(loads) * (group.microbatches + p - 1) + reduce
    return NestPlan(
        width,
        replicas,
        p,
        tuple(int(x) for x in parts),
        tuple(loads),
        tuple(transfers),
        reduce,
        tuple(memory),
        zero,
        time_per_batch,
    )


def _table_rows(model: NestCostModel, group: NestGroup, stages: int) -> tuple[np.ndarray, ...]:
    """Block costs, entering transfers and stashes of a ``stages``-deep pipeline, as searched."""
    tab = model.tables(group)
    return tab.block_costs[stages - 1], tab.start_costs[stages - 1], tab.start_memory[stages - 1]


def _baseline_rows(model: NestCostModel, width: int, depth: int, stages: int) -> tuple[np.ndarray, ...]:
    """The same rows as the authors cost a baseline: recomputation charged on every stage when
    the nominal depth is > 1, every transfer at the innermost level."""
    inp, c = model.inp, model.chain(width)
    rerun = 2.0 if inp.recompute and depth > 1 else 1.0
    costs = np.broadcast_to(c["fw"] + c["bw"] * rerun, (stages, model.num_blocks))
    starts = np.zeros((stages, model.num_blocks))
    starts[1:] = [transfer_s(inp.network, b, 0) for b in c["entering"]]
    stashes = np.zeros((stages, model.num_blocks))
    if inp.recompute:
        stashes[1:] = (stages - 1 - np.arange(1, stages))[:, None] * c["entering"][None, :]
    return costs, starts, stashes


def fits(inp: NestInput, plan: NestPlan) -> bool:
    return max(plan.memory_bytes) <= inp.memory_bytes


def baseline_parts(num_nodes: int, depth: int, layer_partition: tuple[int, ...] | None) -> tuple[int, ...]:
    """The authors' baseline stages: chunks of ceil(nodes / p) nodes (fewer stages than p when
    that runs out), or ``layer_partition``'s counts with any leftover nodes on the last stage."""
    if layer_partition:
        parts = [c for c in layer_partition]
        used = sum(parts)
        if used < num_nodes:
            parts[-1] += num_nodes - used
        while sum(parts) > num_nodes:  # counts beyond the chain: trim from the end
            over = sum(parts) - num_nodes
            cut = min(over, parts[-1])
            parts[-1] -= cut
            if parts[-1] == 0:
                parts.pop()
        return tuple(parts)
    size = -(-num_nodes // depth)
    return tuple(min(size, num_nodes - k) for k in range(0, num_nodes, size))


def cost_baseline(model: NestCostModel, b: NestBaseline) -> NestPlan | None:
    """A baseline under the authors' semantics; None where it does not fit (devices or memory)."""
    inp = model.inp
    if inp.graph(b.t) is None or b.p * inp.stage_devices(b.t) * b.d > inp.max_devices:
        return None
    parts = baseline_parts(model.num_blocks, b.p, b.layer_partition)
    plan = evaluate(model, b.t, b.d, parts, depth=b.p, placed=False)
    return plan if fits(inp, plan) else None


def solve(inp: NestInput, *, keep: int = 32, progress: Callable[[int], None] | None = None) -> NestResult:
    """The best plan under the authors' semantics, and their baselines re-costed."""
    start = time.perf_counter()
    model = NestCostModel(inp)
    engine = Engine(model, capacity_bytes=inp.memory_bytes, keep=keep)
    groups = itertools.chain(model.groups(zero=False), model.groups(zero=True))
    finalists = [refine(model, engine, c) for c in run(engine, groups, progress=progress, escalate_from=3)]
    if not finalists:
        raise infeasible(model)
    cand = min(finalists, key=lambda c: c.proxy_s)
    group: NestGroup = cand.group
    plan = evaluate(model, group.width, group.replicas, cand.parts, zero=group.zero)
    assert math.isclose(plan.time_per_batch, cand.proxy_s, rel_tol=1e-9), (plan.time_per_batch, cand.proxy_s)
    assert fits(inp, plan)
    baselines = {b.name: cost_baseline(model, b) for b in inp.baselines}
    return NestResult(plan, baselines, engine.stats, time.perf_counter() - start)


def refine(model: NestCostModel, engine: Engine, cand: Candidate) -> Candidate:
    """The exact optimum of a finalist's (group, depth): the engine minimises the bottleneck,
    but the all-reduce grows with the first stage, so among (near-)equal bottlenecks the
    first stage should be small. For every first stage [0, k): rounds * max(its load, the best
    bottleneck of the rest) + all-reduce of its parameters; the best k is kept."""
    group, p = cand.group, len(cand.parts)
    tab = model.tables(group)
    costs = stage_cost_matrix(
        tab.block_costs[p - 1, :p],
        tab.alpha[p - 1, :p],
        model.block_memory(group, p),
        tab.mem_fixed[p - 1, :p],
        engine.capacity_bytes,
        tab.start_costs[p - 1, :p],
        tab.start_memory[p - 1, :p],
    )
    rest = (
        suffix_bottlenecks(costs) if p > 1 else np.where(np.arange(costs.shape[1]) == model.num_blocks, -np.inf, np.inf)
    )
    bottleneck = np.maximum(costs[0, 0], rest)
    weight = float(tab.weight[p - 1])
    best_k, best_total = None, cand.proxy_s
    for k in np.flatnonzero(np.isfinite(bottleneck)):
        total = weight * bottleneck[k] + model.extras(group, (int(k),) + (1,) * (p - 1))
        if total < best_total * (1 - 1e-15) or best_k is None and total <= best_total:
            best_k, best_total = int(k), total
    if best_k is None:
        return cand
    forced = costs.copy()
    keep = forced[0, 0, best_k]
    forced[0, 0, :] = np.inf
    forced[0, 0, best_k] = keep
    split = dp_split_matrix(forced)
    assert split is not None
    return Candidate(best_total, cand.key, group, split.parts)


def infeasible(model: NestCostModel) -> InfeasibleError:
    """Why nothing fits: the node that needs the most memory even alone on the last stage
    (no stash), at the width where it needs the least, with ZeRO over every replica."""
    inp = model.inp
    worst = None
    for g in inp.graphs:
        c = model.chain(g.width)
        replicas = max(1, min(inp.max_devices // inp.stage_devices(g.width), inp.microbatches))
        group = NestGroup(g.width, replicas, 1, 1, zero=replicas > 1)
        alone = model.block_memory(group, 1)[0]
        node = int(np.argmax(alone))
        if worst is None or alone[node] < worst[0]:
            worst = (float(alone[node]), g.width, node - 1, float(c["act"][node]), float(c["params"][node]))
    need, width, node, act, params = worst
    limit = inp.memory_bytes
    return InfeasibleError(
        f"NEST input: no plan fits in maxMemoryPerDevice = {limit:.0f} B ({limit / GiB:.2f} GiB): node {node} alone "
        f"needs {need / GiB:.2f} GiB at tensor width {width} (activations {act / GiB:.2f} GiB, parameters "
        f"{params / GiB:.2f} GiB before sharding) even as the last stage with ZeRO over every replica",
        field="maxMemoryPerDevice",
        value=limit,
        limit=need,
        unit="B",
    )


def skeleton(inp: NestInput, plan: NestPlan) -> list[list[Any]]:
    """Device -> layer ids (node id + 1) of one replica, the authors' networkSkeleton:
    stage s on devices [(p - 1 - s) a, (p - s) a), the last stage on device 0."""
    a, p = inp.stage_devices(plan.width), len(plan.parts)
    edges = np.concatenate([[0], np.cumsum(plan.parts)])
    out = []
    for s in range(p):
        layers = list(range(int(edges[s]), int(edges[s + 1])))  # node id + 1 = chain position
        for dev in range((p - s) * a - 1, (p - 1 - s) * a - 1, -1):
            out.append([dev, layers])
    return out


def stage_nodes(plan: NestPlan) -> list[list[int]]:
    edges = np.concatenate([[0], np.cumsum(plan.parts)])
    return [list(range(int(edges[s]) - 1, int(edges[s + 1]) - 1)) for s in range(len(plan.parts))]


def to_output(inp: NestInput, result: NestResult) -> dict[str, Any]:
    """The authors' output schema (dp_output.json)."""
    plan = result.plan
    a = inp.stage_devices(plan.width)
    return {
        "baselineResults": (
            {name: (float(b.time_per_batch) if b else None) for name, b in result.baselines.items()}
            if result.baselines
            else None
        ),
        "dataParallelDegree": plan.replicas,
        "finalTimePerBatch": float(plan.time_per_batch),
        "networkSkeleton": skeleton(inp, plan),
        "stages": [{"devicesForStage": a, "nodes": nodes} for nodes in stage_nodes(plan)],
        "tensorParallelDegree": plan.width,
    }
