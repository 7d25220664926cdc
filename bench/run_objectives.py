"""The whole run under each objective: for a model and a cluster, plan a device range once per objective
(search/sizes.py: sizes whose floor cannot win are skipped, so each objective plans its own sizes) and print,
per objective, the chosen device count, days, goodput, GPU-hours and MWh, with the CPU time of that range.
Usage:

    python3 bench/run_objectives.py MODEL CLUSTER TOKENS GLOBAL_BATCH SEQ_LEN LOW..HIGH
"""

from __future__ import annotations

import sys
import time

from nestplan import api
from nestplan.search.sizes import Limits, Objective, plan_sizes, range_sizes
from nestplan.search.space import SearchSpace


def main(argv: list[str]) -> None:
    model, cluster, tokens, batch, seq, bounds = argv
    low, high = (int(x) for x in bounds.split(".."))
    spec, cl = api.resolve_model(model), api.resolve_cluster(cluster)
    job = api.job_for(spec, cl, int(batch), int(seq))
    length = api.run_length(float(tokens))
    sizes = range_sizes(low, high, cl)
    for objective in Objective:
        start = time.process_time()
        choice = plan_sizes(spec, cl, job, SearchSpace(), sizes, length, objective, Limits())
        cpu = time.process_time() - start
        run = choice.chosen.run
        planned = sum(not row.skipped for row in choice.rows)
        mwh = "-" if run.energy_MWh is None else f"{run.energy_MWh:,.0f}"
        print(
            f"| {model} | {cluster} | {objective} | {choice.chosen.devices:,} | {run.days:.1f} | "
            f"{run.reliability.goodput:.1%} | {run.gpu_hours / 1e6:.2f} M | {mwh} | {cpu:.1f} s "
            f"({planned} of {len(sizes)} sizes) | {choice.chosen.plan_text} |",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
