"""Placement: rank grid order and the level each group spans."""

from __future__ import annotations

import numpy as np
import pytest

from nestplan.errors import ConfigError
from nestplan.network.topology import Level, Topology
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.placement import place, rank_grid

TOPO = Topology("t", (Level("node", 8, 450e9, 1e-6), Level("leaf", 4, 50e9, 3e-6), Level("spine", 4, 50e9, 5e-6)))


def test_tp_fastest_stays_in_node() -> None:
    p = place(ParallelDims(tp=8, pp=4, dp=4), TOPO)
    assert p.groups["tp"].level == 0 and p.groups["tp"].fanout == (8, 1, 1)
    assert p.pp_boundary_levels == (1, 1, 1)
    assert p.groups["dp"].level == 2 and p.groups["dp"].fanout == (1, 1, 4)


def test_axis_order_moves_dp_inside() -> None:
    p = place(ParallelDims(tp=2, pp=2, dp=4), TOPO, ("dp", "tp", "cp", "ep", "pp"))
    assert p.groups["dp"].fanout == (4, 1, 1)
    assert p.groups["tp"].fanout == (2, 1, 1)
    assert p.pp_boundary_levels == (1,)  # pp is slowest: stage 1 starts 8 ranks later, in the next node


def test_rank_grid_is_a_permutation() -> None:
    d = ParallelDims(tp=2, cp=2, pp=2, dp=2)
    grid = rank_grid(d, ("pp", "dp", "tp", "cp", "ep"))
    assert sorted(grid.ravel().tolist()) == list(range(16))
    assert grid[1, 0, 0, 0, 0] == 4  # tp stride = pp * dp = 4


def test_bad_axis_order() -> None:
    with pytest.raises(ConfigError, match="permutation"):
        place(ParallelDims(tp=2), TOPO, ("tp", "dp"))


def test_worst_group_is_reported() -> None:
    """tp = 3 does not align with 8-device nodes: some tp groups straddle two nodes."""
    topo = Topology("t", (Level("node", 8, 450e9, 1e-6), Level("fabric", 3, 50e9, 3e-6)))
    p = place(ParallelDims(tp=3, dp=8), topo)
    assert p.groups["tp"].level == 1
    assert np.prod(p.groups["tp"].fanout) >= 3


def test_placement_is_computed_once_per_degrees_topology_and_order() -> None:
    """The split, schedule and recomputation never change where groups land: one Placement per key."""
    from nestplan.cluster import load_cluster
    from nestplan.strategy.dims import ParallelDims
    from nestplan.strategy.placement import place

    topo = load_cluster("dgx-a100", 64).topology
    a = place(ParallelDims(tp=8, pp=4, dp=2, layers_per_stage=(8, 8, 8, 8)), topo)
    b = place(ParallelDims(tp=8, pp=4, dp=2, recompute="full", layers_per_stage=(7, 9, 9, 7)), topo)
    other = place(ParallelDims(tp=8, pp=4, dp=2), topo, ("pp", "dp", "tp", "cp", "ep"))
    assert a is b and a is not other
    assert a.levels_spanned() != other.levels_spanned()
    with pytest.raises(TypeError):
        a.groups["tp"] = None  # shared between plans: read-only


def test_axis_members_are_their_strings() -> None:
    """Plan JSON, --axis-order and exporters hold plain strings: members must stand in for them anywhere."""
    import json

    from nestplan.strategy.placement import AXES, DEFAULT_AXIS_ORDER, REPLICA_MAJOR, STAGE_MAJOR, Axis

    assert {Axis.TP: 1}["tp"] == 1 and {"tp": 1}[Axis.TP] == 1
    assert ("tp", "cp", "ep", "dp", "pp") == STAGE_MAJOR and hash(("tp", "cp", "ep", "dp", "pp")) == hash(STAGE_MAJOR)
    assert ("tp", "cp", "ep", "pp", "dp") == REPLICA_MAJOR == DEFAULT_AXIS_ORDER
    assert AXES == ("tp", "cp", "ep", "pp", "dp")
    assert json.dumps({Axis.DP: list(STAGE_MAJOR)}) == '{"dp": ["tp", "cp", "ep", "dp", "pp"]}'
    assert f"{Axis.PP}" == "pp" and repr(STAGE_MAJOR) == repr(("tp", "cp", "ep", "dp", "pp"))


def test_axis_vocabulary_is_defined_once() -> None:
    from nestplan.export import common
    from nestplan.search import space
    from nestplan.strategy import dims, placement

    assert dims.AXES is placement.AXES
    assert common.STAGE_MAJOR is placement.STAGE_MAJOR and common.REPLICA_MAJOR is placement.REPLICA_MAJOR
    assert space.SEARCH_ORDERS is placement.NAMED_ORDERS == (placement.STAGE_MAJOR, placement.REPLICA_MAJOR)


def test_placement_cache_ignores_how_the_order_is_spelled() -> None:
    from nestplan.strategy.placement import REPLICA_MAJOR

    dims = ParallelDims(tp=2, pp=2, dp=4)
    assert place(dims, TOPO, ("tp", "cp", "ep", "pp", "dp")) is place(dims, TOPO, REPLICA_MAJOR)


def test_consecutive_span_level() -> None:
    """The level a block of consecutive ranks from an aligned start spans (export/common names it)."""
    from nestplan.strategy.placement import consecutive_span_level

    units = tuple(TOPO.unit_devices(i) for i in range(TOPO.num_levels))  # 8, 32, 128
    assert [consecutive_span_level(n, units) for n in (1, 8, 9, 32, 33, 128)] == [0, 0, 1, 1, 2, 2]
    assert consecutive_span_level(129, units) == 2  # more than the network: the outermost level


def test_tied_embedding_sync_reduces_over_the_first_and_last_stage() -> None:
    """The step end asks the placement for the tied embeddings' group (stage 0 and its peer on the last stage)."""
    from nestplan import api
    from nestplan.cost.stepend import tied_embedding_sync
    from nestplan.job import Job
    from nestplan.strategy.placement import REPLICA_MAJOR, STAGE_MAJOR

    model, job = api.resolve_model("gpt3-175b"), Job(global_batch_size=64, seq_len=2048)
    assert model.tied_embeddings
    dims = ParallelDims(tp=2, pp=4, dp=16)
    single = place(ParallelDims(tp=2, dp=64), TOPO).pp_ends
    inside = place(dims, TOPO, REPLICA_MAJOR).pp_ends  # each 8-rank pipeline in one node
    across = place(dims, TOPO, STAGE_MAJOR).pp_ends  # stages 32 ranks apart: ranks 0 and 96 in two leaves
    assert (single.size, inside.fanout, across.fanout) == (1, (2, 1, 1), (1, 1, 2))
    seconds = [tied_embedding_sync(model, TOPO, 2, job, group) for group in (single, inside, across)]
    assert seconds[0] == 0 < seconds[1] < seconds[2]
