"""Pipeline stages from node terms: what a stage holds, costs per microbatch and keeps in memory.

One module turns the per-node terms (cost/terms.py) into per-stage quantities, for the
evaluator (one split: :func:`stage_sums`, :func:`stage_memory_breakdown`) and for the search
(every position of every depth at once, as arrays: :func:`position_tables`,
:func:`position_capacity`, :func:`block_memory`, :func:`end_matrices`). The rules, stated once:

- a stage holds its blocks; the first also the embedding, the last also the head (with the MTP
  modules, where the model has them), and the last of a multi-stage pipeline a copy of the
  embedding where the head's weights are tied to it or MTP modules read it (Megatron keeps one:
  ``GraphTerms.embedding_copy``);
- its cycle per microbatch is the sum of its nodes' components plus its boundary transfers:
  its outputs forward and its input gradients back, once per model chunk (v under interleaving,
  whose chunks also pass from the last stage back to the first); with chunks given per virtual
  stage (uneven interleaving), each chunk holds its own blocks, the embedding virtual stage 0 and
  the head the last (:func:`stage_sums` of the virtual stage among pp x v, :func:`combined_sums`
  per stage, :func:`chunk_transfers`);
- its memory is its weights, gradients and optimizer state under ZeRO (cost/memory.py), its
  activations per microbatch times the microbatches in flight at its position
  (``memory.in_flight_microbatches``; chunks of unequal size: the peak of the live chunks,
  ``memory.live_activation_peak``), the largest transient buffer of a node it holds, and the
  accelerator's reserve. Before a split is known, the transient is the largest of any block kind
  (exact when all blocks are alike, an upper bound otherwise);
- its step end (cost/stepend.py) sees its parameters, its forward compute and its backward
  compute with recomputation.

The search ranks splits of 1F1B pipelines (v = 1; interleaving is a variant of a found plan), so
its arrays use the 1F1B in-flight rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Hashable, Mapping, Sequence

import numpy as np

from nestplan.cost.memory import (
    ShardGroups,
    in_flight_microbatches,
    model_state_bytes,
    model_state_total,
    moe_a2a_early,
    stage_memory,
)
from nestplan.cost.prediction import BREAKDOWN_TERMS
from nestplan.cost.stepend import SyncContext
from nestplan.cost.terms import GraphTerms, NodeTerms
from nestplan.hardware.accelerator import Accelerator
from nestplan.job import Job
from nestplan.model import layers as L
from nestplan.strategy.enums import Schedule, ZeroStage

BACKWARD_TERMS = ("backward_compute", "recompute")  # what a stage's backward pass computes (the step end's view)


@dataclass(frozen=True)
class StageContext:
    """What turns a stage's nodes into bytes: the job's bytes per value, ZeRO and its shard
    groups, the accelerator's reserve and capacity."""

    job: Job
    zero: ZeroStage
    shards: ShardGroups
    reserved_bytes: float
    capacity_bytes: float

    @classmethod
    def on(
        cls,
        job: Job,
        zero: ZeroStage,
        dense_ranks: int,
        expert_ranks: int,
        accelerator: Accelerator,
        capacity_bytes: float | None = None,
    ) -> StageContext:
        """The context of a stage whose dense states shard over ``dense_ranks`` (its cp x ep x dp group)
        and expert states over ``expert_ranks`` (cp x dp) on ``accelerator``: its reserve, and its memory
        unless a search plans with less (``capacity_bytes``, the planner's margin taken off)."""
        capacity = accelerator.hbm_bytes if capacity_bytes is None else capacity_bytes
        return cls(job, zero, ShardGroups(dense=dense_ranks, expert=expert_ranks), accelerator.reserved_bytes, capacity)

    def states(self, params: L.ParamCount) -> dict[str, float]:
        """Weights, gradients and optimizer state of ``params`` on one device."""
        j = self.job
        return model_state_bytes(params, self.shards, self.zero, j.dtype_bytes, j.grad_bytes, j.optimizer_state_bytes)

    def node_state_bytes(self, node: NodeTerms) -> float:
        """What a node holds all step: its ZeRO-managed states and its FP8 weight copies."""
        return self.state_bytes(node.params) + node.fp8_weight_bytes

    def state_bytes(self, params: L.ParamCount) -> float:
        j = self.job
        return model_state_total(params, self.shards, self.zero, j.dtype_bytes, j.grad_bytes, j.optimizer_state_bytes)


# ---------------------------------------------------------------------------- one split (evaluator)
def held_nodes(terms: GraphTerms, kinds: Sequence[Hashable], stage: int, pp: int) -> list[NodeTerms]:
    """The nodes of a stage holding blocks of ``kinds`` (ModelSpec.block_kind per block), embedding and head
    included."""
    return [terms.blocks[k] for k in kinds] + _end_nodes(terms, stage, pp)


def extra_params(terms: GraphTerms, stage: int, pp: int) -> L.ParamCount:
    """Parameters a stage holds besides its nodes': the embedding's copy on the last of several stages."""
    return terms.embedding_copy if stage == pp - 1 and pp > 1 else L.ParamCount()


@dataclass(frozen=True)
class StageSums:
    """One stage's nodes summed: components per microbatch (no transfers), the forward part,
    activation bytes per microbatch, parameters and the largest transient."""

    components: Mapping[str, float]  # BREAKDOWN_TERMS, pp_comm zero
    forward: float
    activations: float
    params: L.ParamCount
    transient: float
    fp8_weight_bytes: float = 0.0
    weight_gradient: float = 0.0  # seconds of its backward that are weight-gradient GEMMs (W)
    weight_gradient_bytes: float = 0.0  # activation bytes per microbatch W still reads after B


def stage_sums(terms: GraphTerms, kinds: Sequence[Hashable], stage: int, pp: int) -> StageSums:
    comp: dict[str, float] = {k: 0.0 for k in BREAKDOWN_TERMS}
    acts, fwd, params, transient, fp8 = 0.0, 0.0, extra_params(terms, stage, pp), 0.0, 0.0
    wgrad = wgrad_bytes = 0.0
    for node in held_nodes(terms, kinds, stage, pp):
        for key, value in node.components.items():
            comp[key] += value
        acts += node.activations
        fwd += node.forward
        params = params + node.params
        transient = max(transient, node.transient)
        fp8 += node.fp8_weight_bytes
        wgrad += node.weight_gradient
        wgrad_bytes += node.weight_gradient_bytes
    return StageSums(MappingProxyType(comp), fwd, acts, params, transient, fp8, wgrad, wgrad_bytes)


def combined_sums(parts: Sequence[StageSums]) -> StageSums:
    """The model chunks of one stage as one: components, forward, activations and parameters add,
    the transient is the largest."""
    comp = {k: sum(x.components[k] for x in parts) for k in BREAKDOWN_TERMS}
    params = L.ParamCount()
    for x in parts:
        params = params + x.params
    return StageSums(
        MappingProxyType(comp),
        sum(x.forward for x in parts),
        sum(x.activations for x in parts),
        params,
        max(x.transient for x in parts),
        sum(x.fp8_weight_bytes for x in parts),
        sum(x.weight_gradient for x in parts),
        sum(x.weight_gradient_bytes for x in parts),
    )


def chunk_transfers(index: int, stages: Sequence[int], bounds: Sequence[float]) -> tuple[float, float]:
    """(receive side, send side) seconds per microbatch of virtual stage ``index``, ``stages[i]``
    being the stage that runs virtual stage i: it sends its outputs to virtual stage index + 1
    (forward) and its input gradients to index - 1 (backward). Nothing crosses between two virtual
    stages of one stage (the turn of a V schedule), neighbouring stages use the boundary between
    them, others (interleaving's wrap from the last stage back to the first) the slowest boundary,
    as for even chunks; the first virtual stage has nothing before it, the last nothing after."""

    def link(a: int, b: int) -> float:
        if a == b:
            return 0.0
        return bounds[min(a, b)] if abs(a - b) == 1 else max(bounds, default=0.0)

    here = stages[index]
    prev = link(stages[index - 1], here) if index > 0 else 0.0
    nxt = link(here, stages[index + 1]) if index < len(stages) - 1 else 0.0
    return prev, nxt


def transfer_seconds(prev: float, nxt: float, virtual: int) -> float:
    """Boundary transfers per microbatch: each of the v chunks receives from and sends to its neighbours."""
    return virtual * (prev + nxt)


def stage_memory_breakdown(ctx: StageContext, sums: StageSums, in_flight: float) -> dict[str, float]:
    """Bytes per device of one stage by MEMORY_TERMS."""
    return stage_memory(_states(ctx, sums), sums.activations, in_flight, sums.transient, ctx.reserved_bytes)


def _states(ctx: StageContext, sums: StageSums) -> dict[str, float]:
    """Weights (with the FP8 weight copies), gradients and optimizer state of a stage."""
    states = ctx.states(sums.params)
    states["weights"] += sums.fp8_weight_bytes
    return states


def chunked_memory_breakdown(ctx: StageContext, sums: StageSums, live_activation_bytes: float) -> dict[str, float]:
    """Bytes per device of one stage whose chunks differ by MEMORY_TERMS: its activations are the
    peak of its live chunks (``memory.live_activation_peak``), not a count x their mean."""
    return stage_memory(_states(ctx, sums), live_activation_bytes, 1.0, sums.transient, ctx.reserved_bytes)


def step_end_inputs(sums: Sequence[StageSums]) -> tuple[list[L.ParamCount], list[float], list[float]]:
    """Per stage: parameters, forward compute and backward compute (cost/stepend.py's inputs)."""
    return (
        [x.params for x in sums],
        [x.components["forward_compute"] for x in sums],
        [x.components[BACKWARD_TERMS[0]] + x.components[BACKWARD_TERMS[1]] for x in sums],
    )


def _end_nodes(terms: GraphTerms, stage: int, pp: int) -> list[NodeTerms]:
    return ([terms.embedding] if stage == 0 else []) + ([terms.head] if stage == pp - 1 else [])


# ---------------------------------------------------------------------------- every depth (search)
@dataclass(frozen=True)
class BlockArrays:
    """Per block (L,): cycle seconds, state bytes, activation bytes per microbatch in flight and
    transient bytes."""

    costs: np.ndarray
    states: np.ndarray
    activations: np.ndarray
    transients: np.ndarray
    homogeneous: bool  # every block costs and holds the same


def block_arrays(ctx: StageContext, terms: GraphTerms, kind_index: np.ndarray) -> BlockArrays:
    """``kind_index``: each block's kind as an index into ``terms.blocks`` (kinds in their order there)."""
    nodes = list(terms.blocks.values())
    per_kind = [(n.cycle, ctx.node_state_bytes(n), n.activations, n.transient) for n in nodes]
    costs, states, acts, transients = (np.array([kind[i] for kind in per_kind])[kind_index] for i in range(4))
    alike = len(nodes) == 1 or len(set(per_kind)) == 1
    return BlockArrays(costs, states, acts, transients, alike)


def range_transients(transients: np.ndarray) -> np.ndarray:
    """(L + 1, L + 1): [j, e] the largest transient of blocks j .. e - 1 (a stage holding them keeps
    the largest of its nodes' transient buffers, ``stage_memory``), 0 where e <= j."""
    out = np.zeros((len(transients) + 1,) * 2)
    for value in np.unique(transients):
        held = np.concatenate([[0], np.cumsum(transients == value)])
        out = np.maximum(out, np.where(held[None, :] > held[:, None], value, 0.0))
    return out


def largest_block_transient(terms: GraphTerms) -> float:
    return max(terms.blocks[k].transient for k in terms.blocks)


def _grid(depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(depth p (P, 1), stage s (1, P), real stage, first stage, last stage) of depths 1..P."""
    p = np.arange(1, depth + 1)[:, None]
    s = np.arange(depth)[None, :]
    real = s < p
    return p, s, real, real & (s == 0), real & (s == p - 1)


@dataclass(frozen=True)
class PositionTables:
    """Stage tables of depths 1..P (row p - 1 = depth p; column = stage index): cycle besides
    the blocks (-inf beyond the depth), bytes besides the blocks and the most blocks a stage can
    hold (0 beyond the depth), and the depth-dependent part of the sum of all cycles."""

    alpha: np.ndarray
    mem_fixed: np.ndarray
    nmax: np.ndarray
    constant: np.ndarray


def position_tables(
    ctx: StageContext, terms: GraphTerms, blocks: BlockArrays, microbatches: int, transfers: np.ndarray
) -> PositionTables:
    """``transfers`` (P, P + 1): [p - 1, s + 1] the seconds of the link between stages s and
    s + 1 of a p-stage pipeline, 0 where there is none. The fixed bytes hold the blocks' transient
    buffer where the blocks are alike; blocks of different kinds add the largest of those a stage
    holds (``range_transients``) where its split is known."""
    P = transfers.shape[0]
    depth, stage, real, first, last = _grid(P)
    alpha = terms.embedding.cycle * first + terms.head.cycle * last + transfers[:, :P] + transfers[:, 1:]
    alpha = np.where(real, alpha, -np.inf)
    early = moe_a2a_early(ctx.job)
    inflight = np.where(real, in_flight_microbatches(Schedule.ONE_F_ONE_B, stage, depth, microbatches, 1, early), 0)
    copy = np.where(depth > 1, ctx.state_bytes(terms.embedding_copy), 0.0)
    fixed = (
        ctx.reserved_bytes
        + (largest_block_transient(terms) if blocks.homogeneous else 0.0)
        + first * (ctx.state_bytes(terms.embedding.params) + terms.embedding.activations * inflight)
        + last * (ctx.state_bytes(terms.head.params) + copy + terms.head.activations * inflight)
    )
    per_block = blocks.states[0] + blocks.activations[0] * inflight
    nmax = np.where(real, np.floor((ctx.capacity_bytes - fixed) / np.maximum(per_block, 1.0)), 0).astype(np.int64)
    nmax = np.where(real, np.maximum(nmax, 0), 0)
    constant = np.where(real, alpha, 0.0).sum(axis=1) + blocks.costs.sum()
    return PositionTables(alpha, np.where(real, fixed, 0.0), nmax, constant)


@dataclass(frozen=True)
class PositionCapacity:
    """``position_tables``' nmax by position with k = p - s = 1..P (1F1B keeps min(k, m) microbatches
    in flight at stage s of p): blocks a middle stage can hold (P,) by k, a first stage of a
    p-stage pipeline (P,) by p, a last stage of p >= 2 stages, a single stage."""

    middle: np.ndarray
    first: np.ndarray
    last: int
    single: int


def first_stage_in_flight(microbatches: int, depth: int, early: int = 0) -> np.ndarray:
    """Microbatches a 1F1B pipeline's first stage holds, for depths k = 1..depth: min(k, m)
    (what stage s of depth p holds, at k = p - s); ``early``: memory.moe_a2a_early."""
    return in_flight_microbatches(Schedule.ONE_F_ONE_B, 0, np.arange(1, depth + 1), microbatches, 1, early)


def position_capacity(
    ctx: StageContext, terms: GraphTerms, block_states: float, block_activations: float, inflight: np.ndarray
) -> PositionCapacity:
    """The same arithmetic as ``position_tables``' nmax element by element (its terms with 0 added
    where a stage is not first or last), in O(P) instead of O(P^2); identical blocks only, each
    holding ``block_states`` and ``block_activations`` per microbatch in flight; ``inflight`` is
    :func:`first_stage_in_flight`."""
    per_block = np.maximum(block_states + block_activations * inflight, 1.0)

    def held(fixed, per) -> np.ndarray:
        return np.maximum(np.floor((ctx.capacity_bytes - fixed) / per).astype(np.int64), 0)

    base = ctx.reserved_bytes + largest_block_transient(terms)
    emb = ctx.state_bytes(terms.embedding.params) + terms.embedding.activations * inflight
    head = ctx.state_bytes(terms.head.params)
    last = head + ctx.state_bytes(terms.embedding_copy) + terms.head.activations * inflight[0]
    single = (base + emb[0]) + (head + terms.head.activations * inflight[0])
    return PositionCapacity(
        held(base, per_block),
        held(base + emb, per_block),
        int(held(base + last, per_block[0])),
        int(held(single, per_block[0])),
    )


@dataclass(frozen=True)
class PositionMemory:
    """``position_tables``' fixed bytes and block bytes by position, k = p - s = 1..L (1F1B keeps
    min(k, m) microbatches in flight at stage s of p), blocks of any kinds: a middle stage's fixed
    bytes, a first stage's (L,) by k = p, a last stage's (p >= 2), a single stage's; and per k, the
    bytes each block holds there (L, L): [k - 1, i]; the fixed bytes leave out the blocks' transient
    buffers, ``transient`` [j, e] the one a stage holding blocks j .. e - 1 adds (``range_transients``)."""

    middle: float
    first: np.ndarray
    last: float
    single: float
    blocks: np.ndarray
    transient: np.ndarray


def position_memory(
    ctx: StageContext, terms: GraphTerms, kind_index: np.ndarray, inflight: np.ndarray
) -> PositionMemory:
    """The bytes ``position_tables`` and ``block_memory`` give each position, in the same arithmetic
    (so that a check on them agrees with the splits to the last bit); ``inflight``:
    :func:`first_stage_in_flight`, ``kind_index``: each block's kind as an index into ``terms.blocks``."""
    base = ctx.reserved_bytes
    emb = ctx.state_bytes(terms.embedding.params) + terms.embedding.activations * inflight
    head = ctx.state_bytes(terms.head.params)
    blocks = block_arrays(ctx, terms, kind_index)
    return PositionMemory(
        middle=base,
        first=base + emb,
        last=base + (head + ctx.state_bytes(terms.embedding_copy) + terms.head.activations * inflight[0]),
        single=base + emb[0] + (head + terms.head.activations * inflight[0]),
        blocks=blocks.states[None, :] + blocks.activations[None, :] * inflight[:, None],
        transient=range_transients(blocks.transients),
    )


def least_stage_bytes(
    ctx: StageContext, terms: GraphTerms, kind_index: np.ndarray, depth: int, fewest_in_flight: float
) -> float:
    """A floor on the fullest stage of any split of the blocks over ``depth`` or fewer stages
    (``position_memory``'s bytes): each stage holds the reserved bytes, and together they hold every
    block's, the embedding's and the head's states all step and every block's activations for at least
    ``fewest_in_flight`` microbatches (the fewest any of those stages keeps; transients are never
    negative), so the fullest holds at least the reserved bytes plus that sum's mean over ``depth``."""
    blocks = block_arrays(ctx, terms, kind_index)
    held = blocks.states.sum() + blocks.activations.sum() * fewest_in_flight
    held += ctx.state_bytes(terms.embedding.params) + ctx.state_bytes(terms.head.params)
    return ctx.reserved_bytes + held / depth


def block_memory(
    ctx: StageContext, terms: GraphTerms, kind_index: np.ndarray, pp: int, microbatches: int
) -> np.ndarray:
    """(pp, L) bytes of each block held by each stage of a 1F1B pipeline; ``kind_index`` as
    :func:`block_arrays`'."""
    inflight = in_flight_microbatches(Schedule.ONE_F_ONE_B, np.arange(pp), pp, microbatches, 1, moe_a2a_early(ctx.job))
    blocks = block_arrays(ctx, terms, kind_index)
    return blocks.states[None, :] + blocks.activations[None, :] * inflight[:, None]


@dataclass(frozen=True)
class CycleSums:
    """Cycles of the embedding and the head, of all blocks together, and of the cheapest block."""

    embedding: float
    head: float
    blocks: float
    cheapest_block: float


def cycle_sums(terms: GraphTerms, kind_counts: Sequence[int]) -> CycleSums:
    """``kind_counts``: blocks of each kind, kinds in their order in ``terms.blocks``."""
    cycles = {k: terms.blocks[k].cycle for k in terms.blocks}
    blocks = sum(cycles[k] * count for k, count in zip(terms.blocks, kind_counts))
    return CycleSums(terms.embedding.cycle, terms.head.cycle, blocks, min(cycles.values()))


def end_matrices(
    sync: SyncContext, terms: GraphTerms, block: NodeTerms, num_blocks: int, boundaries: np.ndarray
) -> np.ndarray:
    """X[s, j, e] (pp, L + 1, L + 1): exposed sync + gather + optimizer step of stage s holding
    identical blocks [j, e) (inf where it holds none); step_end's max over stages of X is the step end.

    Sync, gather and optimizer times are affine in the bytes, so in the blocks held: each is
    evaluated at one and two blocks and extended. Stage s > 0 drains j blocks' backward, the
    embedding's and the transfers before it after its last backward."""
    pp = len(boundaries) + 1
    b_fwd = block.components["forward_compute"]
    b_bwd = sum(block.components[k] for k in BACKWARD_TERMS)
    n1 = num_blocks + 1
    j = np.arange(n1)[:, None]
    n = np.arange(n1)[None, :] - j
    emb_bwd = sum(terms.embedding.components[k] for k in BACKWARD_TERMS)
    out = np.full((pp, n1, n1), np.inf)
    for s in range(pp):
        prm = extra_params(terms, s, pp)
        fwd0 = bwd0 = 0.0
        for node in _end_nodes(terms, s, pp):
            prm = prm + node.params
            fwd0 += node.components["forward_compute"]
            bwd0 += sum(node.components[k] for k in BACKWARD_TERMS)

        def affine(fn):
            one, two = fn(prm + block.params), fn(prm + block.params.scaled(2))
            return one - (two - one), two - one

        (s0, s1), (g0, g1), (o0, o1) = affine(sync.sync), affine(sync.gather), affine(sync.optimizer)
        drain = (j * b_bwd + emb_bwd + boundaries[:s].sum()) if s > 0 else 0.0
        x = (
            np.maximum(0.0, s0 + s1 * n - (bwd0 + b_bwd * n) - drain)
            + np.maximum(0.0, g0 + g1 * n - (fwd0 + b_fwd * n))
            + o0
            + o1 * n
        )
        out[s] = np.where(n >= 1, x, np.inf)
    return out
