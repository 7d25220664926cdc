"""Step time of a pipeline schedule over heterogeneous stages.

Each stage i has a per-microbatch cycle C_i (forward + backward + its boundary
transfers). With m microbatches and v virtual stages per device,
    T_pipe = m * max_i C_i + (sum_i C_i - max_i C_i) / v,
which is (m + p - 1) C for p equal stages under 1F1B and GPipe (Narayanan et al. 2021,
PipeDream-Flush; Huang et al. 2019) and m C + (p - 1) C / v interleaved
(Narayanan et al. SC'21, section 2.2.2): the first microbatch traverses every stage
once (the bubble), then the slowest stage paces the rest.
"""

from __future__ import annotations

from typing import Sequence


def pipeline_time(cycles: Sequence[float], num_microbatches: int, virtual_stages: int = 1) -> tuple[float, float, int]:
    """(total seconds, bubble seconds, index of the bottleneck stage)."""
    assert cycles and num_microbatches >= 1 and virtual_stages >= 1
    slowest = max(range(len(cycles)), key=lambda i: cycles[i])
    bubble = (sum(cycles) - cycles[slowest]) / virtual_stages
    return num_microbatches * cycles[slowest] + bubble, bubble, slowest
