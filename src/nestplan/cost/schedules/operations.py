"""The operation order of every pipeline schedule, per pipeline stage: what the stage runs, one
operation after another (F: forward, B: input gradients, W: weight gradients, BW: both at once).

Each order is stated from its published algorithm; the general simulation (cost/schedules/walk.py)
runs it and the memory walk (``activation_peak``, same module) walks the same list, so both see
one order. Megatron-LM's own schedules (1F1B, GPipe, interleaved 1F1B) follow one rule,
:func:`megatron_order`; the schedules that split the backward have one order each:

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
from typing import NamedTuple

import numpy as np

FORWARD, INPUT_GRAD, WEIGHT_GRAD, FULL_BACKWARD, OVERLAPPED = range(5)
KIND_NAMES = ("F", "B", "W", "BW", "F&BW")
# The split-backward orders below are a warm-up and a cool-down of at most 2 pp microbatches each around a
# steady part that repeats once per microbatch; a probe of this many microbatches per stage (at least
# PROBE_MIN_MICROBATCHES) holds both ends and a steady window of 8 pp between them (cost/schedules/steady.py).
PROBE_MICROBATCHES_PER_STAGE = 16
PROBE_MIN_MICROBATCHES = 64


def probe_microbatches(pp: int) -> int:
    """The microbatches of the probe run that stands for any larger m (cost/schedules/steady.py)."""
    return max(PROBE_MIN_MICROBATCHES, PROBE_MICROBATCHES_PER_STAGE * pp)


def representative_microbatches(pp: int, m: int) -> int:
    """The m whose split-backward order has every per-stage count of m's that does not grow with m (the
    warm-up forwards, the most activations held at once): m itself up to the probe, the probe beyond it,
    where the steady part only repeats (checked against m's own order in tests/unit/test_schedule_steady.py)."""
    return min(m, probe_microbatches(pp))


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


def forward_chunk(k: int | np.ndarray, pp: int, virtual: int) -> int | np.ndarray:
    """The model chunk a stage's k-th forward runs in Megatron-LM's interleaved order
    (schedules.py, get_model_chunk_id: microbatches in groups of pp per chunk): (k mod pp v) div pp;
    its k-th backward runs chunk v - 1 minus that. Without interleaving, chunk 0."""
    return (k % (pp * virtual)) // pp


def megatron_order(warmup: int, pp: int, m: int, virtual: int) -> list[Op]:
    """Megatron-LM's order (schedules.py: GPipe-style all-forward-all-backward, 1F1B, interleaved
    1F1B) for a stage with ``warmup`` warm-up forwards: forwards 0 .. w - 1, then forward w + j and
    full backward j for j = 0, 1, ..., then the remaining backwards; forward k runs chunk
    :func:`forward_chunk` (k), backward k chunk v - 1 minus that, both on microbatch
    (k div p v) p + k mod p."""
    total = m * virtual

    def op(kind: int, k: int) -> Op:
        chunk = forward_chunk(k, pp, virtual)
        return Op(kind, chunk if kind == FORWARD else virtual - 1 - chunk, (k // (pp * virtual)) * pp + k % pp)

    ops = [op(FORWARD, k) for k in range(warmup)]
    for j in range(total - warmup):
        ops += [op(FORWARD, warmup + j), op(FULL_BACKWARD, j)]
    return ops + [op(FULL_BACKWARD, j) for j in range(total - warmup, total)]


def zb_h1_order(s: int, p: int, m: int) -> list[Op]:
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


def zbv_order(s: int, p: int, m: int) -> list[Op]:
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


def dualpipev_order(s: int, p: int, m: int) -> list[Op]:
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
