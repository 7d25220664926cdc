"""The fast path of the schedules that split the backward (zb-h1, zbv, dualpipev) over many microbatches:
their step in closed form from two short runs of the one simulation (cost/schedules/walk.py).

Each stage's order (cost/schedules/operations.py) is a warm-up, a steady part that runs the same
operations once per microbatch, and a cool-down, the two ends of a length that does not depend on m.
The finish times are a max-plus linear system (Baccelli et al. 1992, ch. 3): once every operation
of the steady part finishes one constant ``delta`` after the same operation of the microbatch
before, over a window longer than any dependency reaches back, one more microbatch in the steady
part delays everything after it by ``delta``. So with a probe of m0 microbatches that shows such a
window, makespan(m) = makespan(m0) + (m - m0) delta, and each stage's busy seconds grow by their
increment from m0 to m0 + 1 per microbatch (one more steady turn: one microbatch's operations).
The probe is checked twice: its window, and makespan(m0 + 1) - makespan(m0) = delta; the result is
the simulation's, to rounding, wherever both run (tests/unit/test_schedule_steady.py).

Bounds: up to DIRECT_STAGE_MICROBATCHES stage x microbatch pairs the simulation runs every operation
(about 0.1 s); beyond, probes of probe_microbatches(pp), doubling while no steady window shows, up to
MAX_PROBE_STAGE_MICROBATCHES pairs; a pipeline still not steady there is refused in one line.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from nestplan.cost.schedules.operations import OVERLAPPED, probe_microbatches
from nestplan.cost.schedules.walk import SplitRun, SplitTimes, simulate_operations
from nestplan.errors import ConfigError
from nestplan.strategy.enums import Schedule

DIRECT_STAGE_MICROBATCHES = 2**14  # ~3 x 16k operations run one by one: about 0.1 s, as a plan's search has them
MAX_PROBE_STAGE_MICROBATCHES = 2**17  # the longest probe: ~400k operations, a few seconds at most
STEADY_RELATIVE_TOLERANCE = 1e-9  # equal increments, to the rounding of sums over a whole step


def split_makespan_busy(schedule: Schedule, times: SplitTimes, m: int) -> tuple[float, np.ndarray]:
    """(makespan, busy seconds per stage) of ``schedule`` over ``times`` for ``m`` microbatches."""
    p = times.forward.shape[0]
    probe = probe_microbatches(p)
    while p * m > DIRECT_STAGE_MICROBATCHES and probe < m:
        if p * probe > MAX_PROBE_STAGE_MICROBATCHES:
            raise ConfigError(
                f"the {schedule} pipeline of {p} stages shows no steady state within {probe // 2:,} microbatches, "
                f"and {m:,} are too many to simulate one by one: use fewer microbatches (a larger --micro-batch-size)",
                field="num_microbatches",
                value=m,
                limit=DIRECT_STAGE_MICROBATCHES // p,
            )
        first, second = simulate_operations(schedule, times, probe), simulate_operations(schedule, times, probe + 1)
        delta = _steady_increment(first, probe, p)
        span = first.makespan_s
        if delta is not None and abs(second.makespan_s - span - delta) <= STEADY_RELATIVE_TOLERANCE * span:
            busy, more = _busy(first), _busy(second)
            return span + (m - probe) * delta, busy + (m - probe) * (more - busy)
        probe *= 2
    run = simulate_operations(schedule, times, m)
    return run.makespan_s, _busy(run)


def _busy(run: SplitRun) -> np.ndarray:
    """Seconds each stage computes (its operations' durations; an overlapped one counted once)."""
    return np.array([float((end - start).sum()) for start, end in zip(run.start_s, run.end_s)])


def _steady_increment(run: SplitRun, m: int, p: int) -> float | None:
    """The constant by which every operation of the microbatches in the probe's middle window finishes
    after the same operation of the microbatch before, or None where they do not all agree. The window
    spans 2 (2 pp + 2) microbatches: more than any operation waits back (a V stage's overlapped F&BW
    pairs microbatches up to 2 pp apart; ZB-H1 defers a W by at most pp - 1)."""
    reach = 2 * p + 2
    lo, hi = m // 2 - reach, m // 2 + reach
    finishes: dict[tuple, dict[int, float]] = defaultdict(dict)
    for stage, (ops, ends) in enumerate(zip(run.ops, run.end_s)):
        for op, end in zip(ops, ends.tolist()):
            if lo <= op.microbatch <= hi:
                partner = op.microbatch2 - op.microbatch if op.kind == OVERLAPPED else 0
                finishes[(stage, op.kind, op.chunk, op.chunk2, partner)][op.microbatch] = end
    window = range(lo, hi + 1)
    if any(len(by_microbatch) != len(window) for by_microbatch in finishes.values()):
        return None
    steps = np.diff(np.array([[by[j] for j in window] for by in finishes.values()]), axis=1)
    delta = float(steps[0, 0])
    if np.abs(steps - delta).max() > STEADY_RELATIVE_TOLERANCE * run.makespan_s:
        return None
    return delta
