"""Fast placement queries for the search, for the two rank-grid orders it explores.

``place`` (strategy/placement.py) states the placement once for any axis order; the
search asks the same questions (the level of every stage boundary, the fan-out of the
data-parallel groups) for thousands of (devices per stage, replicas, stages) triples, so
this module answers them arithmetically for two orders and is tested to agree with
``place`` exactly:

  stage-major   ("tp", "cp", "ep", "dp", "pp"): Megatron-LM's default; rank =
                stage * d * a + replica * a + local (a = tp * cp * ep)
  replica-major ("tp", "cp", "ep", "pp", "dp"): each replica's pipeline contiguous; rank =
                replica * p * a + stage * a + local
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from nestplan.network.topology import Topology
from nestplan.strategy.placement import GroupSpan, worst_span

STAGE_MAJOR = ("tp", "cp", "ep", "dp", "pp")
REPLICA_MAJOR = ("tp", "cp", "ep", "pp", "dp")
SEARCH_ORDERS = (STAGE_MAJOR, REPLICA_MAJOR)


def _pair_levels(topo: Topology, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Level spanned by the worst pair (R, R + gap) with R in [low, low + gap): the pairs
    cover (low, high] where high = low + 2 gap - 1; a level-i unit boundary inside it
    puts some pair in two units of level i, so the pair spans level i + 1."""
    level = np.zeros(low.shape, dtype=np.int64)
    for i in range(topo.num_levels - 1):
        unit = topo.unit_devices(i)
        level = np.where(high // unit > low // unit, i + 1, level)
    return level


class SearchPlacement:
    """Placement answers for one topology, cached per (order, a, d[, p])."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.boundary_levels = lru_cache(maxsize=None)(self._boundary_levels)
        self.group = lru_cache(maxsize=None)(self._group)
        self.level_matrix = lru_cache(maxsize=None)(self._level_matrix)

    def _level_matrix(self, order: tuple[str, ...], a: int, d: int, depth: int) -> np.ndarray:
        """(depth, depth + 1) array: [p - 1, s + 1] = level of the link between stages s and s + 1
        of a p-stage pipeline, -1 where there is no such link."""
        out = np.full((depth, depth + 1), -1, dtype=np.int64)
        for p in range(2, depth + 1):
            out[p - 1, 1:p] = self.boundary_levels(order, a, d, p)
        return out

    def _boundary_levels(self, order: tuple[str, ...], a: int, d: int, p: int) -> tuple[int, ...]:
        """Level of the link between stage s and s + 1 (s = 0 .. p - 2), worst over replicas."""
        if p <= 1:
            return ()
        s = np.arange(p - 1)
        if order == STAGE_MAJOR:
            gap = d * a
            low = s * gap
            levels = _pair_levels(self.topo, low, low + 2 * gap - 1)
        else:
            assert order == REPLICA_MAJOR, order
            r = np.arange(d)[:, None]
            low = r * p * a + s[None, :] * a
            levels = _pair_levels(self.topo, low, low + 2 * a - 1).max(axis=0)
        return tuple(int(x) for x in levels)

    def _group(self, order: tuple[str, ...], axes: str, tp: int, cp: int, ep: int, d: int, p: int) -> GroupSpan:
        """Worst group of ``axes`` ('tp', 'cp', 'ep', 'dp', 'cp+dp', 'cp+ep+dp', 'ep+dp')."""
        a = tp * cp * ep
        inner = {"tp": (1, tp), "cp": (tp, cp), "ep": (tp * cp, ep)}
        names = axes.split("+")
        # members along the named axes: offsets (one per combination) relative to a group base
        offsets = np.zeros(1, dtype=np.int64)
        for name in names:
            if name == "dp":
                stride, size = (a, d) if order == STAGE_MAJOR else (p * a, d)
            else:
                stride, size = inner[name]
            offsets = (offsets[:, None] + stride * np.arange(size)[None, :]).ravel()
        # group bases: every rank whose coordinates along ``names`` are zero
        coords = []
        for name, size in (("tp", tp), ("cp", cp), ("ep", ep)):
            if name not in names:
                coords.append(inner[name][0] * np.arange(size))
        rest = d * p * a
        if "dp" not in names:
            coords.append((a if order == STAGE_MAJOR else p * a) * np.arange(d))
        coords.append((d * a if order == STAGE_MAJOR else a) * np.arange(p))
        bases = np.zeros(1, dtype=np.int64)
        for c in coords:
            bases = (bases[:, None] + c[None, :]).ravel()
        assert bases.size * offsets.size == rest
        return worst_span(self.topo, bases[:, None] + offsets[None, :])
