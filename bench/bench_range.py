"""How long `nestplan plan --devices-range 64..16384` takes: CPU and wall seconds of the whole command (a
fresh process: imports, every size planned, the chosen plan rendered), per model and cluster, for one
source tree or two (before and after, with their ratios). Usage:

    python3 bench/bench_range.py [--before SRC] [--after SRC] [--case MODEL:CLUSTER:TOKENS ...]

SRC is a folder holding the nestplan package (default: this checkout's src); the command runs with it on
PYTHONPATH. CPU is the child's user + system time (getrusage of children), so other processes sharing the
machine change the wall time but not the CPU.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

CASES = (  # Llama 3.1 70B's architecture is Llama 3 70B's (at its 8,192-token context)
    "llama3-70b:dgx-h100:15e12",
    "llama3-70b:gb200-nvl72:15e12",
    "deepseek-v3:dgx-h100:14.8e12",
    "deepseek-v3:gb200-nvl72:14.8e12",
)
RANGE = "64..16384"


def run_once(src: Path, model: str, cluster: str, tokens: str) -> tuple[float, float, str]:
    """(CPU s, wall s, the command's last line) of one plan over the range."""
    command = [sys.executable, "-m", "nestplan", "plan", "--model", model, "--cluster", cluster]
    command += ["--seq-len", "8192", "--tokens", tokens, "--devices-range", RANGE, "--top", "1"]
    env = os.environ | {"PYTHONPATH": str(src)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return cpu, wall, lines[-1] if lines else f"exit {done.returncode}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path)
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[1] / "src")
    parser.add_argument("--case", action="append", help="MODEL:CLUSTER:TOKENS (default: the four of issue 28)")
    args = parser.parse_args()
    for case in args.case or CASES:
        model, cluster, tokens = case.split(":")
        figures = []
        for label, src in (("before", args.before), ("after", args.after)):
            if src is None:
                continue
            cpu, wall, last = run_once(src, model, cluster, tokens)
            figures.append((cpu, wall))
            print(f"{model} {cluster} {label}: cpu {cpu:.1f} s, wall {wall:.1f} s  ({last[:90]})", flush=True)
        if len(figures) == 2:
            (cpu0, wall0), (cpu1, wall1) = figures
            print(
                f"{model} {cluster} ratio before/after: cpu {cpu0 / cpu1:.1f}x, wall {wall0 / wall1:.1f}x", flush=True
            )


if __name__ == "__main__":
    main()
