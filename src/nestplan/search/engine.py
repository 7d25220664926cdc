"""The search engine: outer loops over groups, the split of every depth, exact ranking.

For every group (sub-graph configuration, ZeRO stage, replicas) the engine asks the cost
model for stage tables over all pipeline depths, solves each depth's split (closed form for
identical blocks, the dynamic program otherwise), and keeps the best candidates by the
proxy step time (m - 1) * bottleneck + sum of cycles + step-end terms. A depth whose
pipeline time alone already exceeds the K-th best candidate is pruned (dominated), as is
one whose stages cannot fit in memory. ZeRO is raised for a configuration only when none of
its plans fits at the lower stage (NEST section 4).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol

import numpy as np

from nestplan.search.partition import INFEASIBLE, Split, dp_split, waterfill_bottlenecks, waterfill_split


class SearchCostModel(Protocol):
    """What the engine needs of a cost model (nestplan's physical one, or the NEST authors')."""

    num_blocks: int

    def tables(self, group): ...
    def block_memory(self, group, pp: int) -> np.ndarray: ...
    def extras(self, group, parts: tuple[int, ...]) -> float: ...


@dataclass(frozen=True)
class Candidate:
    proxy_s: float
    key: tuple
    group: object
    parts: tuple[int, ...]


@dataclass
class SearchStats:
    groups: int = 0
    depths: int = 0              # (group, depth) pairs considered
    pruned_memory: int = 0       # depths where no split fits in memory
    pruned_bound: int = 0        # depths dominated by the K best before their step end was costed
    candidates: int = 0          # splits whose full proxy was computed
    solve_time_s: float = 0.0


@dataclass
class Engine:
    model: SearchCostModel
    capacity_bytes: float
    keep: int = 32
    stats: SearchStats = field(default_factory=SearchStats)
    _heap: list = field(default_factory=list)   # max-heap by (proxy, arrival): entries negated
    _arrivals: int = 0

    @property
    def threshold(self) -> float:
        return -self._heap[0][0] if len(self._heap) >= self.keep else INFEASIBLE

    def _push(self, cand: Candidate) -> None:
        self._arrivals += 1
        item = (-cand.proxy_s, -self._arrivals, cand)   # ties: the earlier candidate stays
        if len(self._heap) < self.keep:
            heapq.heappush(self._heap, item)
        elif item > self._heap[0]:
            heapq.heapreplace(self._heap, item)

    def _splits(self, group, tab) -> tuple[np.ndarray, dict[int, Split]]:
        n = self.model.num_blocks
        if tab.homogeneous:
            return waterfill_bottlenecks(tab.alpha, tab.beta, tab.nmax, n), {}
        taus = np.full(len(tab.constant), INFEASIBLE)
        found: dict[int, Split] = {}
        for p in range(1, len(tab.constant) + 1):
            split = dp_split(tab.block_costs, tab.alpha[p - 1, :p], self.model.block_memory(group, p),
                             tab.mem_fixed[p - 1, :p], self.capacity_bytes)
            if split is not None:
                taus[p - 1], found[p] = split.bottleneck, split
        return taus, found

    def run_group(self, group, key: tuple) -> bool:
        """Search every depth of one group; True when some split fits."""
        self.stats.groups += 1
        tab = self.model.tables(group)
        taus, found = self._splits(group, tab)
        finite = np.isfinite(taus)
        pipe = np.where(finite, (group.microbatches - 1) * np.where(finite, taus, 0.0) + tab.constant, INFEASIBLE)
        depths = len(pipe)
        self.stats.depths += depths
        feasible = np.isfinite(pipe)
        self.stats.pruned_memory += int(depths - feasible.sum())
        order = np.argsort(pipe, kind="stable")
        for rank, p_idx in enumerate(order):
            if not feasible[p_idx]:
                break
            if pipe[p_idx] >= self.threshold:   # sorted: every later depth is dominated too
                self.stats.pruned_bound += int(feasible[order[rank:]].sum())
                break
            p = int(p_idx) + 1
            split = found.get(p) or waterfill_split(tab.alpha[p_idx, :p], tab.beta, tab.nmax[p_idx, :p],
                                                    self.model.num_blocks, float(taus[p_idx]))
            total = float(pipe[p_idx]) + self.model.extras(group, split.parts)
            self.stats.candidates += 1
            self._push(Candidate(total, key + (p,) + split.parts, group, split.parts))
        return bool(feasible.any())

    def best(self) -> list[Candidate]:
        return [item[2] for item in sorted(self._heap, reverse=True)]


def run(engine: Engine, groups: Iterable[tuple[object, tuple, object, object]],
        progress: Callable[[int], None] | None = None) -> list[Candidate]:
    """groups yields (configuration key, full key, group, ZeRO stage), every replica count of a
    configuration at one ZeRO stage before the next stage."""
    start = time.perf_counter()
    fits: set = set()
    tried_zero: dict = {}
    for i, (cfg_key, key, group, zero) in enumerate(groups):
        first_zero = tried_zero.setdefault(cfg_key, zero)
        if zero != first_zero and cfg_key in fits:
            continue   # a lower ZeRO stage already fits this configuration
        if engine.run_group(group, key):
            fits.add(cfg_key)
        if progress is not None:
            progress(i)
    engine.stats.solve_time_s = time.perf_counter() - start
    return engine.best()
