"""nestplan's planner: the NEST search over nestplan's physical cost model, then exact ranking."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterator

from nestplan.cluster import Cluster
from nestplan.cost.evaluator import evaluate_plan, step_floor_s
from nestplan.cost.schedules import family, layout_variants, variants
from nestplan.cost.prediction import Prediction
from nestplan.cost.terms import TermCache
from nestplan.errors import ConfigError
from nestplan.job import Job, check_context
from nestplan.model.spec import ModelSpec
from nestplan.search.engine import Engine, run_best_first
from nestplan.search.infeasible import infeasible_error
from nestplan.search.physical import FeasibleMemo, Group, PhysicalSearchModel
from nestplan.search.space import SearchSpace, deepest_pipeline, even_split, replica_counts, sub_configs, tp_values
from nestplan.search.stats import SearchStats
from nestplan.settings import CpCommType
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.legality import cp_comm_conflict, moe_overlap_conflict

POLISHED = 3  # best plans whose split is polished against the evaluator
POLISH_BUDGET = 64  # evaluations per polished plan
# The exact refinement of a finalist's split (Engine.refine) holds and sweeps stages x (layers + 1)^2 cells
# per bottleneck threshold; the finalists, best proxy first, share this many cells (8 bytes each, a few
# arrays at a time: a few hundred MB at most). Finalists beyond it keep the split the search ranked
# (SearchStats.unrefined counts them). Every 32 finalists of a 96-layer model at 96 stages fit in it;
# a 1,024-layer model's runner-ups would otherwise take minutes and GBs.
REFINED_CELLS = 2**25


@dataclass(frozen=True)
class PlanResult:
    best: Prediction | None
    runners_up: tuple[Prediction, ...]
    stats: SearchStats
    evaluated: int
    job: Job  # the best plan's job: the one searched, or its variant with the context-parallel exchange chosen


def _groups(model: ModelSpec, cluster: Cluster, job: Job, devices: int, space: SearchSpace) -> Iterator[tuple]:
    topo = cluster.topology
    units = tuple(topo.unit_devices(i) for i in range(topo.num_levels))
    deepest = min(model.num_layers, space.max_pp or model.num_layers)
    for sub, order in sub_configs(space, model, job, topo.levels[0].size, devices, units):
        key = (sub.tp, sub.sp, sub.cp, sub.ep, sub.micro_batch_size, sub.recompute.value, order)
        per_replica, per_microbatch = sub.stage_devices, sub.ep * sub.micro_batch_size
        replicas = replica_counts(sub, job, devices)
        for zero in space.zero:
            for d in replicas:
                depth = min(deepest_pipeline(space, sub, zero, deepest), devices // (per_replica * d))
                group = Group(sub, order, zero, d, job.global_batch_size // (d * per_microbatch), depth)
                yield key, key + (zero, d), group, zero


def count_groups(model: ModelSpec, cluster: Cluster, job: Job, devices: int, space: SearchSpace) -> int:
    """How many groups a search visits at most (for a progress bar)."""
    return sum(1 for _ in _groups(model, cluster, job, devices, space))


def check_job(model: ModelSpec, cluster: Cluster, job: Job, devices: int, space: SearchSpace) -> None:
    """Bad input for planning: the batch cannot occupy the devices even with the most model parallelism
    the space offers (its widest tp the model allows, its widest cp where the sequence is long enough for
    it, its widest ep that divides the experts, a stage per layer)."""
    tp = max(tp_values(space, model, devices), default=1)
    cp = max(space.cp) if job.seq_len >= space.min_cp_seq_len else 1
    ep = max((e for e in space.ep if model.is_moe and model.num_experts % e == 0), default=1)
    widest = tp * cp * ep * min(model.num_layers, space.max_pp or model.num_layers)
    if job.global_batch_size * widest < devices:
        raise ConfigError(
            f"global batch size {job.global_batch_size} cannot occupy {devices} devices: at most "
            f"{job.global_batch_size} replicas x {widest} devices per replica = {job.global_batch_size * widest}",
            field="global_batch_size",
            value=job.global_batch_size,
            limit=-(-devices // widest),
        )


def plan_job(
    model: ModelSpec,
    cluster: Cluster,
    job: Job,
    space: SearchSpace,
    *,
    top: int = 5,
    progress: Callable[[int], None] | None = None,
    feasible_memo: FeasibleMemo | None = None,
) -> PlanResult:
    """Plan ``job`` on all of ``cluster``'s devices as every caller does (the API and the CLI, sweeps,
    comparisons): the sequence checked against the model, the batch against the devices, the search, and
    an InfeasibleError explaining the leanest plan's memory when nothing fits. ``feasible_memo``: the
    memory answers shared with other searches of the job on the accelerator (search/sizes.py)."""
    check_context(model, job.seq_len)
    check_job(model, cluster, job, cluster.devices, space)
    result = search(
        model, cluster, job, cluster.devices, space, top=top, progress=progress, feasible_memo=feasible_memo
    )
    if result.best is None:
        raise infeasible_error(model, cluster, job, cluster.devices, space)
    return result


Evaluate = Callable[[ParallelDims, tuple[str, ...]], Prediction]


def _exact(evaluate: Evaluate, cand) -> Prediction:
    g: Group = cand.group
    return evaluate(g.dims(len(cand.parts), cand.parts), g.order)


def _schedule_variants(
    model: ModelSpec, space: SearchSpace, pred: Prediction, global_batch_size: int
) -> list[ParallelDims]:
    """The variants of a 1F1B plan under the space's other schedules that the registry's classes
    propose and the plan allows (cost/schedules ``variants``): on the plan's split, and those with
    chunks of their own also on the even split."""
    dims = pred.plan
    splits = sorted({dims.stage_layers(model.num_layers), even_split(model.num_layers, dims.pp)})
    return variants(space.schedules, dims, model.num_layers, global_batch_size, splits)


def _kth_fastest(preds: list[Prediction], k: int) -> float:
    """The k-th smallest step time (inf with fewer than k plans)."""
    times = sorted(p.step_time_s for p in preds)
    return times[k - 1] if len(times) >= k else float("inf")


def _moves(p: int) -> list[tuple[int, int]]:
    """(from, to) stage pairs a layer may move between: every pair up to 8 stages; beyond, the
    neighbours and the end stages (which carry the embedding and the head)."""
    return [(a, b) for a in range(p) for b in range(p) if a != b and (p <= 8 or abs(a - b) == 1 or {a, b} & {0, p - 1})]


def _polish(
    model: ModelSpec,
    evaluate: Evaluate,
    pred: Prediction,
    budget: int = POLISH_BUDGET,
    floor: Evaluate | None = None,
    fits: Callable[[Prediction], bool] = lambda p: p.fits,
) -> Prediction:
    """Steepest descent on the evaluator over one-layer moves between stages.

    The search ranks splits by the closed-form proxy; the evaluator simulates the schedule, which
    also sees where the bottleneck stage sits (the fill before it and the drain after it,
    cost/pipeline.py). Moving a layer between stages of the proxy's optimum closes that gap."""
    dims = pred.plan
    while budget > 0 and dims.pp > 1:
        parts = dims.stage_layers(model.num_layers)
        best = pred
        for src, dst in _moves(dims.pp):
            if parts[src] <= 1 or budget <= 0:
                continue
            moved = list(parts)
            moved[src] -= 1
            moved[dst] += 1
            budget -= 1
            trial_dims = replace(dims, layers_per_stage=tuple(moved))
            if floor is not None and floor(trial_dims, pred.placement.axis_order) >= best.step_time_s * (1 - 1e-12):
                continue  # its step time is at least this floor: it cannot be accepted
            trial = evaluate(trial_dims, pred.placement.axis_order)
            if fits(trial) and trial.step_time_s < best.step_time_s * (1 - 1e-12):
                best = trial
        if best is pred:
            break
        pred, dims = best, best.plan
    return pred


def _refined(engine: Engine, finalists: list, num_layers: int, budget: int = REFINED_CELLS) -> list:
    """The finalists, best proxy first, each refined (``Engine.refine``) while its stages x (layers + 1)^2
    cells fit in what is left of ``budget``; the others as the search split them, counted in the stats."""
    out = []
    for cand in finalists:
        cells = len(cand.parts) * (num_layers + 1) ** 2
        if cells <= budget:
            budget -= cells
            out.append(engine.refine(cand))
        else:
            engine.stats.unrefined += 1
            out.append(cand)
    return out


def search(
    model: ModelSpec,
    cluster: Cluster,
    job: Job,
    devices: int,
    space: SearchSpace | None = None,
    top: int = 5,
    progress: Callable[[int], None] | None = None,
    feasible_memo: FeasibleMemo | None = None,
) -> PlanResult:
    """Find the fastest plan that fits on the first ``devices`` devices of ``cluster``."""
    space = space or SearchSpace()
    capacity = space.capacity_bytes(cluster.accelerator.hbm_bytes)
    cost = PhysicalSearchModel(model, cluster, job, devices, capacity, feasible_memo)
    engine = Engine(cost, capacity, keep=max(32, 4 * top))

    def fits(pred: Prediction) -> bool:
        return pred.peak_memory_bytes_per_device <= capacity

    groups = _groups(model, cluster, job, devices, space)
    finalists = _refined(engine, run_best_first(engine, groups, progress), model.num_layers)

    def evaluate(dims: ParallelDims, order: tuple[str, ...]) -> Prediction:
        return evaluate_plan(model, cluster, dims, job, order, terms=cost.term_cache)

    def floor(dims: ParallelDims, order: tuple[str, ...]) -> float:
        return step_floor_s(model, cluster, dims, job, order, terms=cost.term_cache)

    exact = [_exact(evaluate, cand) for cand in finalists]
    fitting = sorted((p for p in exact if fits(p)), key=lambda p: p.step_time_s)
    fitting[:POLISHED] = [_polish(model, evaluate, p, floor=floor, fits=fits) for p in fitting[:POLISHED]]
    seen: set[tuple[ParallelDims, tuple[str, ...]]] = set()  # layouts do not depend on the plan's split
    for pred in list(fitting):
        # a variant slower than 1 + top plans found cannot be returned (the bar only falls): skip
        # it when its floor is; a variant on the plan's split also when the plan's bubble-free step is
        order = pred.placement.axis_order
        for dims in layout_variants(space.schedules, pred.plan, model.num_layers, job.global_batch_size):
            if (dims, order) in seen:
                continue
            seen.add((dims, order))
            if floor(dims, order) <= _kth_fastest(fitting, 1 + top):
                fitting.extend(p for p in [evaluate(dims, order)] if fits(p))
        for dims in _schedule_variants(model, space, pred, job.global_batch_size):
            bounded = family(dims.schedule).bounded_by_bubble_free_step
            if bounded and pred.bubble_free_step_s > _kth_fastest(fitting, 1 + top):
                continue
            if floor(dims, order) <= _kth_fastest(fitting, 1 + top):
                fitting.extend(p for p in [evaluate(dims, order)] if fits(p))
    fitting = _with_settings_variants(model, cluster, job, space, fitting, top, fits)
    best = fitting[0] if fitting else None
    chosen = replace(job, settings=best.settings) if best else job
    return PlanResult(best, tuple(fitting[1 : 1 + top]), engine.stats, len(exact), chosen)


def _with_settings_variants(
    model: ModelSpec,
    cluster: Cluster,
    job: Job,
    space: SearchSpace,
    fitting: list[Prediction],
    top: int,
    fits: Callable[[Prediction], bool],
) -> list[Prediction]:
    """The plans that fit with the fastest ones' variants under another context-parallel exchange, then
    another MoE overlap, fastest first (each prediction carries the settings it runs with)."""
    fitting = sorted(fitting, key=lambda p: p.step_time_s)
    fitting.extend(_variants_that_fit(model, cluster, _cp_exchange_jobs(model, job, space, fitting[: 1 + top]), fits))
    fitting.sort(key=lambda p: p.step_time_s)
    fitting.extend(_variants_that_fit(model, cluster, _moe_overlap_jobs(model, job, space, fitting[: 1 + top]), fits))
    fitting.sort(key=lambda p: p.step_time_s)
    return fitting


def cp_exchange_jobs(
    model: ModelSpec, job: Job, dims: ParallelDims, cp_fanout: tuple[int, ...], kinds: tuple[CpCommType, ...]
) -> list[Job]:
    """``job`` with each other context-parallel exchange of ``kinds`` that can run at the plan's cp and
    tp (evaluator.cp_comm_conflict); a2a+p2p with its all-to-all inside the lowest network level the
    cp group spans (``cp_fanout``'s first entry), where that leaves a ring across."""
    out = []
    for kind in kinds:
        size = cp_fanout[0] if kind is CpCommType.A2A_P2P else 1
        if kind is job.settings.cp_comm_type or (kind is CpCommType.A2A_P2P and not 1 < size < dims.cp):
            continue
        variant = job.with_settings(cp_comm_type=kind, cp_a2a_size=size)
        if cp_comm_conflict(variant, dims.cp, dims.tp, model) is None:
            out.append(variant)
    return out


def _moe_overlap_jobs(model: ModelSpec, job: Job, space: SearchSpace, preds: list[Prediction]) -> Iterator[tuple]:
    """(job, plan) for the plans of ``preds`` with their expert all-to-alls under another microbatch's compute
    (RunSettings.moe_comm_overlap) where the space allows it and the plan can run it (the overlap holds one
    more microbatch in flight)."""
    if not (space.moe_comm_overlap and model.is_moe):
        return
    for pred in preds:
        variant = replace(job, settings=replace(pred.settings, moe_comm_overlap=True))
        if not pred.settings.moe_comm_overlap and moe_overlap_conflict(pred.plan, model, variant) is None:
            yield variant, pred


def _cp_exchange_jobs(model: ModelSpec, job: Job, space: SearchSpace, preds: list[Prediction]) -> Iterator[tuple]:
    """(job, plan) for the plans of ``preds`` with cp > 1 under the other exchanges the space allows."""
    for pred in preds:
        if space.cp_comm_types and pred.plan.cp > 1:
            fanout = pred.placement.groups["cp"].fanout
            for variant in cp_exchange_jobs(model, job, pred.plan, fanout, space.cp_comm_types):
                yield variant, pred


def _variants_that_fit(
    model: ModelSpec, cluster: Cluster, variants: Iterator[tuple], fits: Callable[[Prediction], bool]
) -> Iterator[Prediction]:
    """Each (job, plan) of ``variants`` evaluated under its job, those that fit (one term cache per job)."""
    caches: dict[Job, TermCache] = {}
    for variant, pred in variants:
        terms = caches.setdefault(variant, TermCache(model, cluster, variant))
        other = evaluate_plan(model, cluster, pred.plan, variant, pred.placement.axis_order, terms=terms)
        if fits(other):
            yield other
