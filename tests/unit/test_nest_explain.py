"""``nest-solve --explain``: nestplan's physical prediction of the authors' plan."""

from __future__ import annotations

from nestplan.compat.explain import physical
from nestplan.compat.schema import parse_input
from nestplan.compat.solve import solve


def _moe_input(layers: int = 32, ep: int = 4) -> dict:
    """The authors' input for a 32-layer chain with expert parallelism 4 on 8 x 4 devices."""
    nodes = [
        {
            "id": i,
            "optimalLatencyFw": 1.0,
            "optimalLatencyBw": 2.0,
            "parameterSize": 1e6,
            "activationSize": 1e6,
            "isTensorParallelized": False,
        }
        for i in range(-1, layers)
    ]
    edges = [{"sourceId": i - 1, "destId": i, "communicationCost": 1e6} for i in range(layers)]
    return {
        "nodes": {"1": nodes},
        "edges": {"1": edges},
        "devices_per_level": [8, 4],
        "bws": [1e11, 1e10],
        "latency_per_level": [1e-5, 1e-5],
        "maxDevices": 32,
        "maxMemoryPerDevice": 1e12,
        "mbsInBatch": 64,
        "ep_degree": ep,
        "cp_degree": 1,
        "sp_enabled": False,
        "activationRecomputation": True,
        "optimizerAlgorithm": "Adam",
    }


def test_expert_parallel_plan_runs_on_the_devices_the_authors_plan_takes():
    """The authors' replicas exclude the expert ranks (a stage is t x ep x cp devices), as nestplan's
    dp does: the plan of 32 devices is predicted on 32 devices, not on ep times as many."""
    inp = parse_input(_moe_input())
    plan = solve(inp).plan
    devices = inp.stage_devices(plan.width) * len(plan.parts) * plan.replicas
    assert devices <= inp.max_devices
    line = physical(inp, plan, "mixtral-8x7b", "h100-spine-leaf", None)
    assert line.startswith(f"nestplan's physical model (mixtral-8x7b on h100-spine-leaf, {devices} devices): step ")
