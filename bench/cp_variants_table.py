"""Context parallelism's K/V exchanges side by side (issue 16's table): Llama 3 8B at 64k and 128k
tokens on 8-32 H100s of dgx-h100, the planner's plan under each cp degree, then the same plan with
each exchange (p2p ring, a2a Ulysses, allgather, a2a+p2p), with its predicted step time relative
to the ring and to cp 1 where cp 1 fits.

Run: python bench/cp_variants_table.py [--markdown]
"""

from __future__ import annotations

import sys

from nestplan import api
from nestplan.errors import ConfigError, InfeasibleError
from nestplan.job import Job
from nestplan.search.space import SearchSpace
from nestplan.settings import CpCommType

CASES = [(8, 65536), (8, 131072), (16, 131072), (32, 131072)]
CP = (1, 2, 4, 8)
KINDS = (CpCommType.P2P, CpCommType.A2A, CpCommType.ALLGATHER, CpCommType.A2A_P2P)


def _variant_job(job: Job, kind: CpCommType, cp: int) -> Job:
    return job.with_settings(cp_comm_type=kind, cp_a2a_size=2 if kind is CpCommType.A2A_P2P and cp >= 4 else 1)


def case_rows(devices: int, seq: int) -> list[tuple]:
    rows = []
    for cp in CP:
        job = Job(global_batch_size=devices // cp if devices >= cp else 1, seq_len=seq)
        try:
            report = api.plan(
                "llama3-8b", "dgx-h100", job, devices=devices, top=0, space=SearchSpace(cp=(cp,), min_cp_seq_len=1)
            )
        except (InfeasibleError, ConfigError) as err:
            rows.append((devices, seq, cp, "-", "no plan fits: " + str(err).split(";")[0]))
            continue
        d = report.best.plan
        plan = f"tp {d.tp} cp {d.cp} pp {d.pp} dp {d.dp} {d.recompute.value}"
        times = {}
        for kind in KINDS if cp > 1 else (CpCommType.P2P,):
            if kind is CpCommType.A2A_P2P and cp < 4:
                continue
            try:
                pred = api.evaluate_full(
                    "llama3-8b",
                    "dgx-h100",
                    d,
                    _variant_job(job, kind, cp),
                    devices=devices,
                    axis_order=report.best.placement.axis_order,
                ).prediction
            except ConfigError as err:
                times[kind.value] = "not legal: " + str(err)
                continue
            per_token = pred.step_time_s / job.tokens_per_step
            times[kind.value] = (per_token, pred.fits)
        rows.append((devices, seq, cp, plan, times))
    return rows


def main() -> None:
    markdown = "--markdown" in sys.argv
    if markdown:
        print("| GPUs | seq | cp | plan | " + " | ".join(k.value for k in KINDS) + " |")
        print("|---" * (4 + len(KINDS)) + "|")
    for devices, seq in CASES:
        rows = case_rows(devices, seq)
        base = next((r[4]["p2p"][0] for r in rows if r[2] == 1 and isinstance(r[4], dict)), None)
        for devices_, seq_, cp, plan, times in rows:
            cells = []
            for k in KINDS:
                value = times.get(k.value, "-") if isinstance(times, dict) else times
                if isinstance(value, tuple):
                    us, fits = value
                    rel = f" ({us / base:.2f}x cp1)" if base else ""
                    value = f"{us * 1e6:.2f} us/token{rel}" + ("" if fits else " does not fit")
                cells.append(str(value))
            line = [str(devices_), str(seq_), str(cp), plan] + cells
            print(("| " + " | ".join(line) + " |") if markdown else "  ".join(line))


if __name__ == "__main__":
    main()
