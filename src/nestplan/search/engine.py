"""The search engine: outer loops over groups, the split of every depth, exact ranking.

For every group (sub-graph configuration, ZeRO stage, replicas) the engine asks the cost
model for stage tables over all pipeline depths, solves each depth's split (closed form for
identical blocks, the dynamic program otherwise), and keeps the best candidates by the
proxy step time (m - 1) * bottleneck + sum of cycles + step-end terms. A depth whose
pipeline time alone already exceeds the K-th best candidate is pruned (dominated), as is
one whose stages cannot fit in memory. ZeRO is raised for a configuration only when none of
its plans fits at a lower stage (NEST section 4), and then with every replica count; ZeRO 1
(Megatron-LM's distributed optimizer) shards only optimizer state at no extra communication
volume and is always searched beside ZeRO 0. ``run_best_first`` returns what ``run`` returns
(the planner's search) but visits the groups by a lower bound of their proxy and stops where
the bound cannot enter the K best; ties break by the sequential order in both.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Protocol

import numpy as np

from nestplan.search.partition import (
    INFEASIBLE,
    Split,
    dp_split,
    dp_split_matrix,
    waterfill_bottlenecks,
    waterfill_split,
)
from nestplan.search.stats import SearchStats


@dataclass(frozen=True)
class StageTables:
    """Stage tables of one group for depths 1..P (row p - 1 = depth p; columns = stage index): what the
    engine splits. The fields after ``homogeneous`` generalise nestplan's physical model
    (search/physical.py, which leaves them None) to the NEST authors' (compat/model.py)."""

    alpha: np.ndarray  # (P, P) seconds; -inf beyond the depth
    nmax: np.ndarray  # (P, P) most blocks a stage can hold; 0 beyond the depth
    beta: float  # seconds per block (identical blocks) ...
    block_costs: np.ndarray  # ... or per block (L,), or (P, P, L): a block's cost depends on the stage holding it
    mem_fixed: np.ndarray  # (P, P) bytes per stage besides its blocks
    constant: np.ndarray  # (P,) sum of alpha + all blocks: the depth-dependent part of sum_s cycle_s
    homogeneous: bool  # identical blocks: the closed-form split (water-filling) instead of the dynamic program
    # blocks of different kinds: (L + 1, L + 1) the largest transient of blocks [j, e), which mem_fixed leaves out
    transient: np.ndarray | None = None
    # (P, P, L): what a stage costs, and holds, for the edge entering its first block j
    start_costs: np.ndarray | None = None
    start_memory: np.ndarray | None = None
    # (P,): replaces the pipeline's bottleneck multiplier m - 1 (inf for a depth the group cannot take), so
    # that depth p ranks by weight[p - 1] * bottleneck + constant[p - 1] + extras (the NEST authors'
    # (m + p - 1) * bottleneck)
    weight: np.ndarray | None = None
    split_key: Hashable | None = None  # groups with the same key share one solve of every depth


def stage_cycles(tab: StageTables, parts: tuple[int, ...]) -> np.ndarray:
    """Per-microbatch cycle of every stage of a split."""
    p = len(parts)
    edges = np.concatenate([[0], np.cumsum(parts)])
    return tab.alpha[p - 1, :p] + np.add.reduceat(tab.block_costs, edges[:-1])


class SearchCostModel(Protocol):
    """What the engine needs of a cost model (nestplan's physical one, or the NEST authors'): its
    stage tables, block memory and step-end extras, and four answers a model may leave to their
    defaults here (a cost model states it implements this protocol by subclassing it)."""

    num_blocks: int

    def tables(self, group: Any) -> StageTables: ...

    def block_memory(self, group: Any, pp: int) -> np.ndarray: ...

    def extras(self, group: Any, parts: tuple[int, ...]) -> float: ...

    def feasible_depths(self, group: Any) -> np.ndarray | None:
        """Per depth 1..P, whether some split fits in memory, ahead of the tables; None: no such check."""
        return None

    def fits(self, group: Any) -> bool | None:
        """Whether some depth has a split that fits in memory, without the tables; None: the tables say."""
        return None

    def lower_bound(self, group: Any, fitted: bool = True) -> float:
        """A lower bound of the proxy of every split of every depth (with ``fitted``: of the depths where
        a split fits in memory); the best-first search visits groups in its order. 0 bounds every proxy."""
        return 0.0

    def end_matrices(self, group: Any, pp: int) -> tuple[np.ndarray, float] | None:
        """X[s, j, e], the step end of stage s holding blocks [j, e) (identical blocks), and the
        tied-embedding sync, for the exact proxy optimum (``Engine.refine``); None: no refinement."""
        return None


@dataclass(frozen=True)
class Candidate:
    proxy_s: float
    key: tuple
    group: object
    parts: tuple[int, ...]


@dataclass
class Engine:
    model: SearchCostModel
    capacity_bytes: float
    keep: int = 32
    stats: SearchStats = field(default_factory=SearchStats)
    # max-heap by (proxy, group's order, rank in the group): entries negated, so that on equal
    # proxies the candidate of the earlier group (the earlier depth of a group) stays
    _heap: list = field(default_factory=list)
    _split_cache: dict = field(default_factory=dict)

    def dominated(self, proxy: float, order: int, rank: int = 0) -> bool:
        """True when a candidate of this proxy and place in the order cannot enter the K best."""
        return len(self._heap) >= self.keep and (-proxy, -order, -rank) < self._heap[0][:3]

    def _push(self, cand: Candidate, order: int, rank: int) -> None:
        item = (-cand.proxy_s, -order, -rank, cand)
        if len(self._heap) < self.keep:
            heapq.heappush(self._heap, item)
        elif item > self._heap[0]:
            heapq.heapreplace(self._heap, item)

    def _splits(
        self, group, tab: StageTables, hopeless: np.ndarray | None = None
    ) -> tuple[np.ndarray, dict[int, Split]]:
        """Bottleneck and split per depth; shared by groups whose tables name the same
        ``split_key`` (stage tables that do not depend on what differs between them). ``hopeless``
        (no shared key): depths the dynamic program skips, whose proxy cannot enter the K best
        whatever their split (``_hopeless``): they get no split."""
        key = tab.split_key
        assert hopeless is None or key is None, "a shared split serves groups of other places"
        if key is not None and key in self._split_cache:
            return self._split_cache[key]
        n = self.model.num_blocks
        if tab.homogeneous:
            result = waterfill_bottlenecks(tab.alpha, tab.beta, tab.nmax, n), {}
        else:
            result = self._dp_splits(group, tab, hopeless)
        if key is not None:
            self._split_cache[key] = result
        return result

    def _hopeless(self, group, tab: StageTables, order: int) -> np.ndarray:
        """Per depth, whether even its best split cannot enter the K best: the bottleneck is at least
        the mean cycle, constant / p (every cycle together is ``tab.constant``), so the proxy is at
        least weight x constant / p + constant (the extras are >= 0); judged at rank 0, the best a
        depth can take in its group's order."""
        least = self._pipeline_times(group, tab, tab.constant / np.arange(1, len(tab.constant) + 1))
        return np.array([self.dominated(float(x) * (1 - 1e-9), order, 0) for x in least])

    def _dp_splits(
        self, group, tab: StageTables, hopeless: np.ndarray | None = None
    ) -> tuple[np.ndarray, dict[int, Split]]:
        taus = np.full(len(tab.constant), INFEASIBLE)
        found: dict[int, Split] = {}
        start_costs, start_memory = tab.start_costs, tab.start_memory
        # depths where no split fits (the cost model's exact memory check, where it has one) have none to find
        fitting = self.model.feasible_depths(group)
        for p in range(1, len(tab.constant) + 1):
            if (fitting is not None and not fitting[p - 1]) or (hopeless is not None and hopeless[p - 1]):
                continue
            costs = tab.block_costs if tab.block_costs.ndim == 1 else tab.block_costs[p - 1, :p]
            split = dp_split(
                costs,
                tab.alpha[p - 1, :p],
                self.model.block_memory(group, p),
                tab.mem_fixed[p - 1, :p],
                self.capacity_bytes,
                None if start_costs is None else start_costs[p - 1, :p],
                None if start_memory is None else start_memory[p - 1, :p],
                tab.transient,
            )
            if split is not None:
                taus[p - 1], found[p] = split.bottleneck, split
        return taus, found

    def _pipeline_times(self, group, tab: StageTables, taus: np.ndarray) -> np.ndarray:
        """weight * bottleneck + constant per depth (inf where no split fits or the depth is barred)."""
        finite = np.isfinite(taus)
        weight = group.microbatches - 1 if tab.weight is None else tab.weight  # inf: a depth the group cannot take
        with np.errstate(invalid="ignore"):
            return np.where(
                finite & np.isfinite(weight), weight * np.where(finite, taus, 0.0) + tab.constant, INFEASIBLE
            )

    def fits(self, group) -> bool:
        """What run_group returns for this group, from the cost model's memory-only check where it has one."""
        verdict = self.model.fits(group)
        if verdict is None:
            tab = self.model.tables(group)
            verdict = bool(np.isfinite(self._pipeline_times(group, tab, self._splits(group, tab)[0])).any())
        return verdict

    def run_group(self, group, key: tuple, order: int | None = None) -> bool:
        """Search every depth of one group; True when some split fits. ``order`` is the group's place
        in the sequential order (ties between equal proxies go to the earlier group); by default the
        groups are taken to arrive in that order, and only then is the return value exact: given an
        order (the best-first search, which does not read it), depths of blocks of several kinds that
        cannot enter the K best are not split (``_hopeless``)."""
        given = order is not None
        order = self.stats.groups if order is None else order
        self.stats.groups += 1
        tab = self.model.tables(group)
        hopeless = None
        if given and not tab.homogeneous and tab.split_key is None:
            hopeless = self._hopeless(group, tab, order)
        taus, found = self._splits(group, tab, hopeless)
        pipe = self._pipeline_times(group, tab, taus)
        depths = len(pipe)
        self.stats.depths += depths
        feasible = np.isfinite(pipe)
        skipped = 0  # depths not split as hopeless that fit: pruned by the bound, not by memory
        if hopeless is not None:
            fitting = self.model.feasible_depths(group)
            skipped = int((hopeless if fitting is None else hopeless & fitting).sum())
        self.stats.pruned_bound += skipped
        self.stats.pruned_memory += int(depths - feasible.sum()) - skipped
        by_time = np.argsort(pipe, kind="stable")
        for rank, p_idx in enumerate(by_time):
            if not feasible[p_idx]:
                break
            if self.dominated(float(pipe[p_idx]), order, rank):  # sorted: every later depth is dominated too
                self.stats.pruned_bound += int(feasible[by_time[rank:]].sum())
                break
            p = int(p_idx) + 1
            split = found.get(p) or waterfill_split(
                tab.alpha[p_idx, :p], tab.beta, tab.nmax[p_idx, :p], self.model.num_blocks, float(taus[p_idx])
            )
            total = float(pipe[p_idx]) + self.model.extras(group, split.parts)
            self.stats.candidates += 1
            self._push(Candidate(total, key + (p,) + split.parts, group, split.parts), order, rank)
        return bool(feasible.any())

    def proxy(self, group, tab: StageTables, parts: tuple[int, ...]) -> float:
        """The proxy step time of one split (the objective the search ranks by)."""
        cycles = stage_cycles(tab, parts)
        return float((group.microbatches - 1) * cycles.max() + cycles.sum() + self.model.extras(group, parts))

    def refine(self, cand: Candidate, max_thresholds: int = 400) -> Candidate:
        """The exact proxy optimum of a finalist's (group, depth).

        The proxy is (m - 1) * max_s cycle_s + sum_s cycle_s + max_s X_s + const, with X_s the
        exposed sync and optimizer step of stage s (cost/stepend.py). For each bottleneck
        threshold tau, in increasing order from the min-max split's, the dynamic program finds
        the split with every cycle <= tau that minimises max_s X_s; the sweep stops when
        (m - 1) * tau alone cannot beat the best found.
        """
        group, parts = cand.group, cand.parts
        p = len(parts)
        tab = self.model.tables(group)
        ends = self.model.end_matrices(group, p) if p >= 2 and tab.homogeneous else None
        if ends is None:
            return cand
        x_mats, tied = ends
        alpha, beta, nmax = tab.alpha[p - 1, :p], tab.beta, tab.nmax[p - 1, :p]
        n1 = self.model.num_blocks + 1
        n = np.arange(n1)[None, :] - np.arange(n1)[:, None]
        cycles = alpha[:, None, None] + n[None] * beta
        allowed = (n[None] >= 1) & (n[None] <= nmax[:, None, None])
        const = float(alpha.sum() + self.model.num_blocks * beta + tied)
        m1 = group.microbatches - 1
        taus = np.unique(np.concatenate([alpha[s] + beta * np.arange(1, nmax[s] + 1) for s in range(p)]))
        taus = taus[taus >= stage_cycles(tab, parts).max() * (1 - 1e-12)]
        best_value, best_parts = cand.proxy_s, parts
        for tau in taus[:max_thresholds]:
            if m1 * tau + const >= best_value:
                break
            split = dp_split_matrix(np.where(allowed & (cycles <= tau * (1 + 1e-12)), x_mats, INFEASIBLE))
            if split is None:
                continue
            value = self.proxy(group, tab, split.parts)
            if value < best_value * (1 - 1e-12):
                best_value, best_parts = value, split.parts
        return Candidate(best_value, cand.key, group, best_parts)

    def best(self) -> list[Candidate]:
        return [item[3] for item in sorted(self._heap, reverse=True)]


def run(
    engine: Engine,
    groups: Iterable[tuple[object, tuple, object, int]],
    progress: Callable[[int], None] | None = None,
    escalate_from: int = 2,
) -> list[Candidate]:
    """groups yields (configuration key, full key, group, ZeRO stage), every replica count of a
    configuration at one ZeRO stage before the next stage. Stages below ``escalate_from`` are
    always searched; a higher one, with every replica count, for a configuration that fits
    nowhere at a lower stage."""
    start = time.perf_counter()
    lowest_fit: dict = {}  # configuration key -> the lowest ZeRO stage at which one of its groups fits
    for i, (cfg_key, key, group, zero) in enumerate(groups):
        if zero >= escalate_from and lowest_fit.get(cfg_key, zero) < zero:
            continue  # a lower ZeRO stage already fits this configuration
        if engine.run_group(group, key):
            lowest_fit[cfg_key] = min(zero, lowest_fit.get(cfg_key, zero))
        if progress is not None:
            progress(i)
    engine.stats.solve_time_s = time.perf_counter() - start
    return engine.best()


def run_best_first(
    engine: Engine,
    groups: Iterable[tuple[object, tuple, object, int]],
    progress: Callable[[int], None] | None = None,
    escalate_from: int = 2,
) -> list[Candidate]:
    """run()'s result (the same K best in the same order), visiting the groups by a lower bound.

    Needs a cost model with ``lower_bound(group, fitted)``, a lower bound of the proxy of every
    split of every depth of the group (with ``fitted``: of every depth where a split fits in
    memory), and (optionally) ``fits(group)``, the memory-only check. A first pass bounds every
    group; the second takes them cheapest bound first, each with its place in the sequential order
    (so ties break as in run()). A group met for the first time is checked as run() would check it,
    but only now: skipped when nothing of it fits, or when a group of its configuration at a lower
    ZeRO stage fits (from ``escalate_from`` on; ``_Escalation``); then its bound is tightened
    to the depths that fit, and if that moves it back, it waits its turn again. The search stops
    at the first group whose bound cannot enter the K best: every group still waiting has a bound
    no smaller, and is never checked for memory.
    """
    start = time.perf_counter()
    escalation = _Escalation(engine, escalate_from)
    queue = []
    for i, (cfg_key, key, group, zero) in enumerate(groups):
        if progress is not None:
            progress(i)  # the first pass: the second searches only the groups the bound leaves
        escalation.add(cfg_key, zero, group)
        queue.append((engine.model.lower_bound(group, fitted=False), i, True, cfg_key, zero, key, group))
    heapq.heapify(queue)
    while queue:
        bound, i, first, cfg_key, zero, key, group = heapq.heappop(queue)
        if engine.dominated(bound, i):
            engine.stats.skipped_bound += len(queue) + 1
            break
        if first:  # first time at the front: check the memory and the escalation, tighten the bound
            if not engine.fits(group):
                engine.stats.skipped_memory += 1
                continue
            if escalation.lower_stage_fits(cfg_key, zero):
                engine.stats.skipped_zero += 1
                continue
            tight = engine.model.lower_bound(group, fitted=True)
            if tight > bound:
                heapq.heappush(queue, (tight, i, False, cfg_key, zero, key, group))
                continue
        engine.run_group(group, key, order=i)
    engine.stats.configurations = len(escalation.stages)
    engine.stats.solve_time_s = time.perf_counter() - start
    return engine.best()


class _Escalation:
    """run()'s ZeRO rule, asked only for the groups the best-first search reaches: a group at ZeRO
    stage z >= ``escalate_from`` is skipped when some group of its configuration at a stage below z
    fits (run() meets those first, and raises the stage only for a configuration that fits nowhere
    below). Whether a stage's groups fit is checked once per configuration and stage, when first
    asked, stopping at the first that fits."""

    def __init__(self, engine: Engine, escalate_from: int) -> None:
        self.engine, self.escalate_from = engine, escalate_from
        self.stages: dict[object, dict[int, list]] = {}  # configuration -> ZeRO stage -> its groups
        self._fits: dict[tuple[object, int], bool] = {}  # (configuration, stage) -> whether a group fits
        self._last: tuple = (None, None, [])  # the configuration and stage added to last, and its groups

    def add(self, cfg_key: object, zero: int, group: object) -> None:
        if cfg_key is not self._last[0] or zero != self._last[1]:  # the search yields them in runs
            self._last = (cfg_key, zero, self.stages.setdefault(cfg_key, {}).setdefault(zero, []))
        self._last[2].append(group)

    def lower_stage_fits(self, cfg_key: object, zero: int) -> bool:
        if zero < self.escalate_from:
            return False
        return any(self._stage_fits(cfg_key, z) for z in sorted(self.stages[cfg_key]) if z < zero)

    def _stage_fits(self, cfg_key: object, zero: int) -> bool:
        found = self._fits.get((cfg_key, zero))
        if found is None:
            found = self._fits[(cfg_key, zero)] = any(self.engine.fits(g) for g in self.stages[cfg_key][zero])
        return found
