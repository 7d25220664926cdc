"""Phaze (Wang et al. 2024): nestplan's dynamic program blind to the network. Every level is
costed at the innermost level's speed while planning; the plan is then evaluated truthfully."""

from __future__ import annotations

import time
from dataclasses import replace

from nestplan.cluster import Cluster
from nestplan.cost.evaluator import evaluate_plan
from nestplan.job import Job
from nestplan.model.spec import ModelSpec
from nestplan.search.baselines.common import BaselineResult
from nestplan.search.planner import search
from nestplan.search.space import SearchSpace


def flat_cluster(cluster: Cluster) -> Cluster:
    """The same devices with every level at the node's bandwidth, latency and efficiency."""
    node = cluster.topology.levels[0]
    levels = tuple(
        replace(
            lv,
            bandwidth_Bps=node.bandwidth_Bps,
            latency_s=node.latency_s,
            oversubscription=1.0,
            bus_efficiency=node.bus_efficiency,
        )
        for lv in cluster.topology.levels
    )
    return replace(cluster, topology=replace(cluster.topology, levels=levels))


def phaze(model: ModelSpec, cluster: Cluster, job: Job, devices: int, micro_batch_size: int = 1) -> BaselineResult:
    start = time.perf_counter()
    space = SearchSpace(micro_batch_sizes=(micro_batch_size,))
    found = search(model, flat_cluster(cluster), job, devices, space, top=0)
    if found.best is None:
        return BaselineResult("phaze", None, time.perf_counter() - start, found.evaluated)
    pred = evaluate_plan(model, cluster, found.best.plan, job, found.best.placement.axis_order)
    return BaselineResult("phaze", pred, time.perf_counter() - start, found.evaluated + 1)
