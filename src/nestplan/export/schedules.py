"""Which pipeline schedules and context-parallel exchanges each framework runs as nestplan costs
them, so that ``plan --export`` searches only those (a plan the framework would run otherwise is not
its plan).

Sources: Megatron-LM and Megatron-Bridge run 1F1B and interleaved 1F1B (megatron/core/pipeline_parallel/
schedules.py; no zero-bubble or DualPipe schedule) and every ``--cp-comm-type``; DeepSpeed's pipeline
engine runs 1F1B only (deepspeed/runtime/pipe/schedule.py, TrainSchedule) and its sequence parallelism
is Ulysses (all-to-all); torchtitan 0.3.0 takes torch.distributed.pipelining's schedules by name
(``--parallelism.pipeline_parallel_schedule``: GPipe, 1F1B, Interleaved1F1B, ZBVZeroBubble, DualPipeV;
its zero-bubble schedule of one chunk per stage is not among them) and all-gathers K/V for context
parallelism (export/torchtitan.py).
"""

from __future__ import annotations

from nestplan.job import CpCommType
from nestplan.strategy.enums import Schedule

MEGATRON = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)
FRAMEWORK_SCHEDULES: dict[str, tuple[Schedule, ...]] = {
    "megatron": MEGATRON,
    "megatron-bridge": MEGATRON,
    "nemo": MEGATRON,
    "deepspeed": (Schedule.ONE_F_ONE_B,),
    "torchtitan": tuple(s for s in Schedule if s is not Schedule.ZB_H1),
}
FRAMEWORK_CP_COMM: dict[str, tuple[CpCommType, ...]] = {
    "megatron": tuple(CpCommType),
    "megatron-bridge": tuple(CpCommType),
    "nemo": tuple(CpCommType),
    "deepspeed": (CpCommType.A2A,),
    "torchtitan": (CpCommType.ALLGATHER,),
}


def framework_schedules(framework: str) -> tuple[Schedule, ...]:
    """The schedules ``framework`` (a name export.check_framework accepted) runs as costed."""
    return FRAMEWORK_SCHEDULES[framework]


def framework_cp_comm(framework: str) -> tuple[CpCommType, ...]:
    """The context-parallel exchanges ``framework`` runs as costed."""
    return FRAMEWORK_CP_COMM[framework]
