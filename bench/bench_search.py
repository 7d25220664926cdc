"""The planner's speed as a user meets it: `nestplan plan` as a whole process, per case.

Run: python bench/bench_search.py [--repeat N]
Cases (issue 13's targets): every paper model on both paper clusters at 1,024 devices; Qwen3-235B-A22B
(bench/qwen3-235b-a22b.json, a config.json) on 512 GPUs of dgx-h100, global batch 2048 x 4096 tokens;
Llama 3.1 405B on llama3-h100 at 16,384 GPUs, 2048 x 8192; DeepSeek-V3 (dense then MoE blocks, folded
experts) on 576 GB200 NVL72, 2048 x 4096. Each case runs the CLI in a fresh
process; the table gives the best of N runs' wall seconds, that run's CPU seconds (user + system)
and their ratio, the largest peak RSS, and the search-space size from the CLI's search line
(configurations, groups, groups solved, pipeline-depth rows).
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

QWEN3 = str(Path(__file__).with_name("qwen3-235b-a22b.json"))
PAPER = [
    (m, c, 1024, 4096, 2048 if m == "gpt3-175b" else 4096)
    for m in ("llama2-7b", "llama3-70b", "gpt3-175b", "mixtral-8x7b")
    for c in ("tpuv4-fattree", "h100-spine-leaf")
]
CASES = PAPER + [
    (QWEN3, "dgx-h100", 512, 2048, 4096),
    ("llama3.1-405b", "llama3-h100", 16384, 2048, 8192),
    ("deepseek-v3", "gb200-nvl72", 576, 2048, 4096),
]
SEARCH_LINE = re.compile(
    r"search: .*?, ([\d,]+) configurations, ([\d,]+) groups \(([\d,]+) solved.*?\), "
    r"([\d,]+) pipeline depths"
)


def run_once(model: str, cluster: str, devices: int, batch: int, seq: int) -> tuple[float, float, float, str]:
    """(wall s, CPU s, peak RSS MiB, stdout) of one `nestplan plan` process."""
    args = [
        sys.executable,
        "-m",
        "nestplan",
        "plan",
        "--model",
        model,
        "--cluster",
        cluster,
        "--devices",
        str(devices),
        "--global-batch-size",
        str(batch),
        "--seq-len",
        str(seq),
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode:
        sys.exit(f"{' '.join(args)} failed:\n{out.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, after.ru_maxrss / 1024, out.stdout


def main() -> None:
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 3
    print(
        f"{'model':16s} {'cluster':16s} {'devices':>7s} {'wall s':>7s} {'CPU s':>6s} {'CPU/wall':>8s} "
        f"{'RSS MiB':>7s} {'configs':>7s} {'groups':>7s} {'solved':>6s} {'depths':>6s}"
    )
    for model, cluster, devices, batch, seq in CASES:
        runs = [run_once(model, cluster, devices, batch, seq) for _ in range(repeat)]
        wall, cpu, _, stdout = min(runs)
        rss = max(r[2] for r in runs)
        found = SEARCH_LINE.search(stdout.replace("\n", " "))
        size = [x.replace(",", "") for x in found.groups()] if found else ["?"] * 4
        name = Path(model).name.removesuffix(".json")[:16]
        print(
            f"{name:16s} {cluster:16s} {devices:7d} {wall:7.2f} {cpu:6.2f} {cpu / wall:8.2f} {rss:7.0f} "
            f"{size[0]:>7s} {size[1]:>7s} {size[2]:>6s} {size[3]:>6s}",
            flush=True,
        )


if __name__ == "__main__":
    main()
