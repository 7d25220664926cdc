"""Placement: the rank grid's axis order and the network level every group spans.

Stated once here; collective costs and exported rank orders derive from it.
Rank r has coordinates along the axes in ``axis_order`` (first = fastest varying,
as in Megatron-LM's default order tp-cp-ep-dp-pp reversed for the grid), so a
group along axis ``a`` is a set of ranks with stride prod(degrees of faster axes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from nestplan.errors import ConfigError
from nestplan.network.topology import Topology
from nestplan.strategy.dims import AXES, ParallelDims

DEFAULT_AXIS_ORDER = ("tp", "cp", "ep", "pp", "dp")


@dataclass(frozen=True)
class GroupSpan:
    """The worst group of one set of axes: its fan-out per level and the level it spans."""

    size: int
    fanout: tuple[int, ...]
    level: int


@dataclass(frozen=True)
class Placement:
    axis_order: tuple[str, ...]
    groups: Mapping[str, GroupSpan]         # keys: "tp", "cp", "ep", "dp", "ep+dp", "cp+ep+dp", "cp+dp", ...
    pp_boundary_levels: tuple[int, ...]     # level of the link between stage i and i+1 (worst over replicas)

    def levels_spanned(self) -> dict[str, int]:
        """Level each axis' worst group spans (a one-member group lies inside a node: 0)."""
        out = {axis: self.groups[axis].level for axis in AXES if axis != "pp"}
        out["pp"] = max(self.pp_boundary_levels, default=0)
        return {axis: out[axis] for axis in AXES}


def rank_grid(dims: ParallelDims, axis_order: Sequence[str]) -> np.ndarray:
    """Array of ranks indexed [tp, cp, ep, pp, dp] (AXES order) for the given fastest-first axis order."""
    order = tuple(axis_order)
    if sorted(order) != sorted(AXES):
        raise ConfigError(f"axis order {','.join(order)} must be a permutation of {','.join(AXES)}",
                          field="axis_order", value=order, limit=AXES)
    shape_fast_first = [dims.degree(a) for a in order]
    ranks = np.arange(dims.devices).reshape(shape_fast_first[::-1])  # C order: last index fastest
    slowest_first = order[::-1]
    return np.transpose(ranks, [slowest_first.index(a) for a in AXES])


def worst_span(topo: Topology, groups: np.ndarray) -> GroupSpan:
    """groups: (n_groups, size) rank array. Returns the group that spans highest (widest fan-out there)."""
    n_groups, size = groups.shape
    fanouts = np.empty((n_groups, topo.num_levels), dtype=np.int64)
    prev = np.full(n_groups, size, dtype=np.int64)
    for i in range(topo.num_levels):
        units = np.sort(groups // topo.unit_devices(i), axis=1)
        n_units = 1 + np.count_nonzero(np.diff(units, axis=1), axis=1)
        fanouts[:, i] = -(-prev // n_units)
        prev = n_units
    # rank groups by (highest level with fan-out > 1, then fan-out from the outermost level down)
    keys = [fanouts[:, i] for i in range(topo.num_levels)]
    worst = int(np.lexsort(keys)[-1])
    fan = tuple(int(x) for x in fanouts[worst])
    return GroupSpan(size=size, fanout=fan, level=topo.span_level(fan))


def _groups_along(grid: np.ndarray, axes: Sequence[str]) -> np.ndarray:
    idx = [AXES.index(a) for a in axes]
    rest = [i for i in range(len(AXES)) if i not in idx]
    moved = np.transpose(grid, rest + idx)
    size = int(np.prod([grid.shape[i] for i in idx]))
    return moved.reshape(-1, size)


GROUP_KEYS = ("tp", "cp", "ep", "dp", "ep+dp", "cp+dp", "cp+ep+dp", "tp+cp")


_MAX_CACHED_PLACEMENTS = 4096   # distinct (degrees, topology, axis order) kept; a planner run meets a few hundred
_placements: dict[tuple, Placement] = {}


def place(dims: ParallelDims, topo: Topology, axis_order: Sequence[str] = DEFAULT_AXIS_ORDER) -> Placement:
    """Map the plan's rank grid onto the topology's first ``dims.devices`` devices.

    A placement depends on the degrees, the axis order and the topology only, never on the split
    or the schedule, so it is computed once per such key (the planner's polishing evaluates dozens
    of splits of the same degrees)."""
    key = (tuple(dims.degree(a) for a in AXES), topo, tuple(axis_order))
    found = _placements.get(key)
    if found is None:
        found = _place(dims, topo, axis_order)
        if len(_placements) >= _MAX_CACHED_PLACEMENTS:
            _placements.clear()
        _placements[key] = found
    return found


def _place(dims: ParallelDims, topo: Topology, axis_order: Sequence[str]) -> Placement:
    if dims.devices > topo.devices:
        raise ConfigError(f"the plan needs {dims.devices} devices but the cluster has {topo.devices}",
                          field="devices", value=dims.devices, limit=topo.devices)
    grid = rank_grid(dims, axis_order)
    groups = {key: worst_span(topo, _groups_along(grid, key.split("+"))) for key in GROUP_KEYS}
    pp_axis = AXES.index("pp")
    boundary: list[int] = []
    for stage in range(dims.pp - 1):
        a = np.take(grid, stage, axis=pp_axis).reshape(-1, 1)
        b = np.take(grid, stage + 1, axis=pp_axis).reshape(-1, 1)
        boundary.append(worst_span(topo, np.hstack([a, b])).level)
    return Placement(axis_order=tuple(axis_order), groups=MappingProxyType(groups),
                     pp_boundary_levels=tuple(boundary))
