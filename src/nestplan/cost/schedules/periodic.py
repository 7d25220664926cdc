"""The fast path of the event simulation for Megatron-LM's schedules (1F1B, GPipe, interleaved):
when every forward and backward of every microbatch runs on every stage. It gives the makespan of
the general walk over the same operations (cost/schedules/walk.py; tests/unit/test_schedule_registry.py).

Each device runs its operations in the order its schedule prescribes (Megatron-LM
schedules.py: GPipe-style all-forward-all-backward; 1F1B, PipeDream-Flush, Narayanan et al.
2021; interleaved 1F1B over v model chunks, Narayanan et al. SC'21 section 2.2.2). An
operation starts when its device is free and its input has arrived:
    forward (s, c, j)  after forward (s - 1, c, j), or (p - 1, c - 1, j) for s = 0;
    backward (s, c, j) after backward (s + 1, c, j), or (0, c + 1, j) for s = p - 1, and after
                       its own forward (earlier on the same device).
A stage's send of its output (forward) or input gradient (backward) is part of the sending
operation's duration (blocking point-to-point, as the evaluator costs it). Each operation takes
its stage's and chunk's time (chunks of one stage may differ: uneven interleaved layouts).

The makespan is the longest path through this dependency graph. Operations are processed in
order of their index in the device's sequence; every dependency points to a lower index or, at
the same index, to a device processed earlier (checked), so one pass over the indices suffices.
In the steady state the sequence of operations is periodic and the finish times of consecutive
periods differ by one constant (a max-plus linear system; Baccelli et al. 1992, ch. 3): once
that is observed, whole periods are skipped by adding the constant, which keeps the evaluator
O(p^2) instead of O(m p) operations. Finish times are kept in a ring of the last few periods,
so memory does not grow with the microbatches either. GPipe, whose forward phase drifts at a
different rate on every stage (no common period), has a closed form instead (its class's ``closed_form``).
``simulate(..., record=True)`` runs every operation (for the timeline plot; at most
``MAX_RECORDED_OPERATIONS``) and gives the same makespan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from nestplan.cost.schedules import family, warmup_forwards
from nestplan.cost.schedules.operations import forward_chunk
from nestplan.errors import ConfigError
from nestplan.strategy.enums import Schedule

FORWARD, BACKWARD = 0, 1
MAX_RECORDED_OPERATIONS = 2**22  # a recorded timeline keeps 6 arrays per operation: ~200 MB at this bound
OPERATIONS_PER_CHUNK_SPLIT = 3  # a split-backward schedule runs F, B and W per microbatch and chunk (at most)


@dataclass(frozen=True)
class Timeline:
    """Every operation of one step's pipeline (arrays of equal length), in seconds from the start."""

    stage: np.ndarray
    kind: np.ndarray  # FORWARD or BACKWARD
    chunk: np.ndarray  # model chunk (virtual stage) on the device
    microbatch: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray

    @property
    def makespan_s(self) -> float:
        return float(self.end_s.max())


@dataclass(frozen=True)
class _Pattern:
    """Per device (rows) and position in its sequence (columns): what runs and what it waits for."""

    kind: np.ndarray
    k: np.ndarray  # index of the operation among the device's forwards (or backwards)
    chunk: np.ndarray
    microbatch: np.ndarray
    dep_stage: np.ndarray  # -1: no dependency on another device
    dep_pos: np.ndarray


def _pattern(w: np.ndarray, p: int, m: int, v: int, cols: np.ndarray) -> _Pattern:
    """Megatron-LM's operation order at positions ``cols``, vectorised: a device with w warm-up
    forwards runs forward k at position k (k < w) or 2k - w, and backward k at 2k + w + 1
    (k < T - w) or T + k, T = m v."""
    total = m * v
    wc = w[:, None]
    i = cols[None, :]
    steady = (i >= wc) & (i < 2 * total - wc)
    kind = np.where(steady & ((i - wc) % 2 == 1) | (i >= 2 * total - wc), BACKWARD, FORWARD)
    fwd = kind == FORWARD
    k = np.where(i < wc, i, np.where(steady, np.where(fwd, wc + (i - wc) // 2, (i - wc - 1) // 2), i - total))
    group = forward_chunk(k, p, v)
    chunk = np.where(fwd, group, v - 1 - group)
    microbatch = (k // (p * v)) * p + k % p
    stage = np.arange(p)[:, None]
    inner = np.where(fwd, stage > 0, stage < p - 1)
    wrap = ~inner & np.where(fwd, chunk > 0, chunk < v - 1)
    dep_stage = np.where(inner, np.where(fwd, stage - 1, stage + 1), np.where(wrap, np.where(fwd, p - 1, 0), -1))
    dep_k = np.where(inner, k, k - p)
    dep_w = w[np.maximum(dep_stage, 0)]
    pos_f = np.where(dep_k < dep_w, dep_k, 2 * dep_k - dep_w)
    pos_b = np.where(dep_k < total - dep_w, 2 * dep_k + dep_w + 1, total + dep_k)
    dep_pos = np.where(dep_stage >= 0, np.where(fwd, pos_f, pos_b), -1)
    ahead = dep_pos == i
    assert np.all(dep_pos <= i) and np.all(~ahead | np.where(fwd, dep_stage < stage, dep_stage > stage))
    return _Pattern(kind, k, chunk, microbatch, dep_stage, dep_pos)


def _steady_window(w: np.ndarray, p: int, m: int, v: int, period: int) -> tuple[int, int, int]:
    """(a, b, lag): every device's pattern at positions [a, b) repeats the one a period earlier,
    and no operation waits for one more than ``lag`` positions before its own.

    Beyond a margin of warm-up and cool-down the pattern repeats by construction: forward k
    waits for k or k - p at a position 2k - w', backward k for k or k - p at 2k + w' + 1, so
    the offsets are constant. Only the head and tail of the sequence are therefore compared."""
    n = 2 * m * v
    margin = 2 * int(w.max()) + 2 * p + 3 * period
    if n <= 2 * margin + 4 * period:
        return n, n, n
    head = _pattern(w, p, m, v, np.arange(0, margin))
    tail = _pattern(w, p, m, v, np.arange(n - margin, n))
    same_head, same_tail = _repeats(head, period), _repeats(tail, period)
    assert same_head[-period:].all() and same_tail[period : 2 * period].all()
    first = int(np.flatnonzero(~same_head)[-1]) + 1 if (~same_head).any() else period
    broken = np.flatnonzero(~same_tail[period:])
    last = n - margin + period + int(broken[0]) if broken.size else n
    lag = max(_max_offset(head, 0), _max_offset(tail, n - margin), 1)
    return first, last, lag


def _repeats(pt: _Pattern, period: int) -> np.ndarray:
    """Per column: does every device repeat the column a period earlier (False for the first period)?"""
    offset = np.arange(pt.kind.shape[1])[None, :] - pt.dep_pos
    keys = (pt.kind, pt.chunk, pt.dep_stage, np.where(pt.dep_stage >= 0, offset, -1))
    same = np.zeros(pt.kind.shape[1], dtype=bool)
    same[period:] = np.logical_and.reduce([np.all(a[:, period:] == a[:, :-period], axis=0) for a in keys])
    return same


def _max_offset(pt: _Pattern, first_col: int) -> int:
    cols = first_col + np.arange(pt.kind.shape[1])[None, :]
    return int(np.where(pt.dep_stage >= 0, cols - pt.dep_pos, 0).max())


def chunk_times(stage_s: Sequence[float] | np.ndarray, virtual_stages: int) -> np.ndarray:
    """(p, v) seconds per microbatch of every stage's every chunk: given per stage (p,), each of its
    v chunks takes 1/v of it; given per chunk (p, v), as is (chunk c of stage s is virtual stage
    c * p + s in model order)."""
    times = np.asarray(stage_s, float)
    if times.ndim == 1:
        return np.repeat(times[:, None] / virtual_stages, virtual_stages, axis=1)
    assert times.ndim == 2 and times.shape[1] == virtual_stages, (times.shape, virtual_stages)
    return times


def simulate(
    forward_s: Sequence[float] | np.ndarray,
    backward_s: Sequence[float] | np.ndarray,
    num_microbatches: int,
    schedule: Schedule = Schedule.ONE_F_ONE_B,
    virtual_stages: int = 1,
    record: bool = False,
) -> tuple[float, Timeline | None]:
    """Makespan of one step's pipeline (and, with ``record``, every operation's start and end).

    ``forward_s`` and ``backward_s`` are per-microbatch times including the sends each operation
    makes, per stage (p,: each of its v chunks takes 1/v) or per stage and chunk (p, v:
    :func:`chunk_times`).
    """
    p, m, v = len(forward_s), num_microbatches, virtual_stages
    assert p == len(backward_s) and m >= 1 and v >= 1
    w = warmup_forwards(schedule, np.arange(p), p, m, v)
    n = 2 * m * v
    fwd_s, bwd_s = chunk_times(forward_s, v), chunk_times(backward_s, v)
    if record:
        return _record(w, p, m, v, fwd_s, bwd_s)
    cls = family(schedule)
    if cls.closed_form is not None:
        return cls.closed_form(fwd_s.sum(axis=1), bwd_s.sum(axis=1), m), None
    period = cls.period(p, v)
    first, last, lag = _steady_window(w, p, m, v, period)
    block = n if first >= n else max(period, 32)
    end = _Ring(p, min(n, lag + period + block + 1))
    i = 0
    while i < n:
        hi = min(n, i + block)
        pt = _pattern(w, p, m, v, np.arange(i, hi))
        _run_block(end, pt, _durations(pt, fwd_s, bwd_s), i)
        i = hi
        if i >= max(first, lag + period) and last - i >= 2 * period:
            skip = _skippable(end, i, lag, period, last)
            if skip:
                shift, steps = skip
                end.put(np.arange(i + steps - lag, i + steps), end.get(np.arange(i - lag, i)) + shift)
                i += steps
    return float(end.column(n - 1).max()), None


def _record(w: np.ndarray, p: int, m: int, v: int, fwd_s: np.ndarray, bwd_s: np.ndarray) -> tuple[float, Timeline]:
    """Every operation of the step, run one by one (for the timeline plot)."""
    n = 2 * m * v
    check_recorded(p, m, v, 2)
    end = _Ring(p, n)
    pt = _pattern(w, p, m, v, np.arange(n))
    dur = _durations(pt, fwd_s, bwd_s)
    _run_block(end, pt, dur, 0)
    start = end.values - dur
    timeline = Timeline(
        np.repeat(np.arange(p), n),
        pt.kind.ravel(),
        pt.chunk.ravel(),
        pt.microbatch.ravel(),
        start.ravel(),
        end.values.ravel(),
    )
    return timeline.makespan_s, timeline


def check_recorded(p: int, m: int, v: int, per_chunk: int) -> None:
    """Refuse a timeline of more than MAX_RECORDED_OPERATIONS operations (p stages x m microbatches x v chunks
    x ``per_chunk`` operations each) before it is recorded."""
    n = per_chunk * m * v
    if p * n > MAX_RECORDED_OPERATIONS:
        raise ConfigError(
            f"the pipeline timeline has {p * n:,} operations ({p} stages x {n:,}); at most "
            f"{MAX_RECORDED_OPERATIONS:,} are recorded for a plot: plot a step with fewer microbatches",
            field="num_microbatches",
            value=m,
            limit=MAX_RECORDED_OPERATIONS // (per_chunk * p * v),
        )


def _durations(pt: _Pattern, fwd_s: np.ndarray, bwd_s: np.ndarray) -> np.ndarray:
    """Seconds of every operation of ``pt``: its stage's forward or backward time of its chunk."""
    rows = np.arange(fwd_s.shape[0])[:, None]
    return np.where(pt.kind == FORWARD, fwd_s[rows, pt.chunk], bwd_s[rows, pt.chunk])


class _Ring:
    """Finish times per device of the last ``width`` positions (position i lives in column i mod width)."""

    def __init__(self, p: int, width: int) -> None:
        self.values = np.zeros((p, width))
        self.width = width

    def column(self, i: int) -> np.ndarray:
        return self.values[:, i % self.width]

    def get(self, cols: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        if rows is None:
            return self.values[:, cols % self.width]
        return self.values[rows, cols % self.width]

    def put(self, cols: np.ndarray, values: np.ndarray) -> None:
        self.values[:, cols % self.width] = values


def _run_block(end: _Ring, pt: _Pattern, dur: np.ndarray, first: int) -> None:
    """Finish times of the positions first, first + 1, ...: a position whose operations all wait
    for earlier positions is one vectorised step; one with a dependency inside the position
    (warm-up and cool-down chains) is run device by device."""
    cols = first + np.arange(pt.kind.shape[1])
    chained = ((pt.dep_pos == cols[None, :]) & (pt.dep_stage >= 0)).any(axis=0)
    has_dep = pt.dep_stage >= 0
    dep_stage, dep_pos = np.maximum(pt.dep_stage, 0), np.maximum(pt.dep_pos, 0)
    p = end.values.shape[0]
    for c in range(len(cols)):
        i = first + c
        if chained[c]:
            _run_position(
                end,
                i,
                pt.kind[:, c].tolist(),
                pt.dep_stage[:, c].tolist(),
                pt.dep_pos[:, c].tolist(),
                dur[:, c].tolist(),
            )
            continue
        ready = end.column(i - 1) if i else np.zeros(p)
        waits = np.where(has_dep[:, c], end.get(dep_pos[:, c], dep_stage[:, c]), 0.0)
        end.values[:, i % end.width] = np.maximum(ready, waits) + dur[:, c]


def _run_position(end: _Ring, i: int, kinds: list, deps: list, dpos: list, durs: list) -> None:
    """Finish times of every device's operation at position i: forwards in increasing stage, then
    backwards in decreasing stage, so that a dependency at the same position is computed first
    (checked in _pattern)."""
    p, width, values = len(kinds), end.width, end.values
    order = [s for s in range(p) if kinds[s] == FORWARD] + [s for s in range(p - 1, -1, -1) if kinds[s] != FORWARD]
    for s in order:
        ready = values[s, (i - 1) % width] if i else 0.0
        d = deps[s]
        if d >= 0:
            ready = max(ready, values[d, dpos[s] % width])
        values[s, i % width] = ready + durs[s]


def _skippable(end: _Ring, i: int, lag: int, period: int, until: int) -> tuple[float, int] | None:
    """(time shift, positions) to jump when the last `lag` finish times of every device repeat the
    ones a period earlier shifted by one constant (then every later period does, up to `until`)."""
    diff = end.get(np.arange(i - lag, i)) - end.get(np.arange(i - lag - period, i - period))
    shift = float(diff[0, -1])
    if np.ptp(diff) > 1e-12 * max(float(end.column(i - 1).max()), 1e-300):
        return None
    periods = (until - i) // period - 1
    return (periods * shift, periods * period) if periods >= 1 else None
