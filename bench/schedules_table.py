"""Every pipeline schedule at the planner's degrees (issue 16's table): for each case the planner's
plan, then the same degrees, on its split and on the even split, under gpipe, 1f1b, interleaved (v = 2), zb-h1, zbv and
dualpipev, each with its predicted step time, bubble and peak memory per device, or why it is
not legal there.

Run: python bench/schedules_table.py [--markdown]
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import replace

from nestplan import api
from nestplan.errors import ConfigError
from nestplan.job import Job
from nestplan.search.space import even_split
from nestplan.strategy.enums import Schedule
from nestplan.units import GiB

CASES = [
    ("llama3-70b", "dgx-h100", 64, 128, 8192),
    ("llama3-70b", "dgx-h100", 128, 256, 8192),
    ("llama3-70b", "dgx-h100", 256, 512, 8192),
    ("mixtral-8x7b", "dgx-h100", 64, 256, 4096),
    ("mixtral-8x7b", "dgx-h100", 128, 512, 4096),
]
SCHEDULES = [
    (Schedule.GPIPE, 1),
    (Schedule.ONE_F_ONE_B, 1),
    (Schedule.INTERLEAVED, 2),
    (Schedule.ZB_H1, 1),
    (Schedule.ZBV, 2),
    (Schedule.DUALPIPEV, 2),
]


def rows(model: str, cluster: str, devices: int, batch: int, seq: int) -> tuple[str, list[tuple]]:
    job = Job(global_batch_size=batch, seq_len=seq)
    report = api.plan(model, cluster, job, devices=devices, top=0)
    best = report.best
    d = best.plan
    head = (
        f"{model} on {devices} GPUs of {cluster}, batch {batch} x {seq}: planner's plan tp {d.tp} cp {d.cp} "
        f"ep {d.ep} pp {d.pp} dp {d.dp} mbs {d.micro_batch_size} z{int(d.zero)} {d.recompute.value} "
        f"{d.schedule.value} v{d.virtual_stages}, {best.step_time_s:.3f} s"
    )
    planned = tuple(s.last_layer - s.first_layer + 1 for s in best.stages)
    out = []
    for (schedule, v), split in itertools.product(SCHEDULES, sorted({planned, even_split(sum(planned), d.pp)})):
        try:
            dims = replace(d, schedule=schedule, virtual_stages=v, layers_per_stage=split)
            pred = api.evaluate_full(
                model, cluster, dims, job, devices=devices, axis_order=best.placement.axis_order
            ).prediction
        except ConfigError as err:
            out.append((schedule.value, v, _split(split), "not legal: " + str(err)))
            continue
        peak = max(s.peak_memory_bytes for s in pred.stages) / GiB
        out.append(
            (
                schedule.value,
                v,
                _split(split),
                f"{pred.step_time_s:.3f}",
                f"{pred.breakdown_s['pipeline_bubble']:.3f}",
                f"{peak:.1f}",
                "fits" if pred.fits else "does not fit",
                "picked" if (schedule, split) == (d.schedule, planned) else "",
            )
        )
    return head, out


def _split(split: tuple[int, ...]) -> str:
    return "/".join(map(str, split))


def main() -> None:
    markdown = "--markdown" in sys.argv
    for case in CASES:
        head, table = rows(*case)
        print(("\n**" + head + "**\n") if markdown else "\n" + head)
        if markdown:
            print(
                "| schedule | v | layers per stage | step s | bubble s | peak GiB | memory | |\n|---|---|---|---|---|---|---|---|"
            )
        for r in table:
            print(("| " + " | ".join(map(str, r)) + " |") if markdown else "  " + "  ".join(map(str, r)))


if __name__ == "__main__":
    main()
