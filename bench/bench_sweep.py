"""Sweep throughput of the local executor: cases per second with 1 and 2 worker processes.

Run: python bench/bench_sweep.py
The same 36 small cases (BERT-Large and Llama 2 7B on 8-32 H100s, 9 network variants) run
into fresh stores with --workers 1 and --workers 2; prints cases/s and the ratio.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from nestplan import api

SPEC = """
name = "bench"
models = ["bert-large", "llama2-7b"]
devices = [8, 16]
global_batch_size = [64]
seq_len = [512]
[[clusters]]
base = "h100-spine-leaf"
[clusters.set]
"spine.size" = 8
[clusters.sweep]
"spine.oversubscription" = [1, 2, 4]
"leaf.size" = [1, 2, 4]
"""


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.toml"
        spec.write_text(SPEC)
        rates = {}
        for workers in (1, 2):
            start = time.perf_counter()
            summary = api.sweep(spec, Path(tmp) / f"w{workers}", workers=workers)
            elapsed = time.perf_counter() - start
            rates[workers] = summary.finished / elapsed
            print(f"workers {workers}: {summary.finished} cases in {elapsed:.2f} s = {rates[workers]:.2f} cases/s")
        print(f"speed-up with 2 workers: {rates[2] / rates[1]:.2f}x")


if __name__ == "__main__":
    main()
