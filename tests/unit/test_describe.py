"""strategy.describe: the one wording of a plan's degrees, short and long, etp shown in both."""

from __future__ import annotations

from dataclasses import replace

from nestplan.strategy.describe import describe
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, Schedule, ZeroStage
from nestplan.strategy.placement import STAGE_MAJOR


def test_short_and_long_forms_of_a_plain_plan() -> None:
    dims = ParallelDims(tp=4, sp=True, pp=2, dp=16, cp=2, zero=ZeroStage.OPTIMIZER)
    assert describe(dims) == "tp4+sp pp2 dp16 cp2 mbs1 zero1"
    assert (
        describe(dims, STAGE_MAJOR, long=True) == "tp 4+sp, pp 2, dp 16, cp 2, mbs 1, ZeRO 1, rc none, tp-cp-ep-dp-pp"
    )


def test_both_forms_show_folded_experts_schedule_and_recompute() -> None:
    folded = ParallelDims(tp=4, sp=True, pp=4, dp=2, ep=8, etp=1, micro_batch_size=2, recompute=Recompute.FULL)
    dims = replace(folded, schedule=Schedule.INTERLEAVED, virtual_stages=2)
    assert describe(dims) == "tp4+sp pp4 dp2 ep8 etp1 (experts over 32) interleaved v2 mbs2 zero0 recompute full"
    assert describe(dims, long=True) == (
        "tp 4+sp, pp 4, dp 2, ep 8, etp 1 (experts over 32), interleaved v 2, mbs 2, ZeRO 0, rc full"
    )
