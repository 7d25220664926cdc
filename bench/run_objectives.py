"""The whole run under each objective: for a model and a cluster, plan every size of a device range once
(search/sizes.py) and print, per objective, the chosen device count, days, goodput, GPU-hours and MWh,
with the CPU time of the range. Usage:

    python3 bench/run_objectives.py MODEL CLUSTER TOKENS GLOBAL_BATCH SEQ_LEN LOW..HIGH
"""

from __future__ import annotations

import sys
import time

from nestplan import api
from nestplan.search.sizes import Limits, Objective, objective_value, plan_sizes, range_sizes
from nestplan.search.space import SearchSpace


def main(argv: list[str]) -> None:
    model, cluster, tokens, batch, seq, bounds = argv
    low, high = (int(x) for x in bounds.split(".."))
    spec, cl = api.resolve_model(model), api.resolve_cluster(cluster)
    job = api.job_for(spec, cl, int(batch), int(seq))
    length = api.run_length(float(tokens))
    start = time.process_time()
    choice = plan_sizes(spec, cl, job, SearchSpace(), range_sizes(low, high, cl), length, Objective.TIME, Limits())
    cpu = time.process_time() - start
    valid = [row for row in choice.rows if row.run is not None]
    print(f"{model} on {cluster}, {float(tokens):.3g} tokens: {len(choice.rows)} sizes in {cpu:.1f} s CPU")
    for row in choice.rows:
        print(f"  {row.devices:>6} {row.plan_text:<44} {row.note or ''} cpu {row.cpu_s:.1f} s")
    for objective in Objective:
        best = min(valid, key=lambda row: (objective_value(row.run, objective), row.devices))
        run = best.run
        mwh = "-" if run.energy_MWh is None else f"{run.energy_MWh:,.0f}"
        print(
            f"| {model} | {cluster} | {objective} | {best.devices:,} | {run.days:.1f} | "
            f"{run.reliability.goodput:.1%} | {run.gpu_hours / 1e6:.2f} M | {mwh} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
