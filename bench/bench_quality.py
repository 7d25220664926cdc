"""Plan quality checks (issue: the planner).

Run: python bench/bench_quality.py
1. Network awareness: on h100-spine-leaf, plan with the true topology, and with a flat one
   (same devices, every level at the node's speed), then evaluate both plans on the true
   network; prints the throughput ratio true-plan / flat-plan.
2. Korthikanti et al. 2022 Table 3 configurations on dgx-a100 (their GPUs and batch sizes,
   sequence 2048, fp16, no flash attention): nestplan's plan vs the published configuration
   (sequence parallel + selective recomputation), both predicted by the evaluator.
"""

from __future__ import annotations

import sys
from pathlib import Path

from nestplan import api
from nestplan.cost.evaluator import evaluate_plan
from nestplan.job import Job
from nestplan.search.baselines.phaze import flat_cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "validation"))
from test_korthikanti2022 import CONFIGS, _plan  # noqa: E402


def _describe(p) -> str:
    dims = p.plan
    layers = dims.layers_per_stage if dims.pp <= 8 else ""
    return f"tp{dims.tp} pp{dims.pp} dp{dims.dp} ep{dims.ep} {'-'.join(p.placement.axis_order[3:])} {layers}"


def network_awareness() -> None:
    print(f"{'model':14s} {'devices':>7s} {'true-plan tok/s':>15s} {'flat-plan tok/s':>15s} {'ratio':>6s}  plans")
    for model_name, seq in (("gpt3-175b", 2048), ("mixtral-8x7b", 4096), ("llama3-70b", 4096)):
        model = api.resolve_model(model_name)
        for n in (128, 256, 512, 1024):
            cluster = api.resolve_cluster("h100-spine-leaf", n)
            job = Job(global_batch_size=4096, seq_len=seq)
            true_plan = api.plan(model, cluster, job).best
            flat_plan = api.plan(model, flat_cluster(cluster), job).best
            again = evaluate_plan(model, cluster, flat_plan.plan, job, flat_plan.placement.axis_order)
            ratio = true_plan.tokens_per_s / again.tokens_per_s
            print(
                f"{model_name:14s} {n:7d} {true_plan.tokens_per_s:15.0f} {again.tokens_per_s:15.0f} {ratio:6.3f}  "
                f"true: {_describe(true_plan)} | flat: {_describe(flat_plan)}{'' if again.fits else ' (does not fit)'}",
                flush=True,
            )


def korthikanti() -> None:
    print(f"\n{'model':6s} {'published cfg s':>15s} {'nestplan s':>10s} {'speedup':>8s}  nestplan plan")
    for name in CONFIGS:
        model, cluster, dims, job = _plan(name, "sp_selective")
        published = api.evaluate(model, cluster, dims, job)
        best = api.plan(model, cluster, job).best
        p = best.plan
        print(
            f"{name:6s} {published.step_time_s:15.2f} {best.step_time_s:10.2f} "
            f"{published.step_time_s / best.step_time_s:8.3f}  tp{p.tp}{'sp' if p.sp_active else ''} pp{p.pp} "
            f"dp{p.dp} mbs{p.micro_batch_size} z{int(p.zero)} {p.recompute.value} v{p.virtual_stages}",
            flush=True,
        )


if __name__ == "__main__":
    network_awareness()
    korthikanti()
