"""Bounds on work stated up front (issue 30): each refused in one line before the work it bounds."""

import pytest

from nestplan.cost.schedules.periodic import MAX_RECORDED_OPERATIONS, OPERATIONS_PER_CHUNK_SPLIT, check_recorded
from nestplan.errors import ConfigError
from nestplan.network import graph as graph_module
from nestplan.network.graph import from_graph
from nestplan.network.topology import Level, Topology
from nestplan.report import plots


def _line(devices: int) -> list[tuple[int, int, float, float]]:
    return [(i, i + 1, 1e11, 1e-6) for i in range(devices - 1)]


def test_graph_refused_by_counting_before_a_link_is_read(monkeypatch):
    """4 x devices x links over the budget: refused before any link is read (the 16,384-device case
    took 109 s and 2.1 GB before its error)."""
    read = []
    monkeypatch.setattr(graph_module, "read_link", lambda *args: read.append(args))
    monkeypatch.setattr(graph_module, "MAX_RELAXATIONS", 4 * 8 * 7 - 1)
    with pytest.raises(ConfigError, match="link relaxations") as info:
        from_graph("line", 8, _line(8))
    assert "\n" not in str(info.value) and read == []


def test_graph_at_the_count_is_derived(monkeypatch):
    monkeypatch.setattr(graph_module, "MAX_RELAXATIONS", 10**6)
    assert from_graph("line", 8, _line(8)).topology.devices == 8


def test_placement_canvas_is_bounded_on_a_million_devices():
    """2^20 devices: cells are blocks of whole nodes, at most MAX_PLACEMENT_CELLS of them."""
    topology = Topology(
        "big",
        (
            Level("node", 8, 450e9, 1e-6),
            Level("leaf", 32, 50e9, 3e-6),
            Level("spine", 4096, 50e9, 5e-6),
        ),
    )
    cells = plots._placement_cells(topology)
    assert cells.block % 8 == 0 and topology.devices // cells.block <= plots.MAX_PLACEMENT_CELLS
    assert cells.per_row <= plots.MAX_ROW_CELLS
    small = plots._placement_cells(Topology("small", (Level("node", 8, 450e9, 1e-6), Level("leaf", 4, 50e9, 3e-6))))
    assert (small.block, small.per_row, small.what) == (1, 8, "device")


def test_split_timeline_refused_before_it_is_recorded():
    with pytest.raises(ConfigError, match="operations") as info:
        check_recorded(2, 1_000_000, 1, OPERATIONS_PER_CHUNK_SPLIT)
    assert info.value.limit == MAX_RECORDED_OPERATIONS // (OPERATIONS_PER_CHUNK_SPLIT * 2)
