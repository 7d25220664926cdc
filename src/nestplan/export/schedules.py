"""Which pipeline schedules each framework runs as nestplan costs them, so that ``plan --export``
searches only those (a plan the framework would run under another schedule is not its plan).

Sources: Megatron-LM and Megatron-Bridge run 1F1B and interleaved 1F1B (megatron/core/pipeline_parallel/
schedules.py; no zero-bubble or DualPipe schedule); DeepSpeed's pipeline engine runs 1F1B only
(deepspeed/runtime/pipe/schedule.py, TrainSchedule); torchtitan takes any schedule of
torch.distributed.pipelining by name (``--parallelism.pipeline_parallel_schedule``: GPipe, 1F1B,
Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV).
"""

from __future__ import annotations

from nestplan.strategy.enums import Schedule

MEGATRON = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)
FRAMEWORK_SCHEDULES: dict[str, tuple[Schedule, ...]] = {
    "megatron": MEGATRON,
    "megatron-bridge": MEGATRON,
    "nemo": MEGATRON,
    "deepspeed": (Schedule.ONE_F_ONE_B,),
    "torchtitan": tuple(Schedule),
}


def framework_schedules(framework: str) -> tuple[Schedule, ...]:
    """The schedules ``framework`` (a name export.check_framework accepted) runs as costed."""
    return FRAMEWORK_SCHEDULES[framework]
