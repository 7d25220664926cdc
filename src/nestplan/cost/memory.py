"""Memory per device of one pipeline stage (NEST eq. 1).

peak = weights + gradients + optimizer state   (each divided over the ZeRO shard group
       from the stage that shards it on; Rajbhandari et al. 2020, Figure 1)
     + activations stored per microbatch x microbatches in flight at the stage
       (1F1B: the stage k-th from the end holds k, GPipe: all m; interleaved per Megatron's
       warm-up count, which reproduces Korthikanti et al. 2022 eq. in section 4.2.3, and all m
       when m equals the stages: :func:`in_flight_microbatches`; chunks of unequal size per
       virtual stage: :func:`live_activation_peak`; both checked against the schedule
       simulation's timeline)
     + transient buffers (one layer's full activations while recomputing it; ZeRO-3's
       gathered layer parameters, two with prefetch)
     + a reserve for the framework, workspace and fragmentation (per accelerator).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nestplan.cost.schedules import warmup_forwards
from nestplan.cost.schedules.operations import forward_chunk
from nestplan.model.layers import COLUMN, Gemm, ParamCount
from nestplan.strategy.enums import Schedule, ZeroStage

MEMORY_TERMS = ("weights", "gradients", "optimizer", "activations", "transient", "reserved")


@dataclass(frozen=True)
class ShardGroups:
    """Sizes of the groups over which ZeRO shards dense and expert states."""

    dense: int
    expert: int


def live_activation_peak(
    schedule: Schedule, stage: int, pp: int, m: int, chunk_bytes: np.ndarray, early: int = 0
) -> float:
    """The most activation bytes a stage holds at once, its v chunks storing ``chunk_bytes[c]`` per
    microbatch (chunk c of the stage; they may differ).

    The fast path of Megatron-LM's orders (1F1B, GPipe, interleaved) for the memory walk over
    operation lists (cost/schedules/walk.py ``activation_peak``; tests/unit/test_schedule_registry.py
    checks they agree). The exact rule: the stage runs forwards 0 .. w - 1 (w = its schedule's
    warm-up forwards, cost/schedules ``warmup_forwards``), then forward
    w + j before backward j for j = 0, 1, ...; forward k stores its chunk's bytes, backward k frees
    chunk v - 1 - :func:`forward_chunk` (k)'s. Only forwards add, so the peak follows a forward:
    max_j [ sum_{k <= w + j} a(forward_chunk(k)) - sum_{k < j} a(v - 1 - forward_chunk(k)) ]. Both
    sums gain every chunk p times per p v operations, so the bracket repeats with period p v in j
    and the first min(p v, m v - w) values of j suffice. With equal chunks it is
    :func:`in_flight_microbatches` x their sum. ``early``: forwards run ahead of the schedule's
    (:func:`in_flight_microbatches`)."""
    a = np.asarray(chunk_bytes, float)
    v = len(a)
    total = m * v
    w = min(int(warmup_forwards(schedule, stage, pp, m, v)) + early, total)
    if w >= total:
        return float(m * a.sum())
    span = min(pp * v, total - w)
    ks = np.arange(w + span)
    stored = np.cumsum(a[forward_chunk(ks, pp, v)])
    freed = np.concatenate([[0.0], np.cumsum(a[v - 1 - forward_chunk(np.arange(span), pp, v)])])
    j = np.arange(span)
    return float((stored[w + j] - freed[j]).max())


def in_flight_microbatches(
    schedule: Schedule, stage: int | np.ndarray, pp: int | np.ndarray, m: int, virtual: int, early: int = 0
) -> float | np.ndarray:
    """Microbatches whose activations a stage holds at its peak, in units of the whole stage.

    A stage runs w warm-up forwards (cost/schedules ``warmup_forwards``), then one more before its first
    backward, and from then on alternates, so it holds at most min(w + 1, m v) model chunks of
    1/v of the stage each (:func:`live_activation_peak` with equal chunks). ``early`` forwards more
    run ahead where the schedule merges the forward of the next microbatch with the backward of the
    current one (``moe_a2a_early``). ``stage`` and ``pp`` may be arrays (the search's tables): the
    count is then elementwise, an array.
    """
    chunks = np.minimum(warmup_forwards(schedule, stage, pp, m, virtual) + 1 + early, m * virtual) / virtual
    return float(chunks) if chunks.ndim == 0 else chunks


def moe_a2a_early(job) -> int:
    """Forwards a stage runs ahead of its schedule under Megatron-Core's 1F1B A2A overlap
    (``RunSettings.moe_comm_overlap``): the forward of microbatch i + 1 runs merged with the backward of
    microbatch i, so its activations are stored before that backward frees microbatch i's
    (megatron/core/pipeline_parallel/combined_1f1b.py): one; none otherwise."""
    return 1 if job.settings.moe_comm_overlap else 0


def weight_gradient_input_bytes(gemms: list[Gemm], dtype_bytes: float, sp_div: int = 1) -> float:
    """Activation bytes per microbatch a zero-bubble schedule keeps from a block's B until its W:
    the forward inputs (m x k) of its GEMMs, which the weight-gradient GEMMs read (Qi et al. ICLR 2024,
    section 2.1: W needs less memory than B). An input sequence parallelism gathers is kept as the
    device's 1/tp share (Korthikanti et al. 2022, section 4.2.2), gathered again for W."""
    return sum(g.count * g.m * g.k * dtype_bytes / (sp_div if g.gathered == COLUMN else 1) for g in gemms)


def model_state_bytes(
    params: ParamCount,
    shards: ShardGroups,
    zero: ZeroStage,
    weight_bytes: int,
    grad_bytes: int,
    optimizer_bytes: int,
) -> dict[str, float]:
    """Weights, gradients and optimizer state on one device after ZeRO sharding."""
    values = _state_values(params, shards, zero, weight_bytes, grad_bytes, optimizer_bytes)
    return dict(zip(("weights", "gradients", "optimizer"), values))


def model_state_total(
    params: ParamCount, shards: ShardGroups, zero: ZeroStage, weight_bytes: int, grad_bytes: int, optimizer_bytes: int
) -> float:
    """The sum of :func:`model_state_bytes` (bytes per device), without building the breakdown."""
    weights, gradients, optimizer = _state_values(params, shards, zero, weight_bytes, grad_bytes, optimizer_bytes)
    return weights + gradients + optimizer


def _state_values(
    params: ParamCount, shards: ShardGroups, zero: ZeroStage, weight_bytes: int, grad_bytes: int, optimizer_bytes: int
) -> tuple[float, float, float]:
    def per_device(bytes_per_param: int, sharded: bool) -> float:
        if not sharded:
            return bytes_per_param * params.total
        return bytes_per_param * (params.dense / shards.dense + params.expert / shards.expert)

    return (
        per_device(weight_bytes, zero >= ZeroStage.PARAMETERS),
        per_device(grad_bytes, zero >= ZeroStage.GRADIENTS),
        per_device(optimizer_bytes, zero >= ZeroStage.OPTIMIZER),
    )


def stage_memory(
    states: dict[str, float],
    activation_per_microbatch: float,
    in_flight: float,
    transient: float,
    reserved: float,
) -> dict[str, float]:
    """The full breakdown (bytes per device) of one stage; keys are MEMORY_TERMS."""
    out = dict(states)
    out["activations"] = activation_per_microbatch * in_flight
    out["transient"] = transient
    out["reserved"] = reserved
    assert tuple(out) == MEMORY_TERMS
    return out
