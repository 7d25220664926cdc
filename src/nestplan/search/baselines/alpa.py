"""Alpa (Zheng et al. 2022) as the NEST paper evaluates it (Alpa-E): the cluster seen as a 2-D
mesh (nodes x devices per node), equal layer groups on equal sub-meshes, intra-operator
sharding favoured, and memory checked only after choosing. When the chosen plan does not fit,
it shards its operators wider (tp up to the whole sub-mesh, across nodes), the over-sharding
the paper describes; if nothing fits it reports no plan."""

from __future__ import annotations

from nestplan.cluster import Cluster
from nestplan.job import Job
from nestplan.model.spec import ModelSpec
from nestplan.search.baselines.common import BaselineResult, Evaluator, tp_candidates
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute


def alpa(model: ModelSpec, cluster: Cluster, job: Job, devices: int, micro_batch_size: int = 1) -> BaselineResult:
    ev = Evaluator(model, cluster, job)
    node = cluster.topology.levels[0].size
    options = []  # (pp, tp, dp, prediction)
    for pp in (p for p in range(1, model.num_layers + 1) if model.num_layers % p == 0 and devices % p == 0):
        submesh = devices // pp
        for tp in tp_candidates(model, min(node, submesh)):  # sharding inside a node first
            dp = submesh // tp
            if job.global_batch_size % (dp * micro_batch_size):
                continue
            pred = ev(
                ParallelDims(
                    tp=tp, pp=pp, dp=dp, sp=tp > 1, recompute=Recompute.NONE, micro_batch_size=micro_batch_size
                )
            )
            if pred is not None:
                options.append((pp, tp, dp, pred))
    if not options:
        return ev.result("alpa", None)
    pp, tp, _, chosen = min(options, key=lambda o: o[3].step_time_s)  # memory ignored while choosing
    if chosen.fits:
        return ev.result("alpa", chosen)
    submesh = devices // pp
    for wider in sorted(t for t in tp_candidates(model, submesh) if t > tp):  # over-shard until it fits
        dp = submesh // wider
        if job.global_batch_size % (dp * micro_batch_size):
            continue
        pred = ev(
            ParallelDims(tp=wider, pp=pp, dp=dp, sp=True, recompute=Recompute.NONE, micro_batch_size=micro_batch_size)
        )
        if pred is not None and pred.fits:
            return ev.result("alpa", pred)
    return ev.result("alpa", None)
