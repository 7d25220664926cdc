"""The NEST authors' cost semantics, as a cost model for nestplan's search engine.

Reproduced on purpose, units included (ref/nest-artifact-cases/README.md; the
authors' artifact, scai-tech/Nest at 3e163ad, read as data, not ported):

- A plan is a tensor width t, replicas d (any integer up to min(N, mbsInBatch)), depth p
  and contiguous stages of the node chain (embedding first), each stage on
  a = t * ep * cp devices, p * a <= floor(N / d).
- Stage load per microbatch (the estimator's unit, cycles / frequency):
      load_s = sum Fw + sum Bw + [recompute, p > 1, not the last stage] sum Bw
               + transfer of the edge entering the stage,
  the re-run forward charged with the Bw sum as the authors do (their bug, kept). The
  transfer is bytes / bws[l] + latency[l] at the level l the link crosses, twice that
  above the innermost level; stage s sits on devices [(p-1-s) a, (p-s) a) (the last
  stage on device 0, as the authors' networkSkeleton shows), so l depends on p, s and a.
- Time per batch = max_s load_s * (ceil(mbsInBatch / d) + p - 1) + all-reduce of the
  first stage's parameters over the d replicas (seconds: the unit mix is theirs).
- Memory of the stage s_end-th from the end: 2 * params (+ 6 * params with Adam) +
  sum activationSize + (s_end - 1) * stash; stash = the bytes entering the stage with
  recomputation, the activationSize sum without it.

Everything is checked against the 17 published cases in tests/unit/test_nest_compat.py;
the data-parallel all-reduce is this module's reading of the authors' description (a
halving-doubling term per level the group spans) and is not exact (see allreduce_s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nestplan.compat.schema import NestGraph, NestInput, NestNetwork, NestOptimizer
from nestplan.search.engine import SearchCostModel, StageTables

GRAD_AND_WEIGHT = 2.0  # weights + gradients, per parameter byte
ADAM_STATE = 6.0  # the authors' extra with Adam


@dataclass(frozen=True)
class NestGroup:
    """One (width, replicas, ZeRO) configuration the engine searches over every depth."""

    width: int
    replicas: int
    microbatches: int  # per replica: ceil(mbsInBatch / d)
    max_depth: int  # floor(floor(N / d) / a), at most the node count
    zero: bool = False


def crossing_level(network: NestNetwork, boundary: int) -> int:
    """The level a link between devices boundary - 1 and boundary crosses."""
    for level in range(len(network.devices_per_level)):
        if boundary % network.unit(level):
            return level
    return len(network.devices_per_level) - 1


def transfer_s(network: NestNetwork, nbytes: float, level: int) -> float:
    """bytes / bandwidth + latency at the level, doubled above the innermost one."""
    one = nbytes / network.bandwidth_Bps[level] + network.latency_s[level]
    return one if level == 0 else 2.0 * one


def group_shape(network: NestNetwork, members: list[int]) -> list[int]:
    """Per level, how many parts of the level below the group spans inside one unit
    (level 0: members per innermost unit); 1 where the level adds nothing."""
    shape, below = [], list(members)  # level -1: every member its own part
    for level in range(len(network.devices_per_level)):
        unit = network.unit(level)
        parts: dict[int, set[int]] = {}
        for m, b in zip(members, below):
            parts.setdefault(m // unit, set()).add(b)
        shape.append(max(len(v) for v in parts.values()))
        below = [m // unit for m in members]
    return shape


def allreduce_s(network: NestNetwork, nbytes: float, members: list[int]) -> float:
    """Hierarchical halving-doubling all-reduce of ``nbytes`` over devices ``members``.

    Per level l the group spans with g parts: 2 (g - 1) / g * D_l / bws[l] + 2 log2(g) lat[l],
    doubled above the innermost level like the pipeline transfers, where D_l is what is left
    after the reduce-scatters below (nbytes / product of the inner g). The authors' all-reduce
    is described only in outline; on the 17 cases this reading is within a factor of a few of
    their term, which is at most 5.5e-5 of a time per batch (tests/unit/test_nest_compat.py).
    """
    if len(members) < 2:
        return 0.0
    total, data = 0.0, float(nbytes)
    for level, g in enumerate(group_shape(network, members)):
        if g < 2:
            continue
        one = 2.0 * (g - 1) / g * data / network.bandwidth_Bps[level] + 2.0 * math.log2(g) * network.latency_s[level]
        total += one if level == 0 else 2.0 * one
        data /= g
    return total


def first_stage_members(replicas: int, depth: int, stage_devices: int) -> list[int]:
    """Device of the first stage in every replica: replica r holds [r p a, (r + 1) p a)."""
    span = depth * stage_devices
    return [r * span + (depth - 1) * stage_devices for r in range(replicas)]


class NestCostModel(SearchCostModel):
    """The engine's view (search/engine.py SearchCostModel) of the authors' semantics."""

    def __init__(self, inp: NestInput) -> None:
        self.inp = inp
        self.num_blocks = inp.num_layers + 1
        self._tables: dict[tuple, tuple] = {}
        self._chains: dict[int, dict[str, np.ndarray]] = {}

    # ----------------------------------------------------------------- arrays
    def chain(self, width: int) -> dict[str, np.ndarray]:
        """Per node (embedding first): fw, bw, params, activations, bytes of the entering edge."""
        if width in self._chains:
            return self._chains[width]
        g: NestGraph = self.inp.graph(width)
        nodes = (g.embedding,) + g.layers
        return self._chains.setdefault(
            width,
            {
                "fw": np.array([x.fw for x in nodes]),
                "bw": np.array([x.bw for x in nodes]),
                "params": np.array([x.param_bytes for x in nodes]),
                "act": np.array([x.activation_bytes for x in nodes]),
                "entering": np.array((0.0,) + g.entering_bytes),
            },
        )

    def depth_limit(self, width: int, replicas: int) -> int:
        a = self.inp.stage_devices(width)
        return min(self.num_blocks, (self.inp.max_devices // replicas) // a)

    def groups(self, zero: bool = False):
        """(configuration key, key, group, ZeRO) for the engine's run(), widest search first."""
        inp = self.inp
        for g in inp.graphs:
            for d in range(1, min(inp.max_devices, inp.microbatches) + 1):
                depth = self.depth_limit(g.width, d)
                if depth < 1 or (zero and d < 2):
                    continue
                group = NestGroup(g.width, d, -(-inp.microbatches // d), depth, zero)
                yield (g.width,), (g.width, d, int(zero)), group, 3 if zero else 0

    def _shared(self, width: int, zero_replicas: int) -> tuple:
        key = (width, zero_replicas)
        if key not in self._tables:
            self._tables[key] = self._build(width, zero_replicas)
        return self._tables[key]

    def _build(self, width: int, zero_replicas: int) -> tuple:
        inp, c = self.inp, self.chain(width)
        a = inp.stage_devices(width)
        depth = min(self.num_blocks, inp.max_devices // a)
        n = self.num_blocks
        costs = np.zeros((depth, depth, n))
        start = np.zeros((depth, depth, n))
        stash = np.zeros((depth, depth, n))
        gather = self._zero_gather(width, zero_replicas, c["params"]) if zero_replicas else 0.0
        for p in range(1, depth + 1):
            for s in range(p):
                rerun = inp.recompute and p > 1 and s < p - 1
                costs[p - 1, s] = c["fw"] + c["bw"] * (2.0 if rerun else 1.0) + gather
                if s > 0:
                    level = crossing_level(inp.network, (p - s) * a)
                    start[p - 1, s] = [transfer_s(inp.network, b, level) for b in c["entering"]]
                    if inp.recompute:
                        stash[p - 1, s] = (p - s - 1) * c["entering"]
        return costs, start, stash

    def _zero_gather(self, width: int, replicas: int, params: np.ndarray) -> np.ndarray:
        """ZeRO-3 (Rajbhandari et al. 2020, sec. 7.2.2): every microbatch all-gathers a block's
        parameters for the forward and again for the backward, over the replicas (level 0 costs:
        the authors' estimator unit for loads is not seconds, so this is only a lower bound)."""
        net = self.inp.network
        members = first_stage_members(replicas, 1, self.inp.stage_devices(width))
        level = max((i for i, g in enumerate(group_shape(net, members)) if g > 1), default=0)
        return 2.0 * (replicas - 1) / replicas * params / net.bandwidth_Bps[level]

    # --------------------------------------------------------------- protocol
    def tables(self, group: NestGroup) -> StageTables:
        zero_replicas = group.replicas if group.zero else 0
        costs, start, stash = self._shared(group.width, zero_replicas)
        depth = costs.shape[0]
        p = np.arange(1, depth + 1, dtype=float)
        weight = np.where(p <= group.max_depth, group.microbatches + p - 1, np.inf)
        zeros = np.zeros((depth, depth))
        return StageTables(
            alpha=zeros,
            nmax=np.zeros((depth, depth), dtype=np.int64),
            beta=0.0,
            block_costs=costs,  # (P, P, L): block cost when held by stage s of depth p
            start_costs=start,  # (P, P, L): transfer into stage s when it starts at block j
            start_memory=stash,  # (P, P, L): recomputation stash of that edge
            mem_fixed=zeros,
            constant=np.zeros(depth),
            weight=weight,  # (P,): ceil(m / d) + p - 1, inf beyond the group's depth
            homogeneous=False,
            split_key=(group.width, zero_replicas),
        )

    def block_memory(self, group: NestGroup, pp: int) -> np.ndarray:
        """(pp, L) bytes of each node when held by stage s (sharded over replicas with ZeRO)."""
        c = self.chain(group.width)
        state = GRAD_AND_WEIGHT + (ADAM_STATE if self.inp.optimizer is NestOptimizer.ADAM else 0.0)
        shard = group.replicas if group.zero else 1
        from_end = (pp - np.arange(pp))[:, None]
        act = c["act"][None, :] * (1.0 if self.inp.recompute else from_end)
        return np.broadcast_to(state * c["params"][None, :] / shard + act, (pp, self.num_blocks))

    def extras(self, group: NestGroup, parts: tuple[int, ...]) -> float:
        """The data-parallel all-reduce of the first stage's parameters (seconds)."""
        c = self.chain(group.width)
        first = float(c["params"][: parts[0]].sum())
        members = first_stage_members(group.replicas, len(parts), self.inp.stage_devices(group.width))
        return allreduce_s(self.inp.network, first, members)
