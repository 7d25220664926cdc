"""Planner benchmarks (issue: the planner): solve time, peak memory and plan quality.

Run: python bench/bench_plan.py [--quick]
Each case runs in a fresh process (peak RSS = ru_maxrss of that process). Prints, per case:
solve seconds, peak MiB, nestplan's tokens/s, the best tokens/s of a Megatron-style grid
(tp in {1,2,4,8} x pp in {1,2,4,8,16}, even layers, dp fills the rest; sp with tp > 1; the
best recomputation and ZeRO 0/1 that fits; microbatch 1) and their ratio.
"""

from __future__ import annotations

import json
import subprocess
import sys

MODELS = {"llama2-7b": 4096, "llama3-70b": 4096, "gpt3-175b": 2048, "mixtral-8x7b": 4096}  # NEST Table 2 sequences
CLUSTERS = ("tpuv4-fattree", "h100-spine-leaf")
SCALES = (64, 128, 256, 512, 1024)
LLAMA405 = [("llama3.1-405b", "llama3-h100", n, 2048, 8192) for n in (8192, 16384)]  # 16M tokens per batch

CASE = r"""
import json, resource, sys, time
from nestplan import api
from nestplan.cost.evaluator import evaluate_plan
from nestplan.errors import PlannerError
from nestplan.job import Job
from nestplan.strategy.dims import ParallelDims
model_name, cluster_name, n, gbs, seq = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
model = api.resolve_model(model_name); cluster = api.resolve_cluster(cluster_name, n)
job = Job(global_batch_size=gbs, seq_len=seq)
t0 = time.perf_counter()
try:
    rep = api.plan(model, cluster, job)
    best, desc = rep.best.tokens_per_s, rep.best.plan
    desc = f"tp{desc.tp}{'sp' if desc.sp_active else ''} pp{desc.pp} dp{desc.dp} ep{desc.ep} cp{desc.cp} mbs{desc.micro_batch_size} z{int(desc.zero)} {desc.recompute.value} v{desc.virtual_stages}"
except PlannerError as exc:
    best, desc = 0.0, "infeasible"
solve = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
grid = 0.0
if "--grid" in sys.argv:
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8, 16):
            if n % (tp * pp) or model.num_layers % pp or model.num_heads % tp:
                continue
            dp = n // (tp * pp)
            if gbs % dp:
                continue
            for rc in ("none", "selective", "full"):
                for zero in (0, 1):
                    try:
                        d = ParallelDims(tp=tp, pp=pp, dp=dp, sp=tp > 1, recompute=rc, zero=zero)
                        p = evaluate_plan(model, cluster, d, job)
                    except PlannerError:
                        continue
                    if p.fits:
                        grid = max(grid, p.tokens_per_s)
print(json.dumps({"solve_s": solve, "rss_mib": rss, "tokens_per_s": best, "grid": grid, "plan": desc}))
"""


def run_case(model: str, cluster: str, n: int, gbs: int, seq: int, grid: bool) -> dict:
    args = [sys.executable, "-c", CASE, model, cluster, str(n), str(gbs), str(seq)] + (["--grid"] if grid else [])
    out = subprocess.run(args, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    quick = "--quick" in sys.argv
    cases = [(m, c, n, 4096, s) for c in CLUSTERS for m, s in MODELS.items() for n in SCALES]
    cases += LLAMA405
    if quick:
        cases = cases[::9]
    print(
        f"{'model':14s} {'cluster':16s} {'devices':>7s} {'solve s':>8s} {'peak MiB':>8s} {'tokens/s':>10s} "
        f"{'grid tok/s':>10s} {'ratio':>6s}  plan"
    )
    worst_time = worst_rss = 0.0
    for model, cluster, n, gbs, seq in cases:
        r = run_case(model, cluster, n, gbs, seq, grid=n <= 1024)
        ratio = r["tokens_per_s"] / r["grid"] if r["grid"] else float("nan")
        worst_time, worst_rss = max(worst_time, r["solve_s"]), max(worst_rss, r["rss_mib"])
        print(
            f"{model:14s} {cluster:16s} {n:7d} {r['solve_s']:8.2f} {r['rss_mib']:8.0f} {r['tokens_per_s']:10.0f} "
            f"{r['grid']:10.0f} {ratio:6.3f}  {r['plan']}",
            flush=True,
        )
    print(f"slowest solve {worst_time:.2f} s, largest peak RSS {worst_rss:.0f} MiB")


if __name__ == "__main__":
    main()
