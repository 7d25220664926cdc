"""Time one evaluation (the issue asks for well under 50 ms).

Run: python bench/bench_evaluate.py
Prints the median and best wall time of ``nestplan.evaluate`` for a few plans.
"""

from __future__ import annotations

import statistics
import time

from nestplan import api
from nestplan.job import Job
from nestplan.strategy.dims import ParallelDims

CASES = [
    ("gpt3-175b", "dgx-a100", 64, ParallelDims(tp=8, pp=8, recompute="full"), 64, 2048),
    ("llama3-70b", "h100-spine-leaf", 256, ParallelDims(tp=8, pp=4, dp=8, sp=True, recompute="selective"), 4096, 4096),
    ("mixtral-8x7b", "h100-spine-leaf", 128, ParallelDims(tp=1, pp=8, dp=4, ep=4, recompute="full"), 4096, 4096),
    ("korthikanti-1t", "dgx-a100", 512, ParallelDims(tp=8, pp=64, sp=True, recompute="selective"), 512, 2048),
    (
        "llama3.1-405b",
        "llama3-h100",
        16384,
        ParallelDims(tp=8, pp=16, dp=128, sp=True, recompute="selective", layers_per_stage=(7,) + (8,) * 14 + (7,)),
        2048,
        8192,
    ),
]


def main(repeats: int = 30) -> None:
    print(f"{'model':16s} {'cluster':16s} {'devices':>7s} {'median ms':>10s} {'best ms':>8s}")
    for model_name, cluster_name, devices, dims, gbs, seq in CASES:
        model = api.resolve_model(model_name)
        cluster = api.resolve_cluster(cluster_name, devices)
        job = Job(global_batch_size=gbs, seq_len=seq)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            api.evaluate(model, cluster, dims, job)
            times.append(time.perf_counter() - start)
        print(
            f"{model_name:16s} {cluster_name:16s} {devices:7d} {statistics.median(times) * 1e3:10.2f} "
            f"{min(times) * 1e3:8.2f}"
        )


if __name__ == "__main__":
    main()
