"""Manual (Megatron-style) placement: tp fills a node (capped by the heads), the smallest
pipeline depth with even layers that fits, data parallelism fills the rest (NEST section 5.1).
MoE models put experts where tp would go (ep fills the node, tp 1), as the paper's Mixtral rows do."""

from __future__ import annotations

from nestplan.cluster import Cluster
from nestplan.job import Job
from nestplan.model.spec import ModelSpec
from nestplan.search.baselines.common import BaselineResult, Evaluator, largest_dp, tp_candidates
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute

RECOMPUTE_ORDER = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)


def manual(model: ModelSpec, cluster: Cluster, job: Job, devices: int, micro_batch_size: int = 1) -> BaselineResult:
    ev = Evaluator(model, cluster, job)
    node = cluster.topology.levels[0].size
    if model.is_moe:
        tp = 1
        ep = max(e for e in range(1, min(node, model.num_experts) + 1) if model.num_experts % e == 0)
    else:
        tp, ep = tp_candidates(model, min(node, devices))[0], 1
    for pp in (p for p in range(1, model.num_layers + 1) if model.num_layers % p == 0):
        dp = largest_dp(devices, tp * ep * pp, job.global_batch_size, ep * micro_batch_size)
        if dp == 0:
            break
        for rc in RECOMPUTE_ORDER:
            dims = ParallelDims(tp=tp, pp=pp, dp=dp, ep=ep, sp=tp > 1, recompute=rc, micro_batch_size=micro_batch_size)
            pred = ev(dims)
            if pred is not None and pred.fits:
                return ev.result("manual", pred)
    return ev.result("manual", None)
