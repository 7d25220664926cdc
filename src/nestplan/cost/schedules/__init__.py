"""Pipeline schedules, one home: the registry of schedule classes (cost/schedules/families.py) keyed by
``Schedule``, and what everything else asks of it.

- families.py: one class per schedule family (chunks, operation order, warm-up forwards, variants);
- operations.py: the operation orders they state;
- walk.py: the one simulator and the one memory walk, over any schedule's operation lists;
- periodic.py: the fast path of Megatron-LM's orders (the period skip, GPipe's closed form), checked
  against the walk in tests/unit/test_schedule_registry.py.

Adding a schedule: its ``Schedule`` member (with its chunks per stage), its class in families.py,
its entry in ``REGISTRY``, and in each exporter one line saying whether the framework runs it.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np

from nestplan.cost.schedules.families import (
    Changes,
    DualPipeV,
    GPipe,
    Interleaved,
    OneFOneB,
    PipelineSchedule,
    ZeroBubbleH1,
    ZeroBubbleV,
)
from nestplan.cost.schedules.operations import Op
from nestplan.errors import ConfigError
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Schedule

REGISTRY: dict[Schedule, PipelineSchedule] = {
    Schedule.ONE_F_ONE_B: OneFOneB(Schedule.ONE_F_ONE_B),
    Schedule.GPIPE: GPipe(Schedule.GPIPE),
    Schedule.INTERLEAVED: Interleaved(Schedule.INTERLEAVED),
    Schedule.ZB_H1: ZeroBubbleH1(Schedule.ZB_H1),
    Schedule.ZBV: ZeroBubbleV(Schedule.ZBV),
    Schedule.DUALPIPEV: DualPipeV(Schedule.DUALPIPEV),
}
assert tuple(REGISTRY) == tuple(Schedule), "every Schedule member has its class, in the enum's order"


def family(schedule: Schedule) -> PipelineSchedule:
    """The class instance that states ``schedule``."""
    return REGISTRY[Schedule(schedule)]


def named(schedule: Schedule, virtual_stages: int) -> Schedule:
    """The schedule a user means by ``schedule`` with ``virtual_stages`` chunks per stage. The stated
    rule: a schedule of one chunk per stage named with v > 1 means its interleaved form where it has
    one (1F1B with v > 1 is interleaved 1F1B, as Megatron-LM's --num-layers-per-virtual-pipeline-stage
    turns its 1F1B into it); any other schedule is itself (ParallelDims judges the pair)."""
    form = family(schedule).interleaved_form
    return form if virtual_stages > 1 and form is not None else Schedule(schedule)


def warmup_forwards(
    schedule: Schedule, stage: int | np.ndarray, pp: int | np.ndarray, m: int, virtual: int
) -> np.ndarray:
    """Forwards (of model chunks) a stage runs before its first backward (its class's count):
    the memory's microbatches in flight and the schedule simulation both use it."""
    return family(schedule).warmup_forwards(stage, pp, m, virtual)


@lru_cache(maxsize=4096)
def stage_operations(schedule: Schedule, stage: int, pp: int, m: int, virtual: int) -> tuple[Op, ...]:
    """Stage ``stage``'s operations, in order, for ``m`` microbatches over ``pp`` stages of ``virtual`` chunks."""
    return tuple(family(schedule).operations(stage, pp, m, virtual))


@lru_cache(maxsize=4096)
def operation_arrays(
    schedule: Schedule, stage: int, pp: int, m: int, virtual: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`stage_operations` as arrays (kind, chunk, chunk2), for the vectorised memory walk and
    the simulation's program."""
    ops = stage_operations(schedule, stage, pp, m, virtual)
    return tuple(np.array([getattr(op, f) for op in ops], dtype=np.int64) for f in ("kind", "chunk", "chunk2"))


def _legal_variant(dims: ParallelDims, changes: Changes, num_layers: int, global_batch_size: int) -> list[ParallelDims]:
    """``dims`` with ``changes``, where that is a legal plan for the model's layers and the batch; else none."""
    try:
        variant = replace(dims, **changes)
    except ConfigError:
        return []
    legal = variant.layers_conflict(num_layers) is None and variant.batch_conflict(global_batch_size) is None
    return [variant] if legal else []


def _in_registry_order(schedules: Iterable[Schedule]) -> list[PipelineSchedule]:
    return [REGISTRY[s] for s in REGISTRY if s in set(schedules)]


def variants(
    schedules: Iterable[Schedule],
    dims: ParallelDims,
    num_layers: int,
    global_batch_size: int,
    splits: Sequence[tuple[int, ...]],
) -> list[ParallelDims]:
    """The legal variants of the 1F1B plan ``dims`` under each of ``schedules``
    (PipelineSchedule.candidates; ``splits``: layers per stage to try), in the registry's order; none
    without a pipeline."""
    if dims.pp < 2 or dims.schedule is not Schedule.ONE_F_ONE_B:
        return []
    return [
        variant
        for cls in _in_registry_order(schedules)
        for changes in cls.candidates(dims, num_layers, splits)
        for variant in _legal_variant(dims, changes, num_layers, global_batch_size)
    ]


def layout_variants(
    schedules: Iterable[Schedule], dims: ParallelDims, num_layers: int, global_batch_size: int
) -> list[ParallelDims]:
    """The legal variants of ``dims``'s degrees that set their own layers per virtual stage
    (PipelineSchedule.layouts), whatever the plan's split."""
    return [
        variant
        for cls in _in_registry_order(schedules)
        for changes in cls.layouts(dims, num_layers)
        for variant in _legal_variant(dims, changes, num_layers, global_batch_size)
    ]
