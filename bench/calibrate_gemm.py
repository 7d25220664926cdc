"""Calibrate an accelerator's two GEMM ceilings on measured runs whose step is compute alone.

Run: python bench/calibrate_gemm.py RUNS.json BF16_ROWS FP8_ROWS
  e.g. python bench/calibrate_gemm.py ../shared/reference/measured/dgxc_benchmarking_h100_v24.11.json \
           llama3.1-8b-bf16 llama3.1-8b-fp8
Rows are those whose id contains BF16_ROWS (resp. FP8_ROWS). The catalog's matmul_efficiency (the
large-GEMM ceiling, a fraction of the bf16 dense peak) is found by bisection so that the BF16 rows'
mean error is zero; then fp8_matmul_efficiency (of the FP8 peak) so that the FP8 rows' is. The
rows should be ones no other factor explains: Llama 3.1 8B on DGX H100 runs tp 1, pp 1 (no tensor
or pipeline traffic; context parallelism's ring hides under attention, the data-parallel reduction
under the backward pass), so its step is its compute.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys

from nestplan.cost.evaluator import evaluate_plan
from nestplan.validate import Run, read_runs, run_from_row


def mean_error(runs: list[Run], matmul: float, fp8: float | None) -> float:
    errors = []
    for run in runs:
        acc = dataclasses.replace(run.cluster.accelerator, matmul_efficiency=matmul, fp8_matmul_efficiency=fp8)
        pred = evaluate_plan(
            run.model, dataclasses.replace(run.cluster, accelerator=acc), run.dims, run.job, run.axis_order
        )
        errors.append(run.measured_step_s / pred.step_time_s - 1)
    return statistics.fmean(errors)


def bisect(error_of, low: float = 0.2, high: float = 1.0) -> float:
    """The efficiency in [low, high] at which the mean error is zero (the error, predicted throughput over
    measured, falls with the efficiency)."""
    for _ in range(40):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if error_of(mid) < 0 else (low, mid)
    return 0.5 * (low + high)


def main() -> None:
    path, bf16_rows, fp8_rows = sys.argv[1:4]
    runs = [run_from_row(row, label) for label, row in read_runs(path) if not isinstance(row, Exception)]
    bf16 = [r for r in runs if bf16_rows in r.id]
    fp8 = [r for r in runs if fp8_rows in r.id]
    matmul = bisect(lambda e: mean_error(bf16, e, None))
    fp8_matmul = bisect(lambda e: mean_error(fp8, matmul, e))
    print(f"matmul_efficiency = {matmul:.3f}   ({len(bf16)} rows containing '{bf16_rows}')")
    print(f"fp8_matmul_efficiency = {fp8_matmul:.3f}   ({len(fp8)} rows containing '{fp8_rows}')")


if __name__ == "__main__":
    main()
