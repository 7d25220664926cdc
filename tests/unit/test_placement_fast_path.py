"""The placement's arithmetic for the two named orders agrees with the rank grid exactly."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nestplan.network.topology import Level, Topology
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.placement import (
    AXES,
    EXPERT_GROUP_KEYS,
    GROUP_KEYS,
    NAMED_ORDERS,
    REPLICA_MAJOR,
    STAGE_MAJOR,
    TopologyPlacements,
    grid_placement,
    place,
)


@st.composite
def topologies(draw) -> Topology:
    sizes = draw(st.lists(st.integers(2, 16), min_size=2, max_size=4))
    return Topology("t", tuple(Level(f"l{i}", s, 1e9 * (i + 1), 1e-6) for i, s in enumerate(sizes)))


@st.composite
def degrees(draw, devices: int) -> ParallelDims:
    """Degrees (non-powers of two included: groups that straddle units) whose product fits ``devices``."""
    left, out = devices, {}
    for axis, most in (("tp", 8), ("cp", 4), ("ep", 4), ("pp", 8), ("dp", 16)):
        out[axis] = draw(st.integers(1, max(1, min(most, left))))
        left //= out[axis]
    etp = draw(st.sampled_from([e for e in range(1, out["tp"] + 1) if out["tp"] % e == 0]))
    return ParallelDims(**out, etp=etp, sp=out["tp"] > 1)


@st.composite
def instances(draw, orders=st.sampled_from(NAMED_ORDERS)):
    topo = draw(topologies())
    return topo, draw(degrees(topo.devices)), draw(orders)


@settings(max_examples=200, deadline=None)
@given(instances())
def test_named_orders_match_the_rank_grid(inst) -> None:
    """place() (arithmetic for the named orders) and the search's queries equal the rank grid's answers:
    every group key, every stage boundary, the first and last stage's pair, every depth's level row."""
    topo, dims, order = inst
    ref = grid_placement(dims, topo, order)
    assert place(dims, topo, order) == ref
    fast = TopologyPlacements(topo)
    tp, cp, ep, d, p = dims.tp, dims.cp, dims.ep, dims.dp, dims.pp
    for key in GROUP_KEYS:
        assert fast.group(order, key, tp, cp, ep, d, p) == ref.groups[key], key
    for key in EXPERT_GROUP_KEYS:
        assert fast.expert_group(order, key, tp, dims.expert_tp, cp, ep, d, p) == ref.groups[key], key
    if dims.etp is None:  # unfolded: the ep and tp groups
        assert ref.groups["expert"] == ref.groups["ep"] and ref.groups["etp"] == ref.groups["tp"]
    assert ref.groups["expert"].size == dims.expert_parallel and ref.groups["etp"].size == dims.expert_tp
    a = tp * cp * ep
    assert fast.boundary_levels(order, a, d, p) == ref.pp_boundary_levels
    assert fast.pp_ends(order, a, d, p) == ref.pp_ends
    matrix = fast.level_matrix(order, a, d, p)
    for depth in range(1, p + 1):
        row = grid_placement(ParallelDims(tp=tp, cp=cp, ep=ep, pp=depth, dp=d), topo, order).pp_boundary_levels
        assert tuple(matrix[depth - 1, 1:depth]) == row
        assert (matrix[depth - 1, 0] == -1) and (matrix[depth - 1, depth:] == -1).all()


@settings(max_examples=100, deadline=None)
@given(instances(orders=st.permutations(AXES).map(tuple)))
def test_pp_ends_span_the_highest_boundary(inst) -> None:
    """In any order the first and last stage's worst pair spans the highest stage boundary (units hold
    consecutive ranks): the tied embeddings' all-reduce costs what 'fan-out 2 at max(boundary levels)' cost."""
    topo, dims, order = inst
    pl = place(dims, topo, order)
    if dims.pp == 1:
        assert pl.pp_ends.size == 1 and pl.pp_ends.fanout == (1,) * topo.num_levels
    else:
        level = max(pl.pp_boundary_levels)
        assert pl.pp_ends.level == level
        assert pl.pp_ends.fanout == tuple(2 if i == level else 1 for i in range(topo.num_levels))


def test_orders_differ_where_expected() -> None:
    topo = Topology("t", (Level("node", 8, 4e11, 1e-6), Level("leaf", 4, 5e10, 3e-6), Level("spine", 4, 5e10, 5e-6)))
    fast = TopologyPlacements(topo)
    # replica-major keeps a 4-stage pipeline of 2-device stages inside one node
    assert fast.boundary_levels(REPLICA_MAJOR, 2, 8, 4) == (0, 0, 0)
    assert fast.pp_ends(REPLICA_MAJOR, 2, 8, 4).fanout == (2, 1, 1)
    # stage-major spreads the stages 16 ranks apart: across nodes, inside a leaf
    assert fast.boundary_levels(STAGE_MAJOR, 2, 8, 4) == (1, 2, 1)  # ranks 31|32 cross a 32-device leaf
    assert fast.pp_ends(STAGE_MAJOR, 2, 8, 4).fanout == (1, 1, 2)  # rank 0 and rank 48: two leaves
    assert fast.group(STAGE_MAJOR, "dp", 2, 1, 1, 8, 4).fanout == (4, 2, 1)


def test_queries_are_cached() -> None:
    """Each answer is computed once per key; a tuple of strings is the same key as the named order."""
    topo = Topology("t", (Level("node", 8, 4e11, 1e-6), Level("leaf", 4, 5e10, 3e-6)))
    fast = TopologyPlacements(topo)
    strings = ("tp", "cp", "ep", "dp", "pp")
    assert fast.group(strings, "dp", 2, 1, 1, 4, 2) is fast.group(STAGE_MAJOR, "dp", 2, 1, 1, 4, 2)
    assert fast.boundary_levels(strings, 2, 4, 2) is fast.boundary_levels(STAGE_MAJOR, 2, 4, 2)
    assert fast.pp_ends(strings, 2, 4, 2) is fast.pp_ends(STAGE_MAJOR, 2, 4, 2)
    assert fast.level_matrix(strings, 2, 4, 3) is fast.level_matrix(STAGE_MAJOR, 2, 4, 3)
