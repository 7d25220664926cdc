"""Memory per device of one pipeline stage (NEST eq. 1).

peak = weights + gradients + optimizer state   (each divided over the ZeRO shard group
       from the stage that shards it on; Rajbhandari et al. 2020, Figure 1)
     + activations stored per microbatch x microbatches in flight at the stage
       (1F1B: the stage k-th from the end holds k, GPipe: all m; interleaved per Megatron's
       warm-up count, which reproduces Korthikanti et al. 2022 eq. in section 4.2.3, and all m
       when m equals the stages: :func:`in_flight_microbatches`, checked against the schedule
       simulation's timeline)
     + transient buffers (one layer's full activations while recomputing it; ZeRO-3's
       gathered layer parameters, two with prefetch)
     + a reserve for the framework, workspace and fragmentation (per accelerator).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nestplan.model.layers import ParamCount
from nestplan.strategy.enums import Schedule, ZeroStage

MEMORY_TERMS = ("weights", "gradients", "optimizer", "activations", "transient", "reserved")


@dataclass(frozen=True)
class ShardGroups:
    """Sizes of the groups over which ZeRO shards dense and expert states."""

    dense: int
    expert: int


def warmup_forwards(schedule: Schedule, stage: int | np.ndarray, pp: int | np.ndarray, m: int, virtual: int
                    ) -> np.ndarray:
    """Forwards (of model chunks) a stage runs before its first backward, at most all m v of them.

    Megatron-LM's counts (schedules.py): GPipe all m v; 1F1B pp - stage - 1; interleaved 1F1B
    (forward_backward_pipelining_with_interleaving) (pp - stage - 1) * 2 + (v - 1) * pp, or all
    m v when m == pp (every forward runs first). The schedule simulation (cost/schedule.py) runs
    this order and :func:`in_flight_microbatches` charges its memory. ``stage`` and ``pp`` may be
    arrays (elementwise)."""
    total = m * virtual
    stage, pp = np.asarray(stage), np.asarray(pp)
    if schedule is Schedule.GPIPE:
        warmup = np.full(np.broadcast(stage, pp).shape, total)
    elif schedule is Schedule.INTERLEAVED:
        warmup = np.where(pp == m, total, (pp - stage - 1) * 2 + (virtual - 1) * pp)
    else:
        warmup = pp - stage - 1
    return np.minimum(warmup, total)


def in_flight_microbatches(schedule: Schedule, stage: int | np.ndarray, pp: int | np.ndarray, m: int,
                           virtual: int) -> float | np.ndarray:
    """Microbatches whose activations a stage holds at its peak, in units of the whole stage.

    A stage runs w warm-up forwards (:func:`warmup_forwards`), then one more before its first
    backward, and from then on alternates, so it holds at most min(w + 1, m v) model chunks of
    1/v of the stage each. ``stage`` and ``pp`` may be arrays (the search's tables): the count is
    then elementwise, an array.
    """
    chunks = np.minimum(warmup_forwards(schedule, stage, pp, m, virtual) + 1, m * virtual) / virtual
    return float(chunks) if chunks.ndim == 0 else chunks


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


def model_state_total(params: ParamCount, shards: ShardGroups, zero: ZeroStage, weight_bytes: int, grad_bytes: int,
                      optimizer_bytes: int) -> float:
    """The sum of :func:`model_state_bytes` (bytes per device), without building the breakdown."""
    weights, gradients, optimizer = _state_values(params, shards, zero, weight_bytes, grad_bytes, optimizer_bytes)
    return weights + gradients + optimizer


def _state_values(params: ParamCount, shards: ShardGroups, zero: ZeroStage, weight_bytes: int, grad_bytes: int,
                  optimizer_bytes: int) -> tuple[float, float, float]:
    def per_device(bytes_per_param: int, sharded: bool) -> float:
        if not sharded:
            return bytes_per_param * params.total
        return bytes_per_param * (params.dense / shards.dense + params.expert / shards.expert)

    return (per_device(weight_bytes, zero >= ZeroStage.PARAMETERS), per_device(grad_bytes, zero >= ZeroStage.GRADIENTS),
            per_device(optimizer_bytes, zero >= ZeroStage.OPTIMIZER))


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
