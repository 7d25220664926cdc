"""The one event simulation and the one memory walk over any schedule's operation lists.

Every stage runs its operations (cost/schedules ``stage_operations``: its class's order) in order;
an operation starts when its stage is free and its inputs have arrived:
    F (i, j)   after F (i - 1, j)              (i: virtual stage in model order, j: microbatch)
    B (i, j)   after B (i + 1, j), or after F (i, j) for the last virtual stage
    W (i, j)   after B (i, j)                   (same stage, earlier in its order)
A full backward (BW) is B and W back to back; an overlapped operation (DualPipeV's F&BW) is the
forward of one chunk and the full backward of the other at once and waits for both inputs.

Durations per stage and chunk (``SplitTimes``), each including the sends the operation makes, as
the evaluator costs them:
    F = forward compute + its communication + the send of its output
    B = backward compute - W + its communication + the send of the input gradient
    W = the weight-gradient GEMMs (cost/compute.py ``weight_gradient_time``)
    F&BW = max(the rest of both, the overlappable communication of both): DeepSeek-V3's overlap
           (arXiv 2412.19437, section 3.2.1, Figure 4) runs one microbatch's expert all-to-alls and
           pipeline transfers under the other's compute, on separate SMs; what cannot hide is the
           longer of the two streams. ``forward_comm`` and ``backward_comm`` hold that overlappable
           part only (cost/evaluator.py OVERLAPPED_TERMS); tensor- and context-parallel collectives
           stay in the compute stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np
from numpy.typing import ArrayLike

from nestplan.cost.schedules import family, operation_arrays, stage_operations
from nestplan.cost.schedules.operations import (
    FORWARD,
    FULL_BACKWARD,
    INPUT_GRAD,
    OVERLAPPED,
    WEIGHT_GRAD,
    Op,
    representative_microbatches,
)
from nestplan.cost.schedules.periodic import Timeline
from nestplan.strategy.dims import virtual_stage_index
from nestplan.strategy.enums import Schedule


@dataclass(frozen=True)
class SplitTimes:
    """Seconds per microbatch of every stage's every chunk, (p, v) arrays: the forward and the
    input-gradient backward (sends included), the weight gradient, and the part of the forward's and
    of the backward's communication an overlapped operation can hide."""

    forward: np.ndarray
    input_grad: np.ndarray
    weight_grad: np.ndarray
    forward_comm: np.ndarray
    backward_comm: np.ndarray

    @classmethod
    def of_backward(
        cls,
        forward: ArrayLike,
        backward: ArrayLike,
        weight_grad: ArrayLike,
        forward_comm: ArrayLike,
        backward_comm: ArrayLike,
    ) -> SplitTimes:
        """From the whole backward per chunk (B + W, as the evaluator and StageCost hold it)."""
        arrays = [np.asarray(x, float) for x in (forward, backward, weight_grad, forward_comm, backward_comm)]
        f, whole, w, fc, bc = arrays
        return cls(f, whole - w, w, fc, bc)


@dataclass(frozen=True)
class SplitRun:
    """Every operation of one step, per stage in its order, with its start and end (seconds)."""

    ops: tuple[tuple[Op, ...], ...]
    start_s: tuple[np.ndarray, ...]
    end_s: tuple[np.ndarray, ...]

    @property
    def makespan_s(self) -> float:
        return max(float(e[-1]) for e in self.end_s if len(e))

    def timeline(self) -> Timeline:
        """Every operation as the timeline plot draws it; ``kind`` is cost/schedules/operations.py's
        (F, B, W, BW or F&BW; an F&BW under its forward's chunk and microbatch)."""
        ops = [op for order in self.ops for op in order]
        return Timeline(
            np.concatenate([np.full(len(o), s) for s, o in enumerate(self.ops)]),
            np.array([op.kind for op in ops]),
            np.array([op.chunk for op in ops]),
            np.array([op.microbatch for op in ops]),
            np.concatenate(self.start_s),
            np.concatenate(self.end_s),
        )


@dataclass(frozen=True)
class _Program:
    """A schedule's operations for (pp, m, v) in one order that respects every dependency (found once,
    whatever the durations): per operation its stage, the one or two operations of other stages it
    waits for (-1: none), and what its duration is made of."""

    orders: tuple[tuple[Op, ...], ...]
    offsets: np.ndarray  # (p + 1,): where each stage's operations start among all
    order: np.ndarray  # global operation ids, dependencies first; id = offsets[stage] + position
    stage: np.ndarray
    deps: np.ndarray  # (n, 2)
    kind: np.ndarray
    chunk: np.ndarray
    chunk2: np.ndarray


@lru_cache(maxsize=256)
def _program(schedule: Schedule, p: int, m: int, v: int) -> _Program:
    orders = tuple(stage_operations(schedule, s, p, m, v) for s in range(p))
    offsets = np.concatenate([[0], np.cumsum([len(o) for o in orders])]).astype(int).tolist()
    chunks = p * v
    where = [[virtual_stage_index(schedule, s, c, p) for c in range(v)] for s in range(p)]
    placed: dict[tuple[str, int, int], int] = {}  # ("F" or "B", virtual stage, microbatch) -> operation id
    n = offsets[-1]
    deps = np.full((n, 2), -1)
    order, position = [], [0] * p
    while len(order) < n:
        before = len(order)
        for s in range(p):
            k, ops = position[s], orders[s]
            while k < len(ops):
                op = ops[k]
                wanted = _inputs(op, where[s], chunks, placed)
                if wanted is None:
                    break
                i = offsets[s] + k
                deps[i, : len(wanted)] = wanted
                _mark(op, where[s], i, placed)
                order.append(i)
                k += 1
            position[s] = k
        assert len(order) > before, "a schedule's order waits for itself (cost/schedules/operations.py)"
    arrays = (operation_arrays(schedule, s, p, m, v) for s in range(p))
    kind, chunk, chunk2 = (np.concatenate(a) for a in zip(*arrays))
    return _Program(
        orders, np.array(offsets), np.array(order), np.repeat(np.arange(p), np.diff(offsets)), deps, kind, chunk, chunk2
    )


def _inputs(op: Op, where: list[int], chunks: int, placed: dict) -> list[int] | None:
    """The operations (of any stage) whose end ``op`` waits for (``where[c]``: the virtual stage of
    the stage's chunk c), or None while one is not placed yet."""
    wanted = []
    if op.kind == FORWARD or op.kind == OVERLAPPED:
        i = where[op.chunk]
        if i > 0:
            wanted.append(placed.get(("F", i - 1, op.microbatch)))
    if op.kind == INPUT_GRAD or op.kind == FULL_BACKWARD or op.kind == OVERLAPPED:
        chunk, j = (op.chunk2, op.microbatch2) if op.kind == OVERLAPPED else (op.chunk, op.microbatch)
        i = where[chunk]
        wanted.append(placed.get(("B", i + 1, j)) if i < chunks - 1 else placed.get(("F", i, j)))
    if op.kind == WEIGHT_GRAD:
        wanted.append(placed.get(("B", where[op.chunk], op.microbatch)))
    return None if None in wanted else wanted


def _mark(op: Op, where: list[int], i: int, placed: dict) -> None:
    if op.kind == FORWARD or op.kind == OVERLAPPED:
        placed[("F", where[op.chunk], op.microbatch)] = i
    if op.kind == INPUT_GRAD or op.kind == FULL_BACKWARD:
        placed[("B", where[op.chunk], op.microbatch)] = i
    if op.kind == OVERLAPPED:
        placed[("B", where[op.chunk2], op.microbatch2)] = i


def _durations(prog: _Program, t: SplitTimes) -> np.ndarray:
    """Seconds of every operation, all at once: F, B, W, B + W, or an F&BW's longer stream (module docstring)."""
    s, c, c2 = prog.stage, prog.chunk, np.maximum(prog.chunk2, 0)
    f, b, w = t.forward[s, c], t.input_grad[s, c], t.weight_grad[s, c]
    fc, bc = t.forward_comm[s, c], t.backward_comm[s, c2]
    b2, w2 = t.input_grad[s, c2], t.weight_grad[s, c2]
    overlapped = np.maximum((f - fc) + (b2 - bc + w2), fc + bc)
    return np.select(
        [prog.kind == FORWARD, prog.kind == INPUT_GRAD, prog.kind == WEIGHT_GRAD, prog.kind == FULL_BACKWARD],
        [f, b, w, b + w],
        overlapped,
    )


def simulate_operations(schedule: Schedule, times: SplitTimes, num_microbatches: int) -> SplitRun:
    """Run ``schedule`` for ``num_microbatches`` over the stages and chunks of ``times`` (a schedule
    that does not split the backward runs B + W as one full backward)."""
    p, v = times.forward.shape
    assert family(schedule).chunks in (None, v), (schedule, v)
    prog = _program(schedule, p, num_microbatches, v)
    duration = _durations(prog, times).tolist()
    stage, deps = prog.stage.tolist(), prog.deps.tolist()
    start, end = [0.0] * len(duration), [0.0] * len(duration)
    free = [0.0] * p
    for i in prog.order.tolist():
        a, b = deps[i]
        start[i] = max(free[stage[i]], end[a] if a >= 0 else 0.0, end[b] if b >= 0 else 0.0)
        end[i] = free[stage[i]] = start[i] + duration[i]
    cut = prog.offsets[1:-1]
    return SplitRun(prog.orders, tuple(np.split(np.array(start), cut)), tuple(np.split(np.array(end), cut)))


def activation_peak(
    schedule: Schedule, stage: int, pp: int, m: int, chunk_bytes: Sequence[float], kept_bytes: Sequence[float]
) -> float:
    """The most activation bytes a stage holds at once, walking its operations in the order the
    simulation runs them: a forward of chunk c stores ``chunk_bytes[c]``; its B frees all but
    ``kept_bytes[c]`` (the GEMM inputs W reads, cost/memory.py ``weight_gradient_input_bytes``), its
    W the rest, a full backward all of it. An overlapped F&BW holds the forward's bytes before the
    backward frees its own. Only forwards add, so the peak follows one. Walked over the order of
    :func:`representative_microbatches`, whose peak is m's (its steady part only repeats)."""
    m = representative_microbatches(pp, m)
    kind, chunk, chunk2 = operation_arrays(schedule, stage, pp, m, len(chunk_bytes))
    a, kept = np.asarray(chunk_bytes, float), np.asarray(kept_bytes, float)
    stores = np.isin(kind, (FORWARD, OVERLAPPED))
    added = np.where(stores, a[chunk], 0.0)
    freed = np.select(
        [kind == INPUT_GRAD, kind == WEIGHT_GRAD, kind == FULL_BACKWARD, kind == OVERLAPPED],
        [a[chunk] - kept[chunk], kept[chunk], a[chunk], a[np.maximum(chunk2, 0)]],
        0.0,
    )
    live_after = np.cumsum(added - freed)
    return float((live_after + freed)[stores].max())
