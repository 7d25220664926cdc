"""Hosts apart from network levels (issue 27, item 1): GPUs per host, GPUs used per NVLink domain,
whole-host jobs, and costs that do not depend on how a level is drawn."""

from __future__ import annotations

import copy

from nestplan import api
from nestplan.cluster import cluster_data, cluster_from_dict
from nestplan.strategy.dims import ParallelDims


def _node_as_two_quads(name: str) -> dict:
    """A catalog cluster's table with its 8-GPU node drawn as two levels of 4 with the same links."""
    data = copy.deepcopy(cluster_data(name))
    node = data["levels"][0]
    data["levels"] = [dict(node, name="quad", size=4), dict(node, name="node", size=2)] + data["levels"][1:]
    return data


def test_mixtral_step_does_not_depend_on_how_the_node_is_drawn() -> None:
    """Issue 27: drawing a DGX H100 node as two levels of 4 cut Mixtral's expert all-to-all by 44%;
    the step, its communication terms included, is now the same on both drawings."""
    spec = api.resolve_model("mixtral-8x7b")
    plan = ParallelDims(tp=2, pp=2, dp=2, ep=8, sp=True)
    steps = []
    for data in (cluster_data("dgx-h100"), _node_as_two_quads("dgx-h100")):
        cluster = cluster_from_dict(data).truncate(64)
        job = api.job_for(spec, cluster, 256, 4096)
        prediction = api.evaluate(spec, cluster, plan, job)
        steps.append((prediction.step_time_s, dict(prediction.stages[0].components_s)))
    assert steps[0][1]["ep_comm"] > 0 and steps[0][1]["tp_comm"] > 0
    assert steps[0] == steps[1]
