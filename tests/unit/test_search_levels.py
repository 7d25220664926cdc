"""The search's arithmetic placement agrees with strategy.placement.place exactly."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nestplan.network.topology import Level, Topology
from nestplan.search.levels import (
    REPLICA_MAJOR,
    SEARCH_ORDERS,
    STAGE_MAJOR,
    SearchPlacement,
)
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.placement import place


@st.composite
def instances(draw):
    sizes = draw(st.lists(st.integers(1, 6), min_size=2, max_size=4))
    topo = Topology("t", tuple(Level(f"l{i}", s, 1e9 * (i + 1), 1e-6) for i, s in enumerate(sizes)))
    n = topo.devices
    tp = draw(st.integers(1, 4))
    cp = draw(st.integers(1, 2))
    ep = draw(st.integers(1, 2))
    p = draw(st.integers(1, 6))
    d = draw(st.integers(1, 6))
    if tp * cp * ep * p * d > n:
        d = max(1, n // (tp * cp * ep * p))
    order = draw(st.sampled_from(SEARCH_ORDERS))
    return topo, tp, cp, ep, p, d, order


@settings(max_examples=150, deadline=None)
@given(instances())
def test_matches_place(inst) -> None:
    topo, tp, cp, ep, p, d, order = inst
    dims = ParallelDims(tp=tp, cp=cp, ep=ep, pp=p, dp=d)
    if dims.devices > topo.devices:
        return
    ref = place(dims, topo, order)
    fast = SearchPlacement(topo)
    assert fast.boundary_levels(order, tp * cp * ep, d, p) == ref.pp_boundary_levels
    for key in ("tp", "cp", "ep", "dp", "cp+dp", "cp+ep+dp"):
        assert fast.group(order, key, tp, cp, ep, d, p) == ref.groups[key], key


def test_orders_differ_where_expected() -> None:
    topo = Topology("t", (Level("node", 8, 4e11, 1e-6), Level("leaf", 4, 5e10, 3e-6), Level("spine", 4, 5e10, 5e-6)))
    fast = SearchPlacement(topo)
    # replica-major keeps a 4-stage pipeline of 2-device stages inside one node
    assert fast.boundary_levels(REPLICA_MAJOR, 2, 8, 4) == (0, 0, 0)
    # stage-major spreads the stages 16 ranks apart: across nodes, inside a leaf
    assert fast.boundary_levels(STAGE_MAJOR, 2, 8, 4) == (1, 2, 1)   # ranks 31|32 cross a 32-device leaf
    assert fast.group(STAGE_MAJOR, "dp", 2, 1, 1, 8, 4).fanout == (4, 2, 1)
