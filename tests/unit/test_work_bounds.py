"""Bounds on work stated up front (issue 30): each refused in one line before the work it bounds."""

import pytest

from nestplan.errors import ConfigError
from nestplan.network import graph as graph_module
from nestplan.network.graph import from_graph


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
