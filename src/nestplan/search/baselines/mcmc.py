"""MCMC placement search (TopoOpt-like, Wang et al. 2023): a Metropolis random walk over the
same plan space as nestplan, a fixed seed per chain and a budget of evaluations per chain;
the best of 10 chains is reported, as in the NEST paper (section 5.1)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from nestplan.cluster import Cluster
from nestplan.cost.prediction import Prediction
from nestplan.job import Job
from nestplan.model.spec import ModelSpec
from nestplan.search.baselines.common import BaselineResult, Evaluator, even_split, faster, largest_dp, tp_candidates
from nestplan.search.space import SEARCH_ORDERS
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, ZeroStage

TEMPERATURE = 0.05  # relative throughput loss accepted with probability 1/e


@dataclass(frozen=True)
class State:
    tp: int
    ep: int
    parts: tuple[int, ...]
    recompute: Recompute
    zero: ZeroStage
    order: tuple[str, ...]


def _neighbour(s: State, rng: np.random.Generator, tps: list[int], eps: list[int], layers: int) -> State:
    move = rng.integers(6)
    if move == 0:
        return replace(s, tp=tps[rng.integers(len(tps))])
    if move == 1 and len(eps) > 1:
        return replace(s, ep=eps[rng.integers(len(eps))])
    if move == 2:
        pp = int(np.clip(len(s.parts) + rng.choice([-1, 1]), 1, layers))
        return replace(s, parts=even_split(layers, pp))
    if move == 3 and len(s.parts) > 1:
        i = int(rng.integers(len(s.parts) - 1))
        step = int(rng.choice([-1, 1]))
        parts = list(s.parts)
        parts[i] += step
        parts[i + 1] -= step
        if min(parts) >= 1:
            return replace(s, parts=tuple(parts))
        return s
    if move == 4:
        return replace(s, recompute=list(Recompute)[rng.integers(3)], zero=ZeroStage(int(rng.integers(2))))
    return replace(s, order=SEARCH_ORDERS[rng.integers(len(SEARCH_ORDERS))])


def _dims(s: State, devices: int, job: Job, mbs: int) -> ParallelDims | None:
    dp = largest_dp(devices, s.tp * s.ep * len(s.parts), job.global_batch_size, s.ep * mbs)
    if dp == 0:
        return None
    return ParallelDims(
        tp=s.tp,
        pp=len(s.parts),
        dp=dp,
        ep=s.ep,
        sp=s.tp > 1,
        zero=s.zero,
        recompute=s.recompute,
        micro_batch_size=mbs,
        layers_per_stage=s.parts,
    )


def _chain(ev: Evaluator, seed: int, budget: int, devices: int, mbs: int, tps, eps) -> Prediction | None:
    rng = np.random.default_rng(seed)
    layers = ev.model.num_layers
    state = State(
        tps[rng.integers(len(tps))],
        eps[rng.integers(len(eps))],
        even_split(layers, int(rng.integers(1, min(layers, 16) + 1))),
        Recompute.FULL,
        ZeroStage.NONE,
        SEARCH_ORDERS[0],
    )
    score, best = 0.0, None
    for _ in range(budget):
        trial = _neighbour(state, rng, tps, eps, layers)
        dims = _dims(trial, devices, ev.job, mbs)
        pred = ev(dims, trial.order) if dims is not None else None
        value = pred.tokens_per_s if pred is not None and pred.fits else 0.0
        if value >= score or (score > 0 and rng.random() < math.exp((value - score) / (TEMPERATURE * score))):
            state, score = trial, value
        best = faster(best, pred)
    return best


def mcmc(
    model: ModelSpec,
    cluster: Cluster,
    job: Job,
    devices: int,
    micro_batch_size: int = 1,
    chains: int = 10,
    budget: int = 100,
    seed: int = 0,
) -> BaselineResult:
    ev = Evaluator(model, cluster, job)
    node = cluster.topology.levels[0].size
    tps = tp_candidates(model, node)
    eps = [e for e in (1, 2, 4, 8, 16, 32, 64) if model.is_moe and model.num_experts % e == 0] or [1]
    best = None
    for chain in range(chains):
        best = faster(best, _chain(ev, seed + chain, budget, devices, micro_batch_size, tps, eps))
    return ev.result("mcmc", best)
