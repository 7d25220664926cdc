"""nestplan's physical cost model, seen by the search: stage tables for every pipeline depth.

For one group (sub-graph configuration, ZeRO stage, replicas d) it builds, for all depths
p = 1..P at once, the per-position quantities of search/partition.py from the same node
terms (cost/terms.py) and step-end rules (cost/stepend.py) the evaluator uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from nestplan.cost import comm
from nestplan.cost.memory import ShardGroups, in_flight_microbatches, model_state_bytes
from nestplan.cost.stepend import SyncContext, step_end, tied_embedding_sync
from nestplan.cost.terms import GraphTerms, graph_terms, shard_of
from nestplan.job import Job
from nestplan.model import layers as L
from nestplan.model.spec import ModelSpec
from nestplan.search.levels import SearchPlacement
from nestplan.search.space import SubConfig
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Schedule, ZeroStage

BWD_KEYS = ("backward_compute", "recompute")


@dataclass(frozen=True)
class Group:
    """One outer-loop point: the DP runs over every pipeline depth of it."""

    cfg: SubConfig
    zero: ZeroStage
    replicas: int
    microbatches: int
    max_depth: int

    def dims(self, pp: int = 1, parts: tuple[int, ...] | None = None) -> ParallelDims:
        c = self.cfg
        return ParallelDims(tp=c.tp, pp=pp, dp=self.replicas, cp=c.cp, ep=c.ep, sp=c.sp, zero=self.zero,
                            recompute=c.recompute, micro_batch_size=c.micro_batch_size, layers_per_stage=parts)


@dataclass(frozen=True)
class Tables:
    """Stage tables of one group for depths 1..P (row p-1 = depth p; columns = stage index)."""

    alpha: np.ndarray       # (P, P) seconds; -inf beyond the depth
    nmax: np.ndarray        # (P, P) most blocks a stage can hold; 0 beyond the depth
    beta: float             # seconds per block (identical blocks) ...
    block_costs: np.ndarray  # ... or per block (L,)
    mem_fixed: np.ndarray   # (P, P) bytes per stage besides its blocks
    constant: np.ndarray    # (P,) sum of alpha + all blocks: the depth-dependent part of sum_s cycle_s
    homogeneous: bool


class PhysicalSearchModel:
    """The search's view of nestplan's evaluator for one (model, cluster, job)."""

    def __init__(self, model: ModelSpec, cluster: Any, job: Job, devices: int) -> None:
        self.model, self.cluster, self.job, self.devices = model, cluster, job, devices
        self.placement = SearchPlacement(cluster.topology)
        self.num_blocks = model.num_layers
        self._terms: dict[tuple, GraphTerms] = {}
        self._memory_terms: dict[tuple, GraphTerms] = {}
        self._bound_terms: dict[tuple, tuple[float, float, float, float]] = {}   # lower_bound's sums of the terms
        # index of each block's kind in sorted(GraphTerms.blocks): 0 = dense, 1 = MoE (when both exist)
        moe = np.array([model.is_moe_layer(i) for i in range(model.num_layers)])
        self._kinds = moe.astype(np.int64) if moe.any() and not moe.all() else np.zeros(model.num_layers, np.int64)
        self._kind_counts = tuple(int(n) for n in np.bincount(self._kinds))   # blocks of each kind, in that order

    # ------------------------------------------------------------------ terms
    def _groups(self, g: Group, pp: int) -> dict:
        c = g.cfg
        keys = ("tp", "cp", "ep", "cp+ep+dp", "cp+dp")
        return {k: self.placement.group(c.order, k, c.tp, c.cp, c.ep, g.replicas, pp) for k in keys}

    def terms(self, g: Group) -> GraphTerms:
        """Node terms; ZeRO-2's per-microbatch reduce-scatters and ZeRO-3's gathers depend on the
        replicas, so their terms are cached per replica count. Both are costed on the depth-1
        data-parallel group (the exact evaluation of the finalists uses the true group)."""
        key = self._terms_key(g)
        if key not in self._terms:
            self._terms[key] = graph_terms(self.model, self.cluster, g.dims(), self.job, self._groups(g, 1))
        return self._terms[key]

    @staticmethod
    def _terms_key(g: Group) -> tuple:
        return g.cfg, g.zero, g.replicas if g.zero >= ZeroStage.GRADIENTS else 0

    def memory_terms(self, g: Group) -> GraphTerms:
        """Node terms whose memory fields (params, activations, transients) are the group's own: those
        of the first replica count met with the group's configuration and ZeRO stage. Only ZeRO-2/3's
        communication depends on the replicas (``terms``), never what a node holds."""
        key = (g.cfg, g.zero)
        if key not in self._memory_terms:
            self._memory_terms[key] = self.terms(g)
        return self._memory_terms[key]

    def _state_bytes(self, g: Group, params: L.ParamCount) -> float:
        """Weights + gradients + optimizer state of ``params`` on one device under the group's ZeRO."""
        shards = ShardGroups(g.cfg.cp * g.cfg.ep * g.replicas, g.cfg.cp * g.replicas)
        j = self.job
        return sum(model_state_bytes(params, shards, g.zero, j.dtype_bytes, j.grad_bytes,
                                     j.optimizer_state_bytes).values())

    def _sync_context(self, g: Group, pp: int) -> SyncContext:
        groups = self._groups(g, pp)
        return SyncContext(self.cluster.topology, self.cluster.accelerator, self.job, g.zero,
                           groups["cp+ep+dp"], groups["cp+dp"])

    def _tied_sync(self, g: Group, pp: int) -> float:
        levels = self.placement.boundary_levels(g.cfg.order, g.cfg.stage_devices, g.replicas, pp)
        return tied_embedding_sync(self.model, self.cluster.topology, g.cfg.tp, self.job, levels)

    # ------------------------------------------------------------------ tables
    def _per_level_transfer(self, g: Group) -> np.ndarray:
        """Seconds of one boundary transfer at each level, and 0 at index -1 (no link)."""
        shard = shard_of(g.dims(), self.job)
        topo = self.cluster.topology
        return np.array([comm.boundary_time(topo, self.model, shard, lv) for lv in range(topo.num_levels)] + [0.0])

    def boundary_times(self, g: Group, pp: int) -> np.ndarray:
        levels = self.placement.boundary_levels(g.cfg.order, g.cfg.stage_devices, g.replicas, pp)
        return self._per_level_transfer(g)[list(levels)]

    def _block_arrays(self, g: Group, t: GraphTerms) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per block (L,): cycle seconds, state bytes and activation bytes per microbatch in flight."""
        kind_ids = sorted(t.blocks)   # False (dense) before True (MoE)
        per_kind = {k: (t.blocks[k].cycle, self._state_bytes(g, t.blocks[k].params), t.blocks[k].activations)
                    for k in kind_ids}
        costs, states, acts = (np.array([per_kind[k][i] for k in kind_ids])[self._kinds] for i in range(3))
        return costs, states, acts

    def _capacity(self, g: Group, t: GraphTerms, per_block_states: np.ndarray, per_block_acts: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
        """(P, P) bytes each stage holds besides its blocks, and the most blocks it can hold (0 beyond the depth)."""
        P = g.max_depth
        depth = np.arange(1, P + 1)[:, None]
        stage = np.arange(P)[None, :]
        real = stage < depth
        inflight = np.where(real, in_flight_microbatches(Schedule.ONE_F_ONE_B, stage, depth, g.microbatches, 1), 0)
        first, last = real & (stage == 0), real & (stage == depth - 1)
        copy = np.where(depth > 1, self._state_bytes(g, t.tied_head_copy), 0.0)
        transient = max(t.blocks[k].transient for k in t.blocks)
        fixed = (self.cluster.accelerator.reserved_bytes + transient
                 + first * (self._state_bytes(g, t.embedding.params) + t.embedding.activations * inflight)
                 + last * (self._state_bytes(g, t.head.params) + copy + t.head.activations * inflight))
        mem_layer = per_block_states[0] + per_block_acts[0] * inflight
        cap = self.cluster.accelerator.hbm_bytes
        nmax = np.where(real, np.floor((cap - fixed) / np.maximum(mem_layer, 1.0)), 0).astype(np.int64)
        nmax = np.where(real, np.maximum(nmax, 0), 0)
        return np.where(real, fixed, 0.0), nmax

    def tables(self, g: Group) -> Tables:
        t = self.terms(g)
        P = g.max_depth
        costs, per_block_states, per_block_acts = self._block_arrays(g, t)
        depth = np.arange(1, P + 1)[:, None]
        stage = np.arange(P)[None, :]
        real = stage < depth
        first, last = real & (stage == 0), real & (stage == depth - 1)
        # bt[p - 1, s + 1] = transfer over the link between stages s and s + 1 of a p-stage pipeline
        bt = self._per_level_transfer(g)[self.placement.level_matrix(g.cfg.order, g.cfg.stage_devices, g.replicas, P)]
        alpha = (t.embedding.cycle * first + t.head.cycle * last + bt[:, :P] + bt[:, 1:])
        alpha = np.where(real, alpha, -np.inf)
        homogeneous = bool(np.all(costs == costs[0]) and np.all(per_block_states == per_block_states[0]))
        mem_fixed, nmax = self._capacity(g, t, per_block_states, per_block_acts)
        constant = np.where(real, alpha, 0.0).sum(axis=1) + costs.sum()
        return Tables(alpha=alpha, nmax=nmax, beta=float(costs[0]), block_costs=costs,
                      mem_fixed=mem_fixed, constant=constant, homogeneous=homogeneous)

    # ------------------------------------------------------------------ before the tables
    def _position_capacity(self, g: Group, t: GraphTerms, block_states: float, block_acts: float
                           ) -> tuple[np.ndarray, np.ndarray, int, int]:
        """The tables' nmax by position, with k = p - s = 1..P (1F1B keeps min(k, m) microbatches in
        flight at stage s of p): blocks a middle stage can hold (P,) by k, a first stage of a
        p-stage pipeline (P,) by p, a last stage of p >= 2 stages, a single stage. The same
        arithmetic as ``_capacity`` element by element (its terms with 0 added where a stage is not
        first or last), in O(P) instead of O(P^2)."""
        k = np.arange(1, g.max_depth + 1)
        inflight = in_flight_microbatches(Schedule.ONE_F_ONE_B, 0, k, g.microbatches, 1)
        per_block = np.maximum(block_states + block_acts * inflight, 1.0)
        cap = self.cluster.accelerator.hbm_bytes

        def blocks(fixed, per) -> np.ndarray:
            return np.maximum(np.floor((cap - fixed) / per).astype(np.int64), 0)

        base = self.cluster.accelerator.reserved_bytes + max(t.blocks[b].transient for b in t.blocks)
        emb = self._state_bytes(g, t.embedding.params) + t.embedding.activations * inflight
        head = self._state_bytes(g, t.head.params)
        last = head + self._state_bytes(g, t.tied_head_copy) + t.head.activations * inflight[0]
        single = (base + emb[0]) + (head + t.head.activations * inflight[0])
        return (blocks(base, per_block), blocks(base + emb, per_block), int(blocks(base + last, per_block[0])),
                int(blocks(single, per_block[0])))

    def fits(self, g: Group) -> bool | None:
        """Whether some depth of the group has a split that fits in memory (what the engine's
        run_group returns: every stage holds >= 1 block and together they hold all), from the
        stage capacities alone; None for blocks that differ (the engine then solves the splits)."""
        t = self.memory_terms(g)
        if len(t.blocks) > 1:   # whether two kinds of block cost the same depends on all their terms
            t = self.terms(g)
        costs, per_block_states, per_block_acts = self._block_arrays(g, t)
        if not (np.all(costs == costs[0]) and np.all(per_block_states == per_block_states[0])):
            return None
        L = self.num_blocks
        middle, first, last, single = self._position_capacity(g, t, per_block_states[0], per_block_acts[0])
        if single >= L:
            return True
        if g.max_depth < 2 or last < 1:
            return False
        # depth p >= 2: first stage (k = p), middle stages k = 2 .. p - 1, last stage (k = 1)
        inner = middle[1:-1]
        short = np.concatenate([[0], np.cumsum(inner < 1)])
        held = np.concatenate([[0], np.cumsum(inner)])
        p = np.arange(2, g.max_depth + 1)
        ok = (first[1:] >= 1) & (short == 0) & (first[1:] + last + held >= L) & (p <= L)
        return bool(ok.any())

    def lower_bound(self, g: Group) -> float:
        """A lower bound of the proxy step time of every split of every depth of the group, from
        the node terms alone (arrangement of the cost model's terms, no formula of its own).

        Depth 1 holds everything: (m - 1) * cycle + cycle with cycle = embedding + head + blocks.
        At depth p >= 2 transfers are >= 0, every stage holds >= 1 block, the largest holds >=
        ceil(L / p) and the bottleneck is >= the mean cycle, so (m - 1) * max(those) + embedding +
        head + blocks bounds it; each bound falls with p, so depth P bounds every depth >= 2. The
        step end (extras) is >= 0. The result is shrunk by 1e-9 against rounding."""
        key = self._terms_key(g)
        if key not in self._bound_terms:
            t = self.terms(g)
            cycles = {k: t.blocks[k].cycle for k in t.blocks}
            blocks = sum(cycles[k] * count for k, count in zip(sorted(t.blocks), self._kind_counts))
            self._bound_terms[key] = (t.embedding.cycle, t.head.cycle, blocks, min(cycles.values()))
        embedding, head, blocks, cheapest = self._bound_terms[key]
        ends = embedding + head
        m1 = g.microbatches - 1
        bound = g.microbatches * (ends + blocks)
        P = g.max_depth
        if P >= 2:
            bottleneck = max(max(embedding, head) + cheapest, -(-self.num_blocks // P) * cheapest,
                             (ends + blocks) / P)
            bound = min(bound, m1 * bottleneck + ends + blocks)
        return bound * (1 - 1e-9)

    def block_memory(self, g: Group, pp: int) -> np.ndarray:
        """(pp, L) bytes of each block held by each stage (for the general DP)."""
        t = self.terms(g)
        inflight = in_flight_microbatches(Schedule.ONE_F_ONE_B, np.arange(pp), pp, g.microbatches, 1)
        out = np.empty((pp, self.num_blocks))
        for i in range(self.num_blocks):
            node = t.blocks[self.model.is_moe_layer(i)]
            out[:, i] = self._state_bytes(g, node.params) + node.activations * inflight
        return out

    # ------------------------------------------------------------------ objective
    def _stage_nodes(self, t: GraphTerms, s: int, pp: int) -> tuple[L.ParamCount, float, float]:
        """(params, forward, backward) of the embedding/head a stage holds besides its blocks."""
        prm, fwd, bwd = L.ParamCount(), 0.0, 0.0
        nodes = ([t.embedding] if s == 0 else []) + ([t.head] if s == pp - 1 else [])
        if s == pp - 1 and pp > 1:
            prm = prm + t.tied_head_copy
        for node in nodes:
            prm = prm + node.params
            fwd += node.components["forward_compute"]
            bwd += sum(node.components[k] for k in BWD_KEYS)
        return prm, fwd, bwd

    def end_matrices(self, g: Group, pp: int) -> tuple[np.ndarray, float]:
        """X[s, j, e]: exposed sync + optimizer of stage s holding blocks [j, e) (identical blocks),
        and the tied-embedding sync; step_end's max over stages of X is the proxy's step end."""
        t = self.terms(g)
        blk = t.blocks[self.model.is_moe_layer(0)]
        b_fwd = blk.components["forward_compute"]
        b_bwd = sum(blk.components[k] for k in BWD_KEYS)
        ctx = self._sync_context(g, pp)
        n1 = self.num_blocks + 1
        j = np.arange(n1)[:, None]
        n = np.arange(n1)[None, :] - j
        bt = self.boundary_times(g, pp)
        emb_bwd = self._stage_nodes(t, 0, pp)[2]
        out = np.full((pp, n1, n1), np.inf)
        for s in range(pp):
            prm, fwd0, bwd0 = self._stage_nodes(t, s, pp)

            def affine(fn):   # comm and optimizer times are affine in the bytes, so in the blocks held
                one, two = fn(prm + blk.params), fn(prm + blk.params.scaled(2))
                return one - (two - one), two - one

            (s0, s1), (g0, g1), (o0, o1) = affine(ctx.sync), affine(ctx.gather), affine(ctx.optimizer)
            drain = (j * b_bwd + emb_bwd + bt[:s].sum()) if s > 0 else 0.0
            x = (np.maximum(0.0, s0 + s1 * n - (bwd0 + b_bwd * n) - drain)
                 + np.maximum(0.0, g0 + g1 * n - (fwd0 + b_fwd * n)) + o0 + o1 * n)
            out[s] = np.where(n >= 1, x, np.inf)
        return out, self._tied_sync(g, pp)

    def extras(self, g: Group, parts: tuple[int, ...]) -> float:
        """Step-end seconds (exposed sync, tied-embedding sync, optimizer) of one split."""
        t = self.terms(g)
        pp = len(parts)
        params, fwd, bwd = [], [], []
        start = 0
        for s, n in enumerate(parts):
            prm, f, b = self._stage_nodes(t, s, pp)
            for i in range(start, start + n):
                node = t.blocks[self.model.is_moe_layer(i)]
                prm = prm + node.params
                f += node.components["forward_compute"]
                b += sum(node.components[k] for k in BWD_KEYS)
            params.append(prm)
            fwd.append(f)
            bwd.append(b)
            start += n
        end = step_end(self._sync_context(g, pp), params, fwd, bwd, list(self.boundary_times(g, pp)))
        return end.total_s + self._tied_sync(g, pp)
