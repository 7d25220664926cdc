"""Time `nestplan nest-solve` on the NEST authors' 17 cases and on GPT-3 at 1,024 devices.

Reads ../shared/reference/nest-artifact-cases (next to the checkout). Prints one row per case:
nestplan's wall time (median of --repeat runs, one process, warm imports), the authors' solver
on a 2-core machine (`reference_dp_wall_s_2core`: -O2 build, default build), our
finalTimePerBatch relative to theirs, and the total.

    python bench/bench_nest_solve.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from nestplan import api

CASES = Path(__file__).resolve().parents[2] / "shared" / "reference" / "nest-artifact-cases"


def timed(source, repeat: int) -> tuple[float, dict]:
    walls, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        _, out, _ = api.nest_solve(source)
        walls.append(time.perf_counter() - start)
    return statistics.median(walls), out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if not (CASES / "index.json").exists():
        raise SystemExit(f"no artifact cases at {CASES}")
    rows = json.loads((CASES / "index.json").read_text())
    print(f"{'case':36s} {'nestplan s':>10s} {'authors s (O2, default)':>24s} {'ours / theirs - 1':>18s}")
    total, slowest = 0.0, 0.0
    for row in rows:
        wall, out = timed(CASES / row["case"] / "dp_input.json", args.repeat)
        total, slowest = total + wall, max(slowest, wall)
        ref = row["reference_dp_wall_s_2core"]
        ref_text = "-" if ref is None else ", ".join("-" if x is None else f"{x:g}" for x in ref)
        rel = out["finalTimePerBatch"] / row["finalTimePerBatch"] - 1
        print(f"{row['case']:36s} {wall:10.3f} {ref_text:>24s} {rel:+18.2e}")
    print(f"{'all 17':36s} {total:10.3f}   (slowest {slowest:.3f} s)")
    raw = json.loads((CASES / "tpuv4_fatTree_gpt3_256_mbs1_seq" / "dp_input.json").read_text())
    raw["devices_per_level"], raw["maxDevices"] = [8, 4, 32], 1024
    wall, out = timed(raw, args.repeat)
    print(
        f"{'gpt3 at 1024 devices ([8, 4, 32])':36s} {wall:10.3f} {'3 h 42 min (paper)':>24s} "
        f"finalTimePerBatch {out['finalTimePerBatch']:.6g}, t {out['tensorParallelDegree']}, "
        f"d {out['dataParallelDegree']}, p {len(out['stages'])}"
    )


if __name__ == "__main__":
    main()
