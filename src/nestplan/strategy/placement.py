"""Placement: the rank grid's axis order and the network level every group spans.

The one answer to "which level does this group span": the evaluator's step end, the search,
the plots and the exports all ask this module. Rank r has coordinates along the axes in
``axis_order`` (first = fastest varying, as in Megatron-LM's default order tp-cp-ep-dp-pp
reversed for the grid), so a group along axis ``a`` is a set of ranks with stride
prod(degrees of faster axes). Ranks are laid on the topology's devices in order, so a unit of
level i holds ``topo.unit_devices(i)`` consecutive ranks.

Two methods give the same answers: the rank grid (any permutation of the axes) and arithmetic
on strides for the two named orders (a = tp * cp * ep ranks per stage):

  stage-major   (tp, cp, ep, dp, pp): Megatron-LM's default; rank = stage * d * a + replica * a + local
  replica-major (tp, cp, ep, pp, dp): each replica's pipeline contiguous; rank = replica * p * a + stage * a + local

The search asks for thousands of (devices per stage, replicas, stages) triples of one topology
(``TopologyPlacements``); ``place`` answers one plan and caches its ``Placement``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from types import MappingProxyType

import numpy as np

from nestplan.errors import ConfigError
from nestplan.network.topology import Topology
from nestplan.strategy.axes import AXES, DEFAULT_AXIS_ORDER, NAMED_ORDERS, REPLICA_MAJOR, STAGE_MAJOR, Axis
from nestplan.strategy.dims import ParallelDims


@dataclass(frozen=True)
class GroupSpan:
    """The worst group of one set of axes: its fan-out per level and the level it spans."""

    size: int
    fanout: tuple[int, ...]
    level: int


@dataclass(frozen=True)
class Placement:
    axis_order: tuple[str, ...]
    groups: Mapping[str, GroupSpan]  # keys: GROUP_KEYS ("tp", "cp", "ep", "dp", "ep+dp", ...), EXPERT_GROUP_KEYS
    pp_boundary_levels: tuple[int, ...]  # level of the link between stage i and i+1 (worst over replicas)
    pp_ends: GroupSpan  # a rank of the first stage and its peer on the last (worst pair;
    #                                         one member when pp = 1): the tied embeddings' all-reduce group

    def levels_spanned(self) -> dict[str, int]:
        """Level each axis' worst group spans (a one-member group lies inside a node: 0)."""
        out = {axis: self.groups[axis].level for axis in AXES if axis != Axis.PP}
        out[Axis.PP] = max(self.pp_boundary_levels, default=0)
        return {axis: out[axis] for axis in AXES}


GROUP_KEYS = ("tp", "cp", "ep", "dp", "ep+dp", "cp+dp", "cp+ep+dp", "tp+cp")
# the MoE layers' own groups under parallel folding (strategy.dims.ParallelDims.etp): "expert" holds
# different experts (tp / etp ranks of each tp group at stride etp, times the ep ranks: Megatron-Core
# lays experts out etp-ep-edp, etp fastest), "etp" splits one expert (etp consecutive tp ranks);
# unfolded (etp = tp) they are the "ep" and "tp" groups
EXPERT_GROUP_KEYS = ("expert", "etp")


def consecutive_span_level(devices: int, unit_devices: Sequence[int]) -> int:
    """Index of the innermost level whose unit holds ``devices`` consecutive ranks from a unit-aligned
    start (the outermost level when none does); ``unit_devices[i]``: devices in one unit of level i."""
    return next((i for i, unit in enumerate(unit_devices) if unit >= devices), len(unit_devices) - 1)


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


# ---------------------------------------------------------------- the rank grid: any axis order
def rank_grid(dims: ParallelDims, axis_order: Sequence[str]) -> np.ndarray:
    """Array of ranks indexed [tp, cp, ep, pp, dp] (AXES order) for the given fastest-first axis order."""
    order = tuple(axis_order)
    if sorted(order) != sorted(AXES):
        raise ConfigError(
            f"axis order {','.join(order)} must be a permutation of {','.join(AXES)}",
            field="axis_order",
            value=order,
            limit=AXES,
        )
    shape_fast_first = [dims.degree(a) for a in order]
    ranks = np.arange(dims.devices).reshape(shape_fast_first[::-1])  # C order: last index fastest
    slowest_first = order[::-1]
    return np.transpose(ranks, [slowest_first.index(a) for a in AXES])


def _groups_along(grid: np.ndarray, axes: Sequence[str]) -> np.ndarray:
    idx = [AXES.index(a) for a in axes]
    rest = [i for i in range(len(AXES)) if i not in idx]
    moved = np.transpose(grid, rest + idx)
    size = int(np.prod([grid.shape[i] for i in idx]))
    return moved.reshape(-1, size)


def grid_placement(dims: ParallelDims, topo: Topology, axis_order: Sequence[str]) -> Placement:
    """The placement read off the rank grid: any permutation of the axes (uncached; ``place`` caches)."""
    _check_fits(dims, topo)
    grid = rank_grid(dims, axis_order)
    groups = {key: worst_span(topo, _groups_along(grid, key.split("+"))) for key in GROUP_KEYS}
    groups.update({key: worst_span(topo, ranks) for key, ranks in expert_rank_groups(grid, dims.expert_tp).items()})
    pp_axis = AXES.index(Axis.PP)

    def stage(s: int) -> np.ndarray:
        return np.take(grid, s, axis=pp_axis).reshape(-1, 1)

    boundary = tuple(worst_span(topo, np.hstack([stage(s), stage(s + 1)])).level for s in range(dims.pp - 1))
    ends = np.hstack([stage(0), stage(dims.pp - 1)]) if dims.pp > 1 else stage(0)
    return Placement(
        axis_order=tuple(axis_order),
        groups=MappingProxyType(groups),
        pp_boundary_levels=boundary,
        pp_ends=worst_span(topo, ends),
    )


def expert_rank_groups(grid: np.ndarray, etp: int) -> dict[str, np.ndarray]:
    """The "expert" and "etp" rank groups of a rank grid: its tp coordinate split as (tp / etp, etp),
    etp fastest."""
    tp = grid.shape[0]
    split = grid.reshape((tp // etp, etp) + grid.shape[1:])  # [tp / etp, etp, cp, ep, pp, dp]
    ep_axis = 1 + AXES.index(Axis.EP)  # the tp axis (index 0) became two

    def along(axes: list[int]) -> np.ndarray:
        rest = [i for i in range(split.ndim) if i not in axes]
        return np.transpose(split, rest + axes).reshape(-1, int(np.prod([split.shape[i] for i in axes])))

    return {"expert": along([0, ep_axis]), "etp": along([1])}


# ---------------------------------------------------------------- arithmetic: the two named orders
def _strides(order: tuple[str, ...], tp: int, cp: int, ep: int, d: int, p: int) -> dict[str, tuple[int, int]]:
    """(stride, degree) of every axis in a named order."""
    a = tp * cp * ep
    if order == STAGE_MAJOR:
        dp_stride, pp_stride = a, d * a
    else:
        assert order == REPLICA_MAJOR, order
        dp_stride, pp_stride = p * a, a
    return {
        Axis.TP: (1, tp),
        Axis.CP: (tp, cp),
        Axis.EP: (tp * cp, ep),
        Axis.DP: (dp_stride, d),
        Axis.PP: (pp_stride, p),
    }


def _lattice(strides: Sequence[tuple[int, int]]) -> np.ndarray:
    """Every sum of one multiple k * stride (0 <= k < degree) per (stride, degree)."""
    out = np.zeros(1, dtype=np.int64)
    for stride, degree in strides:
        out = (out[:, None] + stride * np.arange(degree)[None, :]).ravel()
    return out


def named_group(
    topo: Topology, order: tuple[str, ...], axes: str, tp: int, cp: int, ep: int, d: int, p: int
) -> GroupSpan:
    """Worst group of ``axes`` (a GROUP_KEYS entry) in a named order: each group is a base (a rank
    whose coordinates along ``axes`` are zero) plus the lattice of the axes' strides."""
    strides = _strides(order, tp, cp, ep, d, p)
    names = axes.split("+")
    offsets = _lattice([strides[name] for name in names])
    bases = _lattice([strides[axis] for axis in AXES if axis not in names])
    return worst_span(topo, bases[:, None] + offsets[None, :])


def named_expert_group(
    topo: Topology, order: tuple[str, ...], key: str, tp: int, etp: int, cp: int, ep: int, d: int, p: int
) -> GroupSpan:
    """Worst "expert" or "etp" group (EXPERT_GROUP_KEYS) in a named order, where tp is the fastest axis:
    within a tp group the etp shard is (stride 1, etp ranks), the folded experts (stride etp, tp / etp)."""
    strides = _strides(order, tp, cp, ep, d, p)
    shard, spread = (1, etp), (etp, tp // etp)
    others = [strides[axis] for axis in (Axis.CP, Axis.DP, Axis.PP)]
    if key == "expert":
        offsets, bases = _lattice([spread, strides[Axis.EP]]), _lattice([shard, *others])
    else:
        assert key == "etp", key
        offsets, bases = _lattice([shard]), _lattice([spread, strides[Axis.EP], *others])
    return worst_span(topo, bases[:, None] + offsets[None, :])


def _pair_levels(topo: Topology, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Level spanned by the worst pair (R, R + gap) with R in [low, low + window), where
    high = low + window - 1 + gap: every level-i unit boundary in (low, high] falls between
    some pair's two members (the pairs' intervals (R, R + gap] tile it), so that pair spans
    level i + 1; with none, every pair lies in one unit."""
    level = np.zeros(np.shape(low), dtype=np.int64)
    for i in range(topo.num_levels - 1):
        unit = topo.unit_devices(i)
        level = np.where(high // unit > low // unit, i + 1, level)
    return level


def named_boundary_levels(topo: Topology, order: tuple[str, ...], a: int, d: int, p: int) -> tuple[int, ...]:
    """Level of the link between stage s and s + 1 (s = 0 .. p - 2), worst over replicas, in a named
    order with ``a`` ranks per stage and ``d`` replicas."""
    if p <= 1:
        return ()
    s = np.arange(p - 1)
    if order == STAGE_MAJOR:  # stage s: the d * a ranks from s * d * a
        gap = d * a
        low = s * gap
        levels = _pair_levels(topo, low, low + 2 * gap - 1)
    else:  # replica r, stage s: the a ranks from r * p * a + s * a
        assert order == REPLICA_MAJOR, order
        low = np.arange(d)[:, None] * p * a + s[None, :] * a
        levels = _pair_levels(topo, low, low + 2 * a - 1).max(axis=0)
    return tuple(int(x) for x in levels)


def named_pp_ends(topo: Topology, order: tuple[str, ...], a: int, d: int, p: int) -> GroupSpan:
    """The worst pair (a rank of stage 0, the same coordinates on stage p - 1) in a named order: the
    pairs' ranks run from the first stage's first rank to the last stage's last, per replica when
    the replicas' pipelines are contiguous. One member when p = 1."""
    if p <= 1:
        return GroupSpan(size=1, fanout=(1,) * topo.num_levels, level=0)
    if order == STAGE_MAJOR:
        low = np.zeros(1, dtype=np.int64)
        high = low + p * d * a - 1
    else:
        assert order == REPLICA_MAJOR, order
        low = np.arange(d) * p * a
        high = low + p * a - 1
    level = int(_pair_levels(topo, low, high).max())
    return GroupSpan(size=2, fanout=tuple(2 if i == level else 1 for i in range(topo.num_levels)), level=level)


def _named_placement(dims: ParallelDims, topo: Topology, axis_order: Sequence[str]) -> Placement:
    _check_fits(dims, topo)
    order = tuple(axis_order)
    tp, cp, ep, d, p = dims.tp, dims.cp, dims.ep, dims.dp, dims.pp
    groups = {key: named_group(topo, order, key, tp, cp, ep, d, p) for key in GROUP_KEYS}
    groups.update(
        {key: named_expert_group(topo, order, key, tp, dims.expert_tp, cp, ep, d, p) for key in EXPERT_GROUP_KEYS}
    )
    a = tp * cp * ep
    return Placement(
        axis_order=order,
        groups=MappingProxyType(groups),
        pp_boundary_levels=named_boundary_levels(topo, order, a, d, p),
        pp_ends=named_pp_ends(topo, order, a, d, p),
    )


class TopologyPlacements:
    """The search's placement queries for one topology and the two named orders, each answer cached
    (the search asks for thousands of (devices per stage, replicas, stages) triples):

    - ``group(order, axes, tp, cp, ep, d, p)``: worst group of ``axes`` (``named_group``)
    - ``expert_group(order, key, tp, etp, cp, ep, d, p)``: the MoE layers' groups (``named_expert_group``)
    - ``boundary_levels(order, a, d, p)``: level of each stage boundary (``named_boundary_levels``)
    - ``pp_ends(order, a, d, p)``: the first and last stage's worst pair (``named_pp_ends``)
    - ``level_matrix(order, a, d, depth)``: every pipeline depth's boundary levels at once
    """

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.group = lru_cache(maxsize=None)(partial(named_group, topo))
        self.expert_group = lru_cache(maxsize=None)(partial(named_expert_group, topo))
        self.boundary_levels = lru_cache(maxsize=None)(partial(named_boundary_levels, topo))
        self.pp_ends = lru_cache(maxsize=None)(partial(named_pp_ends, topo))
        self.level_matrix = lru_cache(maxsize=None)(self._level_matrix)

    def _level_matrix(self, order: tuple[str, ...], a: int, d: int, depth: int) -> np.ndarray:
        """(depth, depth + 1) array: [p - 1, s + 1] = level of the link between stages s and s + 1
        of a p-stage pipeline, -1 where there is no such link."""
        out = np.full((depth, depth + 1), -1, dtype=np.int64)
        for p in range(2, depth + 1):
            out[p - 1, 1:p] = self.boundary_levels(order, a, d, p)
        return out


# ---------------------------------------------------------------- one cached Placement per plan
_MAX_CACHED_PLACEMENTS = 4096  # distinct (degrees, topology, axis order) kept; a planner run meets a few hundred
_placements: dict[tuple, Placement] = {}


def place(dims: ParallelDims, topo: Topology, axis_order: Sequence[str] = DEFAULT_AXIS_ORDER) -> Placement:
    """Map the plan's rank grid onto the topology's first ``dims.devices`` devices: by arithmetic for
    the two named orders, from the rank grid for any other permutation.

    A placement depends on the degrees, the axis order and the topology only, never on the split
    or the schedule, so it is computed once per such key (the planner's polishing evaluates dozens
    of splits of the same degrees) and the same object is returned."""
    key = (tuple(dims.degree(a) for a in AXES), dims.expert_tp, topo, tuple(axis_order))
    found = _placements.get(key)
    if found is None:
        method = _named_placement if tuple(axis_order) in NAMED_ORDERS else grid_placement
        found = method(dims, topo, axis_order)
        if len(_placements) >= _MAX_CACHED_PLACEMENTS:
            _placements.clear()
        _placements[key] = found
    return found


def _check_fits(dims: ParallelDims, topo: Topology) -> None:
    if dims.devices > topo.devices:
        raise ConfigError(
            f"the plan needs {dims.devices} devices but the cluster has {topo.devices}",
            field="devices",
            value=dims.devices,
            limit=topo.devices,
        )
