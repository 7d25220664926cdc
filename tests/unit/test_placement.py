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
    assert p.pp_boundary_levels == (1,)   # pp is slowest: stage 1 starts 8 ranks later, in the next node


def test_rank_grid_is_a_permutation() -> None:
    d = ParallelDims(tp=2, cp=2, pp=2, dp=2)
    grid = rank_grid(d, ("pp", "dp", "tp", "cp", "ep"))
    assert sorted(grid.ravel().tolist()) == list(range(16))
    assert grid[1, 0, 0, 0, 0] == 4   # tp stride = pp * dp = 4


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
        a.groups["tp"] = None   # shared between plans: read-only
