"""Step time of a pipeline schedule over heterogeneous stages.

Stage i takes F_i forward and B_i backward per microbatch (its sends included), C_i = F_i + B_i.
The evaluator simulates the schedule (cost/schedule.py). For p equal stages the simulation
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

from nestplan.cost.schedule import simulate
from nestplan.strategy.enums import Schedule


def pipeline_time(forward_s: Sequence[float], backward_s: Sequence[float], num_microbatches: int,
                  schedule: Schedule = Schedule.ONE_F_ONE_B, virtual_stages: int = 1) -> tuple[float, float, int]:
    """(total seconds, bubble seconds, index of the bottleneck stage). The bubble is the time the
    bottleneck stage (largest F + B) is idle: total - m * C_max."""
    assert forward_s and len(forward_s) == len(backward_s) and num_microbatches >= 1
    cycles = [f + b for f, b in zip(forward_s, backward_s)]
    slowest = max(range(len(cycles)), key=lambda i: cycles[i])
    total, _ = simulate(forward_s, backward_s, num_microbatches, schedule, virtual_stages)
    bubble = max(0.0, total - num_microbatches * cycles[slowest])
    return num_microbatches * cycles[slowest] + bubble, bubble, slowest


def pipeline_floor(forward_s: Sequence[float], backward_s: Sequence[float], num_microbatches: int,
                   virtual_stages: int = 1) -> float:
    """A lower bound of ``pipeline_time``'s total under any schedule of these stages.

    Stage s runs its m forwards and m backwards one after another (m C_s). Without interleaving,
    its first forward waits for microbatch 0's forwards on the stages before it, and its last
    backward is followed by that microbatch's backwards on them, so the step takes at least
    sum_{u<s} F_u + m C_s + sum_{u<s} B_u for every s; with interleaving, at least m C_s. Shrunk
    by 1e-9 against rounding (the simulation sums in another order)."""
    cycles = [f + b for f, b in zip(forward_s, backward_s)]
    m = num_microbatches
    if virtual_stages > 1:
        return m * max(cycles) * (1 - 1e-9)
    before = [sum(forward_s[:s]) + sum(backward_s[:s]) for s in range(len(cycles))]
    return max(b + m * c for b, c in zip(before, cycles)) * (1 - 1e-9)
