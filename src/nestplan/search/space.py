"""The search space: candidate generators that yield legal values only."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator

from nestplan.strategy.legality import cp_comm_conflict
from nestplan.errors import ConfigError
from nestplan.job import Job
from nestplan.model.spec import ModelSpec
from nestplan.settings import CpCommType
from nestplan.strategy.legality import tp_conflict
from nestplan.strategy.enums import Recompute, Schedule, ZeroStage
from nestplan.strategy.placement import NAMED_ORDERS as SEARCH_ORDERS
from nestplan.strategy.subgraph import SubGraph

POWERS_OF_TWO = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_MEMORY_MARGIN = 0.05
MAX_MEMORY_MARGIN = 0.5


@dataclass(frozen=True)
class SearchSpace:
    """Which values the planner may choose; the defaults are the full space."""

    tp: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    sp: tuple[bool, ...] = (False, True)
    cp: tuple[int, ...] = (1, 2, 4, 8)
    ep: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    # expert tensor parallelism of MoE models (parallel folding, strategy.subgraph.SubGraph.etp), each
    # value where it divides tp: None is etp = tp (the experts split like the attention), 1 each expert
    # whole on one rank with tp folded into expert parallelism (Megatron-Core's recommendation for
    # fine-grained experts)
    etp: tuple[int | None, ...] = (None, 1)
    # the MoE all-to-all overlap (RunSettings.moe_comm_overlap) tried on the finalists where it can run (search/planner.py)
    moe_comm_overlap: bool = True
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    recompute: tuple[Recompute, ...] = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
    zero: tuple[ZeroStage, ...] = (ZeroStage.NONE, ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS, ZeroStage.PARAMETERS)
    orders: tuple[tuple[str, ...], ...] = field(default=SEARCH_ORDERS)
    min_cp_seq_len: int = 8192  # context parallelism is offered from this sequence length on
    max_pp: int | None = None
    # context parallelism only where there is neither tensor nor pipeline parallelism (DeepSpeed-Ulysses:
    # export/deepspeed.py SEARCH_LIMITS)
    cp_alone: bool = False
    # the ZeRO stages a pipeline (pp > 1) may use (None: every stage of ``zero``; DeepSpeed's pipeline
    # engine: 0 and 1)
    pipeline_zero: tuple[ZeroStage, ...] | None = None
    # pipeline schedules the planner may return: it ranks splits under 1F1B (always in) and tries
    # the others as variants of its finalists (search/planner.py)
    schedules: tuple[Schedule, ...] = (
        Schedule.ONE_F_ONE_B,
        Schedule.INTERLEAVED,
        Schedule.ZB_H1,
        Schedule.ZBV,
        Schedule.DUALPIPEV,
    )
    # context parallelism's K/V exchanges the planner may choose (a plan with cp > 1 is ranked under the
    # job's own and tried with the others: search/planner.py); None: the job's only
    cp_comm_types: tuple[CpCommType, ...] | None = None
    # fraction of each device's memory the planner keeps free for what no formula sees (allocator
    # fragmentation, NCCL buffers, CUDA graphs); ``evaluate`` judges fit against the full capacity
    memory_margin: float = DEFAULT_MEMORY_MARGIN

    def __post_init__(self) -> None:
        bad = [e for e in self.etp if e is not None and (not isinstance(e, int) or isinstance(e, bool) or e < 1)]
        if bad or not self.etp:
            raise ConfigError(
                f"expert tensor parallelism must be 'tp' or positive integers, got {self.etp!r}",
                field="etp",
                value=self.etp,
                limit="tp or >= 1",
            )
        margin = self.memory_margin
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0.0 <= margin < MAX_MEMORY_MARGIN:
            raise ConfigError(
                f"memory margin must be a fraction of device memory in [0, {MAX_MEMORY_MARGIN}), got {margin!r}",
                field="memory_margin",
                value=margin,
                limit=f"0..{MAX_MEMORY_MARGIN}",
            )

    def capacity_bytes(self, hbm_bytes: float) -> float:
        """The memory per device a plan may use: what the margin leaves of ``hbm_bytes``."""
        return hbm_bytes * (1.0 - self.memory_margin)


def deepest_pipeline(space: SearchSpace, sub: SubGraph, zero: ZeroStage, deepest: int) -> int:
    """The most stages a plan of ``sub`` and ``zero`` may have: ``deepest``, or 1 where the space runs
    that context parallelism or ZeRO stage without a pipeline (``cp_alone``, ``pipeline_zero``)."""
    if space.cp_alone and sub.cp > 1:
        return 1
    return 1 if space.pipeline_zero is not None and zero not in space.pipeline_zero else deepest


def even_split(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage as even as possible (earlier stages take the remainder)."""
    return tuple(layers // stages + (1 if i < layers % stages else 0) for i in range(stages))


def tp_values(space: SearchSpace, model: ModelSpec, devices: int) -> list[int]:
    """tp values the model allows (strategy/dims.py ``tp_conflict``). tp may span
    nodes (Alpa-style over-sharding is in the space, so no baseline can leave it)."""
    return [t for t in space.tp if t <= devices and tp_conflict(model, t) is None]


def aligned(size: int, unit_sizes: tuple[int, ...]) -> bool:
    """A group of ``size`` consecutive ranks never straddles a network unit unevenly: it divides
    every unit or is a multiple of it, so all such groups span the same levels."""
    return all(u % size == 0 or size % u == 0 for u in unit_sizes)


def sub_configs(
    space: SearchSpace, model: ModelSpec, job: Job, node_devices: int, devices: int, unit_sizes: tuple[int, ...] = ()
) -> Iterator[tuple[SubGraph, tuple[str, ...]]]:
    """Legal sub-graph strategies, each with every rank order the search loops over; tp, tp x cp and
    tp x cp x ep are aligned with ``unit_sizes``."""
    cps = [c for c in space.cp if c == 1 or (job.seq_len >= space.min_cp_seq_len and job.seq_len % (2 * c) == 0)]
    eps = [e for e in space.ep if e == 1 or (model.is_moe and model.num_experts % e == 0)]
    for tp in tp_values(space, model, devices):
        for sp in sorted({s and tp > 1 for s in space.sp}):
            for cp in cps:
                for ep in eps:
                    if tp * cp * ep > devices or cp_comm_conflict(job, cp, tp, model) is not None:
                        continue
                    if space.cp_alone and cp > 1 and tp > 1:
                        continue
                    if not all(aligned(x, unit_sizes) for x in (tp, tp * cp, tp * cp * ep)):
                        continue
                    for etp in expert_tp_values(space, model, tp, sp, ep):
                        for mbs in space.micro_batch_sizes:
                            if job.global_batch_size % (ep * mbs):
                                continue
                            for rc in space.recompute:
                                sub = SubGraph(tp, sp, cp, ep, etp, mbs, rc)
                                for order in space.orders:
                                    yield sub, order


def expert_tp_values(space: SearchSpace, model: ModelSpec, tp: int, sp: bool, ep: int) -> list[int | None]:
    """The expert tensor parallelism a sub-graph may use (SubGraph.etp: None is etp = tp): the space's
    values that divide tp, below tp only with sp, the experts and their FFN divided as folding needs."""
    if not model.is_moe:
        return [None]
    out: list[int | None] = []
    for etp in sorted({tp if e is None else e for e in space.etp}, reverse=True):
        if tp % etp or (etp < tp and not sp):
            continue
        if model.num_experts % (ep * tp // etp) or model.moe_ffn_hidden_size % etp:
            continue
        out.append(None if etp == tp else etp)
    return out


def replica_counts(sub: SubGraph, job: Job, devices: int) -> list[int]:
    """dp values: the batch divides over dp x ep x microbatch, and a replica's stages fit the devices."""
    per = sub.ep * sub.micro_batch_size
    limit = devices // sub.stage_devices
    if job.global_batch_size % per:
        return []
    quotient = job.global_batch_size // per  # d * per divides the batch: d divides the quotient
    small = [d for d in range(1, math.isqrt(quotient) + 1) if quotient % d == 0]
    divisors = sorted(set(small + [quotient // d for d in small]))
    return [d for d in divisors if d <= limit]


# What plain PyTorch FSDP runs (Hugging Face Accelerate/Trainer, Composer): data parallelism alone, sharded as
# NO_SHARD (ZeRO 0), SHARD_GRAD_OP (ZeRO 2) or FULL_SHARD (ZeRO 3) (torch.distributed.fsdp.ShardingStrategy), with
# or without activation checkpointing of every block (full recomputation): no tensor, sequence, context, expert or
# pipeline parallelism.
FSDP_SPACE = {
    "tp": (1,),
    "sp": (False,),
    "cp": (1,),
    "ep": (1,),
    "max_pp": 1,
    "zero": (ZeroStage.NONE, ZeroStage.GRADIENTS, ZeroStage.PARAMETERS),
    "recompute": (Recompute.NONE, Recompute.FULL),
}
