"""The operation order of the schedules that split the backward (B: input gradients, W: weight
gradients), per pipeline stage: what the stage runs, one operation after another.

Each order is stated from its published algorithm; the simulation (cost/split_schedule.py) runs
it and the memory model (cost/memory.py ``split_schedule_peak``) walks the same list, so both see
one order.

- ``zb-h1`` (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 2.1, ZB-H1; torch
  ``ScheduleInterleavedZeroBubble`` with one chunk): 1F1B's warm-up of p - s - 1 forwards and its
  F, B alternation, with stage s deferring its first s W passes: after its k-th B it runs the
  oldest pending W once k >= s, the rest at the end. Stage s then holds p - s microbatches'
  activations and at most s W inputs, never more than 1F1B's stage 0.
- ``zbv`` (Qi et al., "Pipeline Parallelism with Controllable Memory", arXiv 2405.15362, the V
  schedule; torch ``ScheduleZBVZeroBubble``): chunk 0 is virtual stage s, chunk 1 virtual stage
  2p - 1 - s; 2(p - s) - 1 forwards of chunk 0, s pairs (F1, F0), p - s triples (F1, B1, W1),
  then (F0, B0, W0, F1, B1, W1) until every forward ran, then s pairs (B0, B1), p - s pairs
  (B0, W0) and the pending W passes.
- ``dualpipev`` (DeepSeek-AI, DeepSeek-V3 technical report, arXiv 2412.19437, section 3.2.1, DualPipe
  "cut in half"; torchtitan/torch ``ScheduleDualPipeV``): the same V, eight phases; in the steady
  phase each operation runs the forward of one chunk and the full backward (B and W) of the other
  overlapped (``OVERLAPPED``), so that one microbatch's communication hides under the other's
  compute; the cool-down switches to B-only passes half-way and fills the end with W passes.
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from nestplan.strategy.enums import Schedule

FORWARD, INPUT_GRAD, WEIGHT_GRAD, FULL_BACKWARD, OVERLAPPED = range(5)
KIND_NAMES = ("F", "B", "W", "BW", "F&BW")


class Op(NamedTuple):
    """One operation of a stage: ``kind`` on chunk ``chunk`` for ``microbatch``; an OVERLAPPED
    operation also runs the full backward of ``chunk2`` for ``microbatch2``."""

    kind: int
    chunk: int
    microbatch: int
    chunk2: int = -1
    microbatch2: int = -1


class _Counter:
    """Next microbatch per (chunk, pass) and the W passes waiting for their turn (oldest first)."""

    def __init__(self) -> None:
        self.next: dict[tuple[int, str], int] = {}
        self.pending: deque[tuple[int, int]] = deque()
        self.waiting = (deque(), deque())  # the same W passes by chunk
        self.ops: list[Op] = []

    def take(self, chunk: int, what: str) -> int:
        j = self.next.get((chunk, what), 0)
        self.next[(chunk, what)] = j + 1
        return j

    def forward(self, chunk: int) -> None:
        self.ops.append(Op(FORWARD, chunk, self.take(chunk, "F")))

    def input_grad(self, chunk: int) -> None:
        j = self.take(chunk, "B")
        self.pending.append((chunk, j))
        self.waiting[chunk].append(j)
        self.ops.append(Op(INPUT_GRAD, chunk, j))

    def full_backward(self, chunk: int) -> None:
        self.ops.append(Op(FULL_BACKWARD, chunk, self.take(chunk, "B")))

    def weight_grad(self, chunk: int | None = None) -> None:
        """The oldest pending W pass (of ``chunk``, where given), if any."""
        if chunk is None:
            if not self.pending:
                return
            chunk, j = self.pending.popleft()
            self.waiting[chunk].popleft()
        else:
            if not self.waiting[chunk]:
                return
            j = self.waiting[chunk].popleft()
            self.pending.remove((chunk, j))
        self.ops.append(Op(WEIGHT_GRAD, chunk, j))

    def backward_now(self, chunk: int) -> None:
        """B then, at once, the oldest pending W (its own, where none was deferred)."""
        self.input_grad(chunk)
        self.weight_grad()

    def any_waiting(self, chunk: int) -> bool:
        return bool(self.waiting[chunk])

    def overlapped(self, forward_chunk: int, backward_chunk: int) -> None:
        f = self.take(forward_chunk, "F")
        self.ops.append(Op(OVERLAPPED, forward_chunk, f, backward_chunk, self.take(backward_chunk, "B")))

    def count(self, chunk: int, what: str) -> int:
        return self.next.get((chunk, what), 0)


@lru_cache(maxsize=4096)
def stage_operations(schedule: Schedule, stage: int, pp: int, m: int) -> tuple[Op, ...]:
    """Stage ``stage``'s operations, in order, for ``m`` microbatches over ``pp`` stages."""
    return tuple(_operations(schedule, stage, pp, m))


@lru_cache(maxsize=4096)
def operation_arrays(schedule: Schedule, stage: int, pp: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`stage_operations` as arrays (kind, chunk, chunk2), for the vectorised memory walk and
    the simulation's program."""
    ops = stage_operations(schedule, stage, pp, m)
    return tuple(np.array([getattr(op, f) for op in ops], dtype=np.int64) for f in ("kind", "chunk", "chunk2"))


def _operations(schedule: Schedule, stage: int, pp: int, m: int) -> list[Op]:
    assert schedule.splits_backward and 0 <= stage < pp and m >= 1, (schedule, stage, pp, m)
    if schedule is Schedule.ZB_H1:
        return _zb_h1(stage, pp, m)
    assert m >= 2 * pp, "V schedules need 2 pp microbatches (ParallelDims.batch_conflict)"
    return _zbv(stage, pp, m) if schedule is Schedule.ZBV else _dualpipev(stage, pp, m)


def _zb_h1(s: int, p: int, m: int) -> list[Op]:
    c = _Counter()
    warmup = min(p - s - 1, m)
    for _ in range(warmup):
        c.forward(0)
    for k in range(m):
        if warmup + k < m:
            c.forward(0)
        c.input_grad(0)
        if k >= s:
            c.weight_grad()
    while c.pending:
        c.weight_grad()
    return c.ops


def _zbv(s: int, p: int, m: int) -> list[Op]:
    c = _Counter()
    for _ in range(2 * (p - s) - 1):
        c.forward(0)
    for _ in range(s):
        c.forward(1)
        c.forward(0)
    for _ in range(p - s):
        c.forward(1)
        c.backward_now(1)
    while c.count(1, "F") < c.count(0, "F") or c.count(0, "F") < m:
        if c.count(0, "F") < m:
            c.forward(0)
        c.backward_now(0)
        c.forward(1)
        c.backward_now(1)
    for _ in range(s):
        c.input_grad(0)
        c.input_grad(1)
    for _ in range(p - s):
        c.input_grad(0)
        c.weight_grad(0)
    for chunk in (1, 0):
        while c.any_waiting(chunk):
            c.weight_grad(chunk)
    return c.ops


def _dualpipev(s: int, p: int, m: int) -> list[Op]:
    c = _Counter()
    for _ in range(2 * (p - s - 1)):
        c.forward(0)
    for _ in range(s + 1):
        c.forward(0)
        c.forward(1)
    for _ in range(p - s - 1):
        c.input_grad(1)
        c.weight_grad()
        c.forward(1)
    for i in range(m - 2 * p + s + 1):
        if i == 0 and s == p - 1:  # the last stage's first turn: its chunk 1 backward needs this forward's loss
            c.forward(0)
            c.full_backward(1)
        else:
            c.overlapped(0, 1)
        c.overlapped(1, 0)
    for _ in range(p - s - 1):
        c.full_backward(1)
        c.overlapped(1, 0)
    split = False
    for i in range(s + 1):
        split = split or (i == (s + 1) // 2 and s % 2 == 1)
        (c.input_grad if split else c.full_backward)(1)
        split = split or (i == (s + 1) // 2 and s % 2 == 0)
        (c.input_grad if split else c.full_backward)(0)
    for _ in range(p - s - 1):
        c.weight_grad()
        (c.input_grad if split else c.full_backward)(0)
    for _ in range(s + 1):
        c.weight_grad()
    return c.ops
