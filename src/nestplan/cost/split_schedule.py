"""Event simulation of the schedules that split the backward into B and W (zb-h1, zbv, dualpipev).

Every stage runs its operations (cost/operations.py ``stage_operations``) in order; an operation
starts when its stage is free and its inputs have arrived:
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

import numpy as np

from nestplan.cost.schedule import Timeline
from nestplan.cost.operations import FORWARD, FULL_BACKWARD, INPUT_GRAD, OVERLAPPED, WEIGHT_GRAD, Op, stage_operations
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

    def duration(self, stage: int, op: Op) -> float:
        f, b, w = self.forward[stage], self.input_grad[stage], self.weight_grad[stage]
        if op.kind == FORWARD:
            return float(f[op.chunk])
        if op.kind == INPUT_GRAD:
            return float(b[op.chunk])
        if op.kind == WEIGHT_GRAD:
            return float(w[op.chunk])
        if op.kind == FULL_BACKWARD:
            return float(b[op.chunk] + w[op.chunk])
        fc, bc = self.forward_comm[stage, op.chunk], self.backward_comm[stage, op.chunk2]
        compute = (f[op.chunk] - fc) + (b[op.chunk2] - bc + w[op.chunk2])
        return float(max(compute, fc + bc))


def virtual_stage(schedule: Schedule, stage: int, chunk: int, pp: int) -> int:
    """The model-order virtual stage of ``chunk`` of ``stage`` (strategy/dims.py
    ``ParallelDims.virtual_stage_position``, inverted): V-shaped, chunk 1 of stage s is 2 pp - 1 - s."""
    return 2 * pp - 1 - stage if schedule.v_shaped and chunk == 1 else chunk * pp + stage


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
        """Every operation as the timeline plot draws it; ``kind`` is cost/operations.py's
        (F, B, W, BW or F&BW; an F&BW under its forward's chunk and microbatch)."""
        ops = [op for order in self.ops for op in order]
        return Timeline(np.concatenate([np.full(len(o), s) for s, o in enumerate(self.ops)]),
                        np.array([op.kind for op in ops]), np.array([op.chunk for op in ops]),
                        np.array([op.microbatch for op in ops]), np.concatenate(self.start_s),
                        np.concatenate(self.end_s))


def simulate_split(schedule: Schedule, times: SplitTimes, num_microbatches: int) -> SplitRun:
    """Run ``schedule`` for ``num_microbatches`` over the stages of ``times``."""
    p, v = times.forward.shape
    m = num_microbatches
    chunks = 2 * p if schedule.v_shaped else p
    assert v == (2 if schedule.v_shaped else 1), (schedule, v)
    orders = [tuple(stage_operations(schedule, s, p, m)) for s in range(p)]
    done_f = np.full((chunks, m), np.nan)
    done_b = np.full((chunks, m), np.nan)
    starts = [np.zeros(len(o)) for o in orders]
    ends = [np.zeros(len(o)) for o in orders]
    position, free = [0] * p, [0.0] * p
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = 0
        for s in range(p):
            order, k = orders[s], position[s]
            while k < len(order):
                op = order[k]
                ready = _ready(schedule, op, s, p, chunks, done_f, done_b)
                if ready is None:
                    break
                start = max(free[s], ready)
                end = start + times.duration(s, op)
                _finish(schedule, op, s, p, end, done_f, done_b)
                starts[s][k], ends[s][k], free[s] = start, end, end
                k += 1
            progressed += k - position[s]
            position[s] = k
        assert progressed, "a split-backward order waits for itself (cost/operations.py)"
        remaining -= progressed
    return SplitRun(tuple(orders), tuple(starts), tuple(ends))


def _ready(schedule: Schedule, op: Op, s: int, p: int, chunks: int, done_f: np.ndarray, done_b: np.ndarray
           ) -> float | None:
    """When ``op``'s inputs are there (None: not yet known)."""
    times = []
    if op.kind in (FORWARD, OVERLAPPED):
        i = virtual_stage(schedule, s, op.chunk, p)
        if i > 0:
            times.append(done_f[i - 1, op.microbatch])
    if op.kind in (INPUT_GRAD, FULL_BACKWARD, OVERLAPPED):
        chunk, j = (op.chunk2, op.microbatch2) if op.kind == OVERLAPPED else (op.chunk, op.microbatch)
        i = virtual_stage(schedule, s, chunk, p)
        times.append(done_b[i + 1, j] if i < chunks - 1 else done_f[i, j])
    if op.kind == WEIGHT_GRAD:
        times.append(done_b[virtual_stage(schedule, s, op.chunk, p), op.microbatch])
    if any(np.isnan(t) for t in times):
        return None
    return max(times, default=0.0)


def _finish(schedule: Schedule, op: Op, s: int, p: int, end: float, done_f: np.ndarray, done_b: np.ndarray) -> None:
    if op.kind in (FORWARD, OVERLAPPED):
        done_f[virtual_stage(schedule, s, op.chunk, p), op.microbatch] = end
    if op.kind in (INPUT_GRAD, FULL_BACKWARD):
        done_b[virtual_stage(schedule, s, op.chunk, p), op.microbatch] = end
    if op.kind == OVERLAPPED:
        done_b[virtual_stage(schedule, s, op.chunk2, p), op.microbatch2] = end
