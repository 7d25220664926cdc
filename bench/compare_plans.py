"""Plans and runner-ups of the planner as JSON, for checking that a search change returns identical results.

Run: python bench/compare_plans.py [--big | --small | --bench] [--only NAME] > out.jsonl
Each case runs in a fresh process; one JSON line per case: the best plan and every runner-up
(dims, axis order, exact step time as float.hex, the plan JSON of report/plan_json.py), and,
beside them, the search statistics and the CPU/wall seconds and peak RSS (not for comparison:
``--plans-only`` leaves them out so that two runs can be compared byte for byte).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

QWEN3 = str(Path(__file__).with_name("qwen3-235b-a22b.json"))
BIG = [
    ("gpt3-175b", "tpuv4-fattree", 1024, 4096, 2048),
    ("mixtral-8x7b", "h100-spine-leaf", 1024, 4096, 4096),
    (QWEN3, "dgx-h100", 512, 4096, 4096),
    ("llama3.1-405b", "llama3-h100", 16384, 2048, 8192),
]
SMALL = [
    (m, c, n, 4096, s)
    for m, s in (("llama2-7b", 4096), ("llama3-70b", 4096), ("gpt3-175b", 2048), ("mixtral-8x7b", 4096))
    for c in ("tpuv4-fattree", "h100-spine-leaf")
    for n in (64, 256)
]
# bench/bench_plan.py's 40 cases: every model and cluster at every scale
BENCH = [
    (m, c, n, 4096, s)
    for m, s in (("llama2-7b", 4096), ("llama3-70b", 4096), ("gpt3-175b", 2048), ("mixtral-8x7b", 4096))
    for c in ("tpuv4-fattree", "h100-spine-leaf")
    for n in (64, 128, 256, 512, 1024)
]

CASE = r"""
import json, resource, sys, time
from dataclasses import asdict
from nestplan import api
from nestplan.job import Job
from nestplan.report.plan_json import SearchStats, plan_to_dict
model_name, cluster_name, n, gbs, seq = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
model = api.resolve_model(model_name); cluster = api.resolve_cluster(cluster_name, n)
job = Job(global_batch_size=gbs, seq_len=seq)
w0, c0 = time.perf_counter(), time.process_time()
rep = api.plan(model, cluster, job)
wall, cpu = time.perf_counter() - w0, time.process_time() - c0
levels = [lv.name for lv in cluster.topology.levels]
def describe(p):
    d = plan_to_dict(p, model=model.name, cluster=cluster.name, devices_total=cluster.devices, job=job,
                     level_names=levels, search=SearchStats(0.0, candidates=0, pruned_memory=0))
    d.pop("search", None)
    return {"dims": repr(p.plan), "order": list(p.placement.axis_order), "step": float.hex(p.step_time_s),
            "fits": p.fits, "json": d}
s = rep.stats
print(json.dumps({"case": sys.argv[1:6], "best": describe(rep.best), "runners_up": [describe(p) for p in rep.runners_up],
                  "stats": {"groups": s.groups, "depths": s.depths, "candidates": s.candidates,
                            "pruned_memory": s.pruned_memory, "pruned_bound": s.pruned_bound},
                  "wall_s": wall, "cpu_s": cpu,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}, sort_keys=True))
"""


def run_case(case: tuple) -> dict:
    args = [sys.executable, "-c", CASE] + [str(x) for x in case]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"case {case} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if "--bench" in sys.argv:
        cases = BENCH + [("llama3.1-405b", "llama3-h100", 8192, 2048, 8192)] + BIG[2:]
    else:
        cases = BIG if "--big" in sys.argv else SMALL if "--small" in sys.argv else SMALL + BIG
    if "--only" in sys.argv:
        name = sys.argv[sys.argv.index("--only") + 1]
        cases = [c for c in cases if name in c[0]]
    for case in cases:
        r = run_case(case)
        if "--plans-only" in sys.argv:
            r = {k: r[k] for k in ("case", "best", "runners_up")}
        print(json.dumps(r, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
