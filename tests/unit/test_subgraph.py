"""SubGraph: the one sub-graph record that ParallelDims holds, Shard extends and the search's groups key on."""

from __future__ import annotations

import re
from dataclasses import fields

import pytest

from nestplan.cost.terms import shard_of
from nestplan.errors import ConfigError
from nestplan.job import Job
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute
from nestplan.strategy.subgraph import SubGraph


def test_plan_holds_its_sub_graph_and_rebuilds_from_it() -> None:
    dims = ParallelDims(tp=4, pp=2, dp=3, cp=2, ep=2, sp=True, recompute="selective", micro_batch_size=2, etp=1)
    assert dims.subgraph == SubGraph(
        tp=4, sp=True, cp=2, ep=2, etp=1, micro_batch_size=2, recompute=Recompute.SELECTIVE
    )
    assert ParallelDims.of(dims.subgraph, pp=2, dp=3) == dims
    assert (dims.stage_devices, dims.expert_tp, dims.expert_parallel) == (16, 1, 8)
    assert "subgraph" not in {f.name for f in fields(dims)}  # the plan JSON and equality see the degrees


def test_etp_equal_to_tp_is_stored_as_none() -> None:
    assert SubGraph(tp=4, sp=True, etp=4).etp is None
    assert ParallelDims(tp=4, sp=True, etp=4).etp is None


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"tp": 0}, "tp", "tp must be a positive integer, got 0"),
        ({"micro_batch_size": True}, "micro_batch_size", "micro_batch_size must be a positive integer, got True"),
        ({"sp": True}, "sp", "sequence parallelism (sp) needs tp > 1, got tp 1"),
        ({"tp": 4, "etp": 3}, "etp", "expert tensor parallelism etp 3 must divide tp 4"),
        ({"tp": 4, "etp": 2}, "sp", "expert tensor parallelism etp 2 below tp 4 needs sequence parallelism"),
    ],
)
def test_the_plan_and_the_record_refuse_alike(fields, field, message) -> None:
    for build in (SubGraph, ParallelDims):
        with pytest.raises(ConfigError, match=re.escape(message)) as err:
            build(**fields)
        assert err.value.field == field


def test_a_shard_is_the_sub_graph_with_the_jobs_facts() -> None:
    job = Job(global_batch_size=64, seq_len=4096)
    sub = SubGraph(tp=8, sp=True, ep=4, etp=2, micro_batch_size=2)
    shard = shard_of(sub, job)
    assert isinstance(shard, SubGraph) and SubGraph(**{k: getattr(shard, k) for k in vars(sub)}) == sub
    assert (shard.seq_len, shard.tokens, shard.sp_div, shard.expert_parallel) == (4096, 8192, 8, 16)
