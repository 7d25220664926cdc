"""Splitting the layer graph into pipeline stages: the NEST dynamic program.

A stage at index s of a p-stage pipeline (0 = first) costs, per microbatch,
    cycle_s = alpha[s] + sum of its blocks' costs,
where alpha[s] holds what depends on the stage's position: the embedding (first
stage), the head (last), and the transfers to its successor and to its predecessor at
the network levels the placement gives those links. Its memory is
    mem_s = mem_fixed[s] + sum over its blocks of mem_layer[s, block],
which grows with the microbatches in flight at s (1F1B: p - s), so feasibility depends
on the position. With m microbatches the pipeline takes
    T = (m - 1) * max_s cycle_s + sum_s cycle_s        (cost/pipeline.py, v = 1),
and sum_s cycle_s = sum alpha + sum of all block costs does not depend on the split:
minimising T over splits is minimising the bottleneck max_s cycle_s.

``dp_split`` is the dynamic program over suffixes of the layer graph (NEST section 4,
eq. 3): stages are placed backward from the last; a state is (stages placed, first block
of the placed suffix), and the cost of the link to the not-yet-placed predecessor (the
"deferred forward cost") is charged through alpha, because under a rank-grid placement
its network level is fixed by the stage's index. States that break memory are pruned.
``waterfill_split`` is its closed form when all blocks are identical (docs/design.md section 5:
"identical transformer layers make stage costs depend only on layer counts and boundary
levels"): it needs only each stage's capacity in blocks. Both are exact; the property
tests check them against each other and against enumeration.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nestplan.cost.stage import PositionMemory

INFEASIBLE = float("inf")


@dataclass(frozen=True)
class Split:
    """Blocks per stage (first stage first) and the bottleneck cycle."""

    parts: tuple[int, ...]
    bottleneck: float


def dp_split(
    costs: np.ndarray,
    alpha: np.ndarray,
    mem_layer: np.ndarray,
    mem_fixed: np.ndarray,
    capacity: float,
    start_costs: np.ndarray | None = None,
    start_memory: np.ndarray | None = None,
    transient: np.ndarray | None = None,
) -> Split | None:
    """Min-max split of blocks ``costs`` (L,) into ``len(alpha)`` stages of >= 1 block.

    costs may also be (p, L): a block's cost when held by stage s (a cost model where a
    stage's position changes what its blocks cost, e.g. no recomputation on the last stage).
    mem_layer: (p, L) memory of each block when held by stage s; mem_fixed: (p,).
    start_costs, start_memory: optional (p, L), what stage s adds when its first block is
    block j (a transfer, or a stash, whose size is that of the edge entering block j).
    transient: optional (L + 1, L + 1), bytes a stage holding blocks [j, e) adds (the largest of their
    transient buffers). O(p L^2) with NumPy over the (start, end) pairs of each stage.
    """
    if len(alpha) > np.shape(costs)[-1]:
        return None
    return dp_split_matrix(
        stage_cost_matrix(costs, alpha, mem_layer, mem_fixed, capacity, start_costs, start_memory, transient)
    )


# a stage exactly at capacity fits: prefix-sum differences round in the last bits, so memory is compared
# with this relative slack (a byte in a terabyte)
FIT_RELATIVE_TOLERANCE = 1e-12


def stage_cost_matrix(
    costs: np.ndarray,
    alpha: np.ndarray,
    mem_layer: np.ndarray,
    mem_fixed: np.ndarray,
    capacity: float,
    start_costs: np.ndarray | None = None,
    start_memory: np.ndarray | None = None,
    transient: np.ndarray | None = None,
) -> np.ndarray:
    """(p, L + 1, L + 1): cost of stage s holding blocks [j, e), inf where it breaks memory
    or holds nothing (the arguments of dp_split)."""
    costs = np.asarray(costs)
    p, n_blocks = len(alpha), costs.shape[-1]
    per_stage = costs.ndim == 2
    prefix = np.concatenate([[0.0], np.cumsum(costs)]) if not per_stage else None
    start = np.arange(n_blocks + 1)[:, None]
    end = np.arange(n_blocks + 1)[None, :]
    stage_costs = np.empty((p, n_blocks + 1, n_blocks + 1))
    fits_below = capacity * (1 + FIT_RELATIVE_TOLERANCE)
    for s in range(p):
        if per_stage:
            prefix = np.concatenate([[0.0], np.cumsum(costs[s])])
        mem_prefix = np.concatenate([[0.0], np.cumsum(mem_layer[s])])
        extra_mem = 0.0 if start_memory is None else np.append(start_memory[s], 0.0)[:, None]
        extra_cost = 0.0 if start_costs is None else np.append(start_costs[s], 0.0)[:, None]
        held = mem_fixed[s] + extra_mem + mem_prefix[end] - mem_prefix[start]
        ok = (end > start) & ((held if transient is None else held + transient) <= fits_below)
        stage_costs[s] = np.where(ok, alpha[s] + extra_cost + prefix[end] - prefix[start], INFEASIBLE)
    return stage_costs


def dp_split_matrix(stage_costs: np.ndarray) -> Split | None:
    """The dynamic program on explicit stage costs: stage_costs[s, j, e] is the cost of stage s
    holding blocks [j, e) (inf where not allowed); minimises the largest stage cost.

    Backward over stages (the last first); best[j] is the bottleneck of the best placement of
    the suffix that starts at block j on the stages placed so far.
    """
    p, n1, _ = stage_costs.shape
    n_blocks = n1 - 1
    best, choice = _backward(stage_costs, 0)
    if not np.isfinite(best[0]):
        return None
    parts, j = [], 0
    for s in range(p):
        e = int(choice[s][j])
        parts.append(e - j)
        j = e
    assert j == n_blocks
    return Split(tuple(parts), float(best[0]))


def suffix_bottlenecks(stage_costs: np.ndarray) -> np.ndarray:
    """best[j]: the smallest bottleneck of stages 1..p-1 holding blocks [j, L) (inf where none
    fits), from which a caller can choose the first stage [0, j) by another criterion."""
    return _backward(stage_costs, 1)[0]


def _backward(stage_costs: np.ndarray, last: int) -> tuple[np.ndarray, np.ndarray]:
    """The backward recursion over stages p-1 .. last: best suffix bottleneck per start block."""
    p, n1, _ = stage_costs.shape
    best = np.full(n1, INFEASIBLE)
    best[n1 - 1] = -INFEASIBLE  # nothing placed yet
    choice = np.zeros((p, n1), dtype=np.int64)
    rows = np.arange(n1)
    for s in range(p - 1, last - 1, -1):
        total = np.maximum(stage_costs[s], best[None, :])
        choice[s] = np.argmin(total, axis=1)
        best = total[rows, choice[s]]
        if s > 0:
            best[0] = INFEASIBLE  # only the first stage may start at block 0
    return best, choice


def _counts(tau: np.ndarray, a: np.ndarray, beta: float, cap: np.ndarray) -> np.ndarray:
    """Blocks each stage can hold under bottleneck ``tau``: min(cap, floor((tau - alpha) / beta))."""
    fit = np.floor((tau[:, None] - a) / beta + 1e-9)
    return np.minimum(np.maximum(fit, 0.0), cap)


def waterfill_bottlenecks(alpha: np.ndarray, beta: float, nmax: np.ndarray, n_blocks: int) -> np.ndarray:
    """Smallest bottleneck per row for identical blocks of cost ``beta``; inf where no split fits.

    alpha, nmax: (rows, width); a row is one pipeline (stages beyond its depth have
    nmax = 0). A stage holding n blocks costs alpha + n * beta and holds at most nmax
    blocks; every real stage holds at least one. The bottleneck tau is feasible when
    sum_s min(nmax_s, floor((tau - alpha_s) / beta)) >= L. Bisection narrows tau to an
    interval shorter than beta, inside which every stage gains at most one block; the
    exact answer is then the threshold at which the L-th block fits.
    """
    real = nmax > 0
    depth = real.sum(axis=1)
    cap = np.where(real, nmax, 0).astype(float)
    feasible = (cap.sum(axis=1) >= n_blocks) & (depth <= n_blocks) & (depth > 0)
    feasible &= ~np.any((nmax <= 0) & np.isfinite(alpha), axis=1)
    a = np.where(real, alpha, np.inf)
    tau_min = np.max(np.where(real, alpha + beta, -np.inf), axis=1)  # every stage holds >= 1
    lo = np.min(np.where(real, alpha, np.inf), axis=1)  # no stage holds a block
    hi = np.max(np.where(real, alpha + np.maximum(nmax, 1) * beta, -np.inf), axis=1)
    lo = np.where(feasible, lo, 0.0)
    hi = np.where(feasible, hi, 0.0)
    while np.any(hi - lo > 0.5 * beta):
        mid = 0.5 * (lo + hi)
        ok = _counts(mid, a, beta, cap).sum(axis=1) >= n_blocks
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
    base = _counts(lo, a, beta, cap)
    gain_at = np.where(base < cap, a + (base + 1) * beta, np.inf)  # where each stage takes one more block
    gain_at.sort(axis=1)
    need = np.clip(n_blocks - base.sum(axis=1).astype(np.int64), 1, gain_at.shape[1])
    tau = np.maximum(gain_at[np.arange(len(need)), need - 1], tau_min)
    return np.where(feasible, tau, INFEASIBLE)


def waterfill_split(alpha: np.ndarray, beta: float, nmax: np.ndarray, n_blocks: int, tau: float) -> Split:
    """A split of one pipeline whose bottleneck is at most ``tau`` (from waterfill_bottlenecks)."""
    fit = np.floor((tau - alpha) / beta * (1 + 1e-12) + 1e-9)
    parts = np.clip(fit, 1, nmax).astype(np.int64)
    excess = int(parts.sum()) - n_blocks
    assert excess >= 0, "tau is not feasible"
    while excess > 0:  # take blocks back from the most expensive stages, later stages first on ties
        cost = np.where(parts > 1, alpha + parts * beta, -np.inf)
        s = int(len(cost) - 1 - np.argmax(cost[::-1]))
        parts[s] -= 1
        excess -= 1
    return Split(tuple(int(x) for x in parts), float(np.max(alpha + parts * beta)))


def fitting_depths(memory: PositionMemory, capacity: float, depths: int) -> np.ndarray:
    """Per depth p = 1..``depths``, whether some split of the L blocks over p stages, each holding >= 1, fits
    in ``capacity`` (what ``dp_split`` finds finite, compared as it compares), for blocks that hold
    different bytes.

    A stage's fixed bytes and its blocks' bytes depend on its distance k = p - s from the last stage
    only (and on being first), so one backward pass serves every depth: ``reach`` marks the blocks j
    from which the last k stages can hold blocks [j, L); depth k + 1 fits where a first stage holds
    [0, e) for such an e; a middle stage at distance k + 1 then extends ``reach``. O(depths L^2) with NumPy."""
    L = memory.blocks.shape[1]
    below = capacity * (1 + FIT_RELATIVE_TOLERANCE)
    prefix = np.concatenate([np.zeros((L, 1)), np.cumsum(memory.blocks, axis=1)], axis=1)  # [k - 1, j]
    transient = memory.transient
    j = np.arange(L + 1)
    depths = min(depths, L)
    out = np.zeros(depths, dtype=bool)
    out[0] = memory.single + prefix[0, L] - prefix[0, 0] + transient[0, L] <= below
    reach = (memory.last + prefix[0, L] - prefix[0] + transient[:, L] <= below) & (j >= 1) & (j < L)
    for p in range(2, depths + 1):
        row = prefix[p - 1]
        first = (memory.first[p - 1] + row - row[0] + transient[0] <= below) & (j >= 1)
        out[p - 1] = bool((first & reach).any())
        ends = np.flatnonzero(reach)
        if p == depths or not len(ends):
            continue
        holds = memory.middle + row[ends][None, :] - row[:, None] + transient[:, ends] <= below
        reach = (holds & (j[:, None] < ends[None, :])).any(axis=1) & (j >= 1)
    return out
