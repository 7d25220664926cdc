"""Megatron-Core's distribute_saved_activations (tensor_parallel/random.py CheckpointFunction): under full
recomputation with tp > 1 and no sequence parallelism, each layer's saved input is split over the tp ranks
(split_tensor_into_1d_equal_chunks) and all-gathered before the layer is recomputed (gather_split_1d_tensor)."""

from __future__ import annotations

import pytest

from nestplan import api
from nestplan.cost import comm
from nestplan.cost.terms import graph_terms, shard_of
from nestplan.job import Job
from nestplan.network import collectives as coll
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute
from nestplan.strategy.legality import saved_activations_distributed
from nestplan.strategy.placement import place

MODEL = api.resolve_model("llama3-70b")
CLUSTER = api.resolve_cluster("dgx-h100", 64)
PLAN = ParallelDims(tp=8, pp=4, dp=2, recompute=Recompute.FULL)
JOB = Job(64, 4096)
SPLIT = JOB.with_settings(distribute_saved_activations=True)


@pytest.mark.parametrize(
    "dims, applies",
    [
        (PLAN, True),
        (ParallelDims(tp=1, pp=4, dp=16, recompute=Recompute.FULL), False),  # no tp ranks to split over
        (ParallelDims(tp=8, sp=True, pp=4, dp=2, recompute=Recompute.FULL), False),  # Megatron-Core refuses sp
        (ParallelDims(tp=8, pp=4, dp=2, recompute=Recompute.SELECTIVE), False),  # full recomputation only
    ],
)
def test_it_applies_where_megatron_core_runs_it(dims: ParallelDims, applies: bool) -> None:
    assert saved_activations_distributed(SPLIT.settings, dims) is applies
    assert not saved_activations_distributed(JOB.settings, dims)


def test_the_saved_input_is_split_over_tp_and_gathered_before_the_recomputation() -> None:
    groups = place(PLAN, CLUSTER.topology).groups
    kept, split = (graph_terms(MODEL, CLUSTER, PLAN, job, groups) for job in (JOB, SPLIT))
    shard = shard_of(PLAN.subgraph, JOB)
    gather = coll.all_gather(CLUSTER.topology, groups["tp"].fanout, 2 * shard.tokens * MODEL.hidden_size)
    assert gather == comm.saved_input_gather_time(CLUSTER.topology, groups["tp"], shard, MODEL.hidden_size) > 0
    for kind, block in kept.blocks.items():
        other = split.blocks[kind]
        assert other.activations == pytest.approx(block.activations / 8)
        assert other.components["tp_comm"] == pytest.approx(block.components["tp_comm"] + gather)
        assert other.forward == block.forward  # the gather runs in the backward, before the recomputation


def test_a_plan_it_does_not_apply_to_costs_the_same() -> None:
    dims = ParallelDims(tp=8, sp=True, pp=4, dp=2, recompute=Recompute.FULL)
    same = [api.evaluate(MODEL, CLUSTER, dims, job).step_time_s for job in (JOB, SPLIT)]
    assert same[0] == same[1]
