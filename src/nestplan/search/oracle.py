"""Exhaustive enumeration of the planner's space, for checking the dynamic program.

Every group the planner visits, every pipeline depth and every composition of the blocks
into that many stages (each holding >= 1): the pipeline time of each split that fits is
computed from the same stage tables, without the split solvers and without pruning. Only
for small instances (the number of compositions grows as C(L - 1, p - 1)).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Iterator

import numpy as np

from nestplan.search.physical import Group


@dataclass(frozen=True)
class Enumerated:
    group: Group
    parts: tuple[int, ...]
    pipeline_s: float  # (m - 1) * bottleneck + sum of cycles; the proxy adds cost.extras(group, parts)
    lower_s: float  # max_s (sum of the cycles before s + m * cycle_s): no 1F1B schedule is shorter


def compositions(n: int, k: int) -> Iterator[tuple[int, ...]]:
    """All ordered ways to write n as k positive parts."""
    for cuts in combinations(range(1, n), k - 1):
        bounds = (0,) + cuts + (n,)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(k))


def enumerate_group(cost, group: Group, capacity: float) -> Iterator[Enumerated]:
    tab = cost.tables(group)
    n = cost.num_blocks
    for p in range(1, group.max_depth + 1):
        alpha = tab.alpha[p - 1, :p]
        mem = cost.block_memory(group, p)
        fixed = tab.mem_fixed[p - 1, :p]
        for parts in compositions(n, p):
            edges = np.concatenate([[0], np.cumsum(parts)])
            cycles = [alpha[s] + tab.block_costs[edges[s] : edges[s + 1]].sum() for s in range(p)]
            memory = [fixed[s] + mem[s, edges[s] : edges[s + 1]].sum() for s in range(p)]
            if tab.transient is not None:  # blocks of different kinds: each stage's largest transient
                memory = [held + tab.transient[edges[s], edges[s + 1]] for s, held in enumerate(memory)]
            if max(memory) > capacity:
                continue
            m = group.microbatches
            pipeline = (m - 1) * max(cycles) + sum(cycles)
            # stage s sees its first input after the stages before it ran forward, is busy m
            # cycles, and the stages before it still run their last backward afterwards
            lower = max(sum(cycles[:s]) + m * cycles[s] for s in range(p))
            yield Enumerated(group, parts, pipeline, lower)
