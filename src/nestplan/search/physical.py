"""nestplan's physical cost model, seen by the search: stage tables for every pipeline depth.

For one group (sub-graph configuration, ZeRO stage, replicas d) it arranges, for all depths
p = 1..P at once, the per-position quantities of search/partition.py: the node terms
(cost/terms.py), the stage quantities (cost/stage.py) and step-end rules (cost/stepend.py) the
evaluator uses, with the network levels the placement gives. It computes no time, byte count
or memory term of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
import numpy as np

from nestplan.cluster import Cluster
from nestplan.cost import comm
from nestplan.cost import stage
from nestplan.cost.memory import moe_a2a_early
from nestplan.cost.stepend import SyncContext, step_end, tied_embedding_sync
from nestplan.cost.terms import TERM_GROUPS, GraphTerms, TermCache, shard_of, terms_zero
from nestplan.job import Job
from nestplan.model.spec import ModelSpec
from nestplan.strategy.placement import EXPERT_GROUP_KEYS, TopologyPlacements
from nestplan.search.engine import SearchCostModel, StageTables
from nestplan.search.partition import FIT_RELATIVE_TOLERANCE, fitting_depths
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import ZeroStage
from nestplan.strategy.subgraph import SubGraph


# a depth is refused by stage.least_stage_bytes only this far past the capacity: the floor sums in another
# order than fitting_depths, so it must not refuse what that check would find fitting to the last bit
FLOOR_SLACK = 1e-9


@dataclass
class FeasibleMemo:
    """Which pipeline depths fit in memory, by memory key (``feasible_depths``), shared by the searches of
    one model and job on several sizes of one accelerator (search/sizes.py): what a stage holds depends on
    the sub-graph, the ZeRO stage, the replicas that shard it and the microbatches in flight, never on the
    network or the rank order. ``owner`` is what the answers hold for, set by the first search."""

    owner: tuple | None = None
    answers: dict = field(default_factory=dict)

    def bind(self, owner: tuple) -> dict:
        """The answers, for a search of ``owner`` (model, job, accelerator, capacity)."""
        if self.owner is None:
            self.owner = owner
        assert self.owner == owner, "a FeasibleMemo serves one model, job, accelerator and capacity"
        return self.answers


@dataclass(frozen=True)
class Group:
    """One outer-loop point: the DP runs over every pipeline depth of it."""

    sub: SubGraph
    order: tuple[str, ...]  # the rank order
    zero: ZeroStage
    replicas: int
    microbatches: int
    max_depth: int

    def dims(self, pp: int = 1, parts: tuple[int, ...] | None = None) -> ParallelDims:
        return ParallelDims.of(self.sub, pp=pp, dp=self.replicas, zero=self.zero, layers_per_stage=parts)


class PhysicalSearchModel(SearchCostModel):
    """The search's view of nestplan's evaluator for one (model, cluster, job): the shared stage
    quantities of cost/stage.py arranged per group."""

    def __init__(
        self,
        model: ModelSpec,
        cluster: Cluster,
        job: Job,
        devices: int,
        capacity_bytes: float | None = None,
        feasible_memo: FeasibleMemo | None = None,
    ) -> None:
        self.model, self.cluster, self.job, self.devices = model, cluster, job, devices
        # memory a stage may use (the planner's margin taken off the device's capacity)
        self.capacity_bytes = cluster.accelerator.hbm_bytes if capacity_bytes is None else capacity_bytes
        self.placement = TopologyPlacements(cluster.topology)
        self.term_cache = TermCache(model, cluster, job)
        self.num_blocks = model.num_layers
        self._terms: dict[tuple, GraphTerms] = {}
        self._memory_terms: dict[tuple, GraphTerms] = {}
        self._cycle_sums: dict[tuple, stage.CycleSums] = {}
        self._sync: dict[tuple, SyncContext] = {}
        self._contexts: dict[tuple, stage.StageContext] = {}  # per (ZeRO stage, dense and expert shard ranks)
        self._sums: dict[tuple, stage.StageSums] = {}
        self._feasible: tuple = (None, None)  # the last group's feasible_depths (fits, then lower_bound, ask)
        memo = feasible_memo or FeasibleMemo()
        self._feasible_by_key: dict[tuple, np.ndarray] = memo.bind(
            (model, job, cluster.accelerator, self.capacity_bytes)
        )
        self._inflight: dict[int, np.ndarray] = {}  # first_stage_in_flight by microbatches (up to L)
        self._transfers: dict[SubGraph, np.ndarray] = {}  # _per_level_transfer by sub-graph
        self._block_kinds = tuple(model.block_kind(i) for i in range(model.num_layers))
        # index of each block's kind in GraphTerms.blocks, whose kinds are in the order they first appear
        order = {kind: n for n, kind in enumerate(dict.fromkeys(self._block_kinds))}
        self._mixed = len(order) > 1  # blocks of several kinds: a stage's sums depend on where it starts
        self._kinds = np.array([order[kind] for kind in self._block_kinds], np.int64)
        self._kind_counts = tuple(int(n) for n in np.bincount(self._kinds))  # blocks of each kind, in that order

    # ------------------------------------------------------------------ terms
    def _groups(self, g: Group, pp: int) -> dict:
        c = g.sub
        return {
            k: (
                self.placement.expert_group(g.order, k, c.tp, c.expert_tp, c.cp, c.ep, g.replicas, pp)
                if k in EXPERT_GROUP_KEYS
                else self.placement.group(g.order, k, c.tp, c.cp, c.ep, g.replicas, pp)
            )
            for k in TERM_GROUPS
        }

    def terms(self, g: Group) -> GraphTerms:
        """Node terms; ZeRO-2's per-microbatch reduce-scatters and ZeRO-3's gathers depend on the
        replicas, so their terms are cached per replica count. Both are costed on the depth-1
        data-parallel group (the exact evaluation of the finalists uses the true group)."""
        key = self._terms_key(g)
        found = self._terms.get(key)
        if found is None:
            found = self._terms[key] = self.term_cache.graph_terms(g.dims(), self._groups(g, 1))
        return found

    @staticmethod
    def _terms_key(g: Group, zero: ZeroStage | None = None) -> tuple:
        """The key of ``terms`` for ``g``, or for ``g`` at ZeRO stage ``zero``."""
        zero = g.zero if zero is None else zero
        return g.sub, g.order, terms_zero(zero), g.replicas if zero >= ZeroStage.GRADIENTS else 0

    def memory_terms(self, g: Group) -> GraphTerms:
        """Node terms whose memory fields (params, activations, transients) are the group's own: those
        of the first replica count and rank order met with the group's shard and ZeRO stage. Only the
        communication depends on the replicas and the order (``terms``), never what a node holds."""
        key = (g.sub, terms_zero(g.zero))
        if key not in self._memory_terms:
            self._memory_terms[key] = self.terms(g)
        return self._memory_terms[key]

    def _stage_context(self, g: Group) -> stage.StageContext:
        c = g.sub
        key = (g.zero, c.cp * c.ep * g.replicas, c.cp * g.replicas)  # the cp+ep+dp and cp+dp groups
        found = self._contexts.get(key)
        if found is None:
            found = self._contexts[key] = stage.StageContext.on(
                self.job, g.zero, key[1], key[2], self.cluster.accelerator, self.capacity_bytes
            )
        return found

    def _sync_context(self, g: Group, pp: int) -> SyncContext:
        key = (g.sub, g.order, g.zero, g.replicas, pp)
        found = self._sync.get(key)
        if found is None:
            c = g.sub
            dense, expert = (
                self.placement.group(g.order, k, c.tp, c.cp, c.ep, g.replicas, pp) for k in ("cp+ep+dp", "cp+dp")
            )
            found = self._sync[key] = SyncContext(
                self.cluster.topology, self.cluster.accelerator, self.job, g.zero, dense, expert
            )
        return found

    def _tied_sync(self, g: Group, pp: int) -> float:
        ends = self.placement.pp_ends(g.order, g.sub.stage_devices, g.replicas, pp)
        return tied_embedding_sync(self.model, self.cluster.topology, g.sub.tp, self.job, ends)

    # ------------------------------------------------------------------ tables
    def _per_level_transfer(self, g: Group) -> np.ndarray:
        """Seconds of one boundary transfer at each level, and 0 at index -1 (no link): the sub-graph's
        activations, the same for every ZeRO stage, replica count and rank order (kept per SubGraph)."""
        found = self._transfers.get(g.sub)
        if found is None:
            shard = shard_of(g.sub, self.job)
            topo = self.cluster.topology
            times = [comm.boundary_time(topo, self.model, shard, lv) for lv in range(topo.num_levels)]
            found = self._transfers[g.sub] = np.array(times + [0.0])
        return found

    def boundary_times(self, g: Group, pp: int) -> np.ndarray:
        levels = self.placement.boundary_levels(g.order, g.sub.stage_devices, g.replicas, pp)
        return self._per_level_transfer(g)[list(levels)]

    def tables(self, g: Group) -> StageTables:
        t = self.terms(g)
        ctx = self._stage_context(g)
        blocks = stage.block_arrays(ctx, t, self._kinds)
        # bt[p - 1, s + 1] = transfer over the link between stages s and s + 1 of a p-stage pipeline
        P = g.max_depth
        bt = self._per_level_transfer(g)[self.placement.level_matrix(g.order, g.sub.stage_devices, g.replicas, P)]
        pos = stage.position_tables(ctx, t, blocks, g.microbatches, bt)
        return StageTables(
            alpha=pos.alpha,
            nmax=pos.nmax,
            beta=float(blocks.costs[0]),
            block_costs=blocks.costs,
            mem_fixed=pos.mem_fixed,
            constant=pos.constant,
            homogeneous=blocks.homogeneous,
            transient=None if blocks.homogeneous else stage.range_transients(blocks.transients),
        )

    # ------------------------------------------------------------------ before the tables
    def feasible_depths(self, g: Group) -> np.ndarray:
        """Per depth 1..P, whether some split fits in memory (every stage holds >= 1 block and
        together they hold all: where the tables' split is finite), from the stage capacities
        alone (blocks that hold different bytes: from where each stage may start, partition.py)."""
        if self._feasible[0] == g:
            return self._feasible[1]
        # Whether depth p fits depends on the stages of depth p only, not on the deepest the group
        # may take; the capacities depend on the memory terms (the sub-graph's and the ZeRO stage's,
        # not the rank order's or the network's), the ZeRO shards (none below ZeRO 1) and the
        # microbatches in flight, min(k, m) at k <= L. Groups that share those share the answer for
        # every depth up to L, of which each takes its first P.
        key = (g.sub, g.zero, g.replicas if g.zero else 0, min(g.microbatches, self.num_blocks))
        every = self._feasible_by_key.get(key)
        if every is None or len(every) < min(g.max_depth, self.num_blocks):
            every = self._feasible_by_key[key] = self._feasible_depths(g)
        out = every[: g.max_depth]
        self._feasible = (g, out)
        return out

    def _feasible_depths(self, g: Group) -> np.ndarray:
        """feasible_depths for every depth 1..L (blocks of different bytes: 1..P, the group's deepest)."""
        ctx = self._stage_context(g)
        L = self.num_blocks
        m = min(g.microbatches, L)
        inflight = self._inflight.get(m)
        if inflight is None:
            inflight = self._inflight[m] = stage.first_stage_in_flight(m, L, moe_a2a_early(self.job))
        if self._mixed:  # whether two kinds of block hold the same bytes depends on all their terms
            t = self.memory_terms(g)
            held = {(ctx.node_state_bytes(b), b.activations, b.transient) for b in t.blocks.values()}
            if len(held) > 1:
                deepest = min(g.max_depth, L)
                floor = stage.least_stage_bytes(ctx, t, self._kinds, deepest, float(inflight[:deepest].min()))
                if floor > ctx.capacity_bytes * (1 + FIT_RELATIVE_TOLERANCE) * (1 + FLOOR_SLACK):
                    return np.zeros(deepest, dtype=bool)  # not even the deepest split's mean fits: no depth does
                memory = stage.position_memory(ctx, t, self._kinds, inflight)
                return fitting_depths(memory, ctx.capacity_bytes, g.max_depth)
            block = next(iter(t.blocks.values()))
        else:
            t = self.memory_terms(g)
            block = t.blocks[self._block_kinds[0]]
        cap = stage.position_capacity(ctx, t, ctx.node_state_bytes(block), block.activations, inflight)
        # depth p >= 2: first stage (k = p), middle stages k = 2 .. p - 1, last stage (k = 1)
        inner = cap.middle[1:-1]
        short = np.concatenate([[0], np.cumsum(inner < 1)])
        held = np.concatenate([[0], np.cumsum(inner)])
        deeper = (cap.first[1:] >= 1) & (short == 0) & (cap.first[1:] + cap.last + held >= L)
        return np.concatenate([[cap.single >= L], deeper & (cap.last >= 1)])

    def fits(self, g: Group) -> bool:
        """Whether some depth of the group has a split that fits in memory (what the engine's
        run_group returns)."""
        return bool(self.feasible_depths(g).any())

    def lower_bound(self, g: Group, fitted: bool = True) -> float:
        """A lower bound of the proxy step time of every split of every depth of the group (with
        ``fitted``: of every depth where a split fits in memory), from the node terms alone
        (arrangement of the cost model's terms).

        Depth 1 holds everything: (m - 1) * cycle + cycle with cycle = embedding + head + blocks.
        At depth p >= 2 transfers are >= 0, every stage holds >= 1 block, the largest holds >=
        ceil(L / p) and the bottleneck is >= the mean cycle, so (m - 1) * max(those) + embedding +
        head + blocks bounds it. Each bound falls with p and none exceeds depth 1's, so the bound
        of the deepest depth that fits bounds them all (depth P without ``fitted``). The step end
        (extras) is >= 0. The result is shrunk by 1e-9 against rounding.

        Without ``fitted``, a group at ZeRO 2 or 3 is bounded by its terms at ZeRO 0: those stages only add
        their collectives' exposed seconds to a node's (terms._zero_exposed), so the bound stays below, and
        it needs no terms of the group's own replica count (the best-first search bounds every group before
        it knows which it will reach)."""
        below = not fitted and g.zero >= ZeroStage.GRADIENTS
        key = self._terms_key(g, ZeroStage.NONE if below else None)
        sums = self._cycle_sums.get(key)
        if sums is None:
            terms = self.terms(replace(g, zero=ZeroStage.NONE) if below else g)
            sums = self._cycle_sums[key] = stage.cycle_sums(terms, self._kind_counts)
        ends = sums.embedding + sums.head
        depths = self.feasible_depths(g) if fitted else None
        deepest = g.max_depth if depths is None or not depths.any() else int(np.flatnonzero(depths)[-1]) + 1
        if deepest < 2:
            return g.microbatches * (ends + sums.blocks) * (1 - 1e-9)
        bottleneck = max(
            max(sums.embedding, sums.head) + sums.cheapest_block,
            -(-self.num_blocks // deepest) * sums.cheapest_block,
            (ends + sums.blocks) / deepest,
        )
        return ((g.microbatches - 1) * bottleneck + ends + sums.blocks) * (1 - 1e-9)

    def block_memory(self, g: Group, pp: int) -> np.ndarray:
        """(pp, L) bytes of each block held by each stage (for the general DP)."""
        return stage.block_memory(self._stage_context(g), self.terms(g), self._kinds, pp, g.microbatches)

    # ------------------------------------------------------------------ objective
    def end_matrices(self, g: Group, pp: int) -> tuple[np.ndarray, float]:
        """X[s, j, e]: exposed sync and optimizer of stage s holding blocks [j, e) (identical blocks),
        and the tied-embedding sync; step_end's max over stages of X is the proxy's step end."""
        t = self.terms(g)
        x = stage.end_matrices(
            self._sync_context(g, pp), t, t.blocks[self._block_kinds[0]], self.num_blocks, self.boundary_times(g, pp)
        )
        return x, self._tied_sync(g, pp)

    def extras(self, g: Group, parts: tuple[int, ...]) -> float:
        """Step-end seconds (exposed sync, tied-embedding sync, optimizer) of one split."""
        pp = len(parts)
        t = self.terms(g)
        sums, start = [], 0
        for s, n in enumerate(parts):
            sums.append(self._stage_sums(t, s, pp, start, n))
            start += n
        end = step_end(self._sync_context(g, pp), *stage.step_end_inputs(sums), list(self.boundary_times(g, pp)))
        return end.total_s + self._tied_sync(g, pp)

    def _stage_sums(self, t: GraphTerms, s: int, pp: int, start: int, n: int) -> stage.StageSums:
        """A stage's summed nodes, kept per (terms, position, blocks held): splits share most stages."""
        key = (id(t), s == 0, s == pp - 1, pp > 1, start if self._mixed else 0, n)
        found = self._sums.get(key)
        if found is None:
            found = self._sums[key] = stage.stage_sums(t, self._block_kinds[start : start + n], s, pp)
        return found
