"""Tracing cost: a Llama 3 70B-shaped model, 2 blocks and all 80, under fake tensors.

Run: python bench/bench_trace.py
Each run is a fresh process (peak RSS = ru_maxrss); prints seconds, peak MiB and the per-block
FLOPs and saved bytes, which must not depend on the depth traced.
"""

from __future__ import annotations

import subprocess
import sys

CASE = r"""
import json, resource, sys, time
from nestplan.catalog import entry_path
from nestplan.model.trace import trace_config
layers = int(sys.argv[1])
start = time.perf_counter()
r = trace_config(json.load(open(entry_path("model", "llama3-70b"))), seq_len=2048, layers=layers)
b = r.blocks[0]
print(f"{layers:3d} blocks: {time.perf_counter() - start:6.2f} s, peak "
      f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:6.0f} MiB, block 0: "
      f"{b.flops:.4e} FLOP, {b.saved_bytes / 2**20:.1f} MiB saved")
"""


def main() -> None:
    for layers in (2, 80):
        out = subprocess.run([sys.executable, "-c", CASE, str(layers)], capture_output=True, text=True)
        print(out.stdout.strip() or out.stderr.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
