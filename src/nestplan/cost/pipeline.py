"""Step time of a pipeline schedule over heterogeneous stages.

Stage i takes F_i forward and B_i backward per microbatch (its sends included), C_i = F_i + B_i.
The evaluator simulates the schedule (cost/schedules). For p equal stages the simulation
gives the textbook closed forms, (m + p - 1) C under 1F1B and GPipe (Narayanan et al. 2021,
PipeDream-Flush; Huang et al. 2019) and m C + (p - 1) C / v interleaved (Narayanan et al. SC'21,
section 2.2.2). The search ranks by the closed form generalised to unequal stages,
m max_i C_i + (sum_i C_i - max_i C_i) / v (search/engine.py); the simulation differs from it only
where stages differ, by a few percent (smaller when the bottleneck stage paces the others from
the start, larger under GPipe when the slowest forward and the slowest backward sit on different
stages), and the planner ranks its finalists with the simulation.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from nestplan.cost.schedules.periodic import chunk_times, simulate
from nestplan.cost.schedules.steady import split_makespan_busy
from nestplan.cost.schedules.walk import SplitTimes
from nestplan.strategy.enums import Schedule

Times = Sequence[float] | np.ndarray  # per stage (p,), or per stage and chunk (p, v): cost/schedule.chunk_times


def _per_stage(times: Times) -> list[float]:
    """A stage's time per microbatch, all its chunks together."""
    array = np.asarray(times, float)
    return (array.sum(axis=1) if array.ndim == 2 else array).tolist()


def pipeline_time(
    forward_s: Times,
    backward_s: Times,
    num_microbatches: int,
    schedule: Schedule = Schedule.ONE_F_ONE_B,
    virtual_stages: int = 1,
) -> tuple[float, float, int]:
    """(total seconds, bubble seconds, index of the bottleneck stage). The bubble is the time the
    bottleneck stage (largest F + B, all its chunks together) is idle: total - m * C_max."""
    assert len(forward_s) and len(forward_s) == len(backward_s) and num_microbatches >= 1
    cycles = [f + b for f, b in zip(_per_stage(forward_s), _per_stage(backward_s))]
    slowest = max(range(len(cycles)), key=lambda i: cycles[i])
    total, _ = simulate(forward_s, backward_s, num_microbatches, schedule, virtual_stages)
    bubble = max(0.0, total - num_microbatches * cycles[slowest])
    return num_microbatches * cycles[slowest] + bubble, bubble, slowest


def pipeline_floor(forward_s: Times, backward_s: Times, num_microbatches: int, virtual_stages: int = 1) -> float:
    """A lower bound of ``pipeline_time``'s total under any schedule of these stages.

    Stage s runs its m v forwards and m v backwards one after another (m C_s, C_s its chunks'
    times together, however unequal). Its first operation, every schedule's, is chunk 0's forward
    of microbatch 0, which waits for that forward on the stages before it; its last is chunk 0's
    backward of microbatch m - 1 (interleaved: m a multiple of p, so backward m v - 1 runs chunk
    v - 1 - ((m v - 1) mod p v) div p = 0), which the stages before it still pass back. So the step
    takes at least sum_{u<s} F_u0 + m C_s + sum_{u<s} B_u0 for every s (F_u0, B_u0: chunk 0's
    times; the stage's without interleaving); for equal stages this is the simulation's
    m C + (p - 1) C / v. Shrunk by 1e-9 against rounding (the simulation sums in another order)."""
    fwd, bwd = chunk_times(forward_s, virtual_stages), chunk_times(backward_s, virtual_stages)
    cycles = fwd.sum(axis=1) + bwd.sum(axis=1)
    before = np.concatenate([[0.0], np.cumsum(fwd[:-1, 0] + bwd[:-1, 0])])
    return float((before + num_microbatches * cycles).max()) * (1 - 1e-9)


def split_pipeline_time(
    times: SplitTimes, num_microbatches: int, schedule: Schedule
) -> tuple[float, float, int, float]:
    """``pipeline_time`` for the schedules that split the backward (cost/schedules/walk.py), and the
    busy seconds of the bottleneck stage: the stage that computes longest (the sum of its
    operations' durations, overlapped ones counted once) is the bottleneck, idle the rest; many microbatches
    take cost/schedules/steady.py's closed form."""
    makespan_s, stage_busy = split_makespan_busy(schedule, times, num_microbatches)
    busy = stage_busy.tolist()
    slowest = max(range(len(busy)), key=lambda i: busy[i])
    bubble = max(0.0, makespan_s - busy[slowest])
    return busy[slowest] + bubble, bubble, slowest, busy[slowest]
