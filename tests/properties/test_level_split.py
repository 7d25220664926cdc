"""The collective costs are invariant under re-describing the same hardware (hypothesis; issue 27).

A level of size a x b drawn as two adjacent levels of a and b with the same links (bandwidth, latency,
bus efficiency, oversubscription, mesh links: ``Level.links``), or two such levels drawn as one, is the
same network: every collective over every rank-grid group (the groups a placement forms: ranks spaced by
the strides of some axes of a grid) costs the same on both drawings, and so does a point-to-point
transfer between any two ranks and the units a token's expert copies reach.
"""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from nestplan.cost.comm import remote_units
from nestplan.model.spec import ModelSpec
from nestplan.network import collectives as coll
from nestplan.network.topology import Level, Topology

BANDWIDTHS_BPS = (25e9, 50e9, 450e9, 900e9)
LATENCIES_S = (0.0, 1e-6, 5e-6)
EFFICIENCIES = (0.8, 1.0)
OVERSUBSCRIPTIONS = (1.0, 2.0)
MAX_LEVEL_SIZE = 8


@st.composite
def levels(draw: st.DrawFn, index: int) -> Level:
    bandwidth = draw(st.sampled_from(BANDWIDTHS_BPS))
    mesh = draw(st.sampled_from((None, bandwidth, bandwidth / 7)))
    return Level(
        name=f"level{index}",
        size=draw(st.integers(1, MAX_LEVEL_SIZE)),
        bandwidth_Bps=bandwidth,
        latency_s=draw(st.sampled_from(LATENCIES_S)),
        oversubscription=draw(st.sampled_from(OVERSUBSCRIPTIONS)),
        bus_efficiency=draw(st.sampled_from(EFFICIENCIES)),
        mesh_link_Bps=mesh,
    )


@st.composite
def drawings(draw: st.DrawFn) -> tuple[Topology, Topology]:
    """A topology and the same one with one level drawn as two (sizes a and b, a x b = its size)."""
    count = draw(st.integers(1, 3))
    drawn = [draw(levels(i)) for i in range(count)]
    k = draw(st.integers(0, count - 1))
    size = drawn[k].size
    inner = draw(st.sampled_from([d for d in range(1, size + 1) if size % d == 0]))
    halves = (
        replace(drawn[k], name="inner half", size=inner),
        replace(drawn[k], name="outer half", size=size // inner),
    )
    split = drawn[:k] + list(halves) + drawn[k + 1 :]
    return Topology("one", tuple(drawn)), Topology("two", tuple(split))


def _primes(n: int) -> list[int]:
    factors, p = [], 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return factors


@st.composite
def grid_groups(draw: st.DrawFn, topology: Topology) -> tuple[int, ...]:
    """The ranks of one group of a rank grid aligned with ``topology``'s units, as a placement's degrees
    are: the grid's axes (fastest first) group consecutive prime factors of the level sizes, innermost
    first; the group is the ranks that differ only along a chosen subset of axes."""
    primes = [p for level in topology.levels for p in _primes(level.size)]
    cuts = sorted(set(draw(st.lists(st.integers(1, max(len(primes) - 1, 1)), max_size=len(primes)))))
    bounds = [0] + [c for c in cuts if c < len(primes)] + [len(primes)]
    axes = [math.prod(primes[a:b]) for a, b in zip(bounds, bounds[1:])]
    chosen = draw(st.lists(st.booleans(), min_size=len(axes), max_size=len(axes)))
    strides = [math.prod(axes[:i]) for i in range(len(axes))]
    offset = sum(draw(st.integers(0, axes[i] - 1)) * strides[i] for i, c in enumerate(chosen) if not c)
    ranks = [offset]
    for i, c in enumerate(chosen):
        if c:
            ranks = [r + j * strides[i] for r in ranks for j in range(axes[i])]
    return tuple(ranks)


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_every_collective_costs_the_same_on_either_drawing(data: st.DataObject) -> None:
    one, two = data.draw(drawings())
    assert one.devices == two.devices
    ranks = data.draw(grid_groups(two))
    f_one, f_two = one.fanout(ranks), two.fanout(ranks)
    assert math.prod(f_one) == math.prod(f_two) == len(ranks)
    nbytes = data.draw(st.sampled_from((1.0, 4096.0, 3e8)))
    outer = data.draw(st.sampled_from((1.0, 0.5, 0.125)))
    for collective in (coll.all_reduce, coll.reduce_scatter, coll.all_gather, coll.all_to_all):
        assert _same(collective(one, f_one, nbytes), collective(two, f_two, nbytes)), collective.__name__
    assert _same(coll.all_to_all(one, f_one, nbytes, outer), coll.all_to_all(two, f_two, nbytes, outer))
    assert _same(coll.bus_bandwidth(one, f_one), coll.bus_bandwidth(two, f_two))


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_point_to_point_and_expert_units_are_the_same_on_either_drawing(data: st.DataObject) -> None:
    one, two = data.draw(drawings())
    a = data.draw(st.integers(0, one.devices - 1))
    b = data.draw(st.integers(0, one.devices - 1))
    pair = {a, b}
    level_one, level_two = one.span_level(one.fanout(pair)), two.span_level(two.fanout(pair))
    assert _same(coll.send_recv(one, level_one, 1e6), coll.send_recv(two, level_two, 1e6))
    ranks = data.draw(grid_groups(two))
    spec = data.draw(st.sampled_from(_MOE_SPECS))
    assert remote_units(spec, one, one.fanout(ranks)) == remote_units(spec, two, two.fanout(ranks))


def _moe_specs() -> tuple[ModelSpec, ...]:
    from nestplan.model import load_model

    return tuple(load_model(name) for name in ("mixtral-8x7b", "deepseek-v3"))


_MOE_SPECS = _moe_specs()
