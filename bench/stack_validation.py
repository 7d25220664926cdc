"""Per published runs file (../shared/reference/measured/ by default): the error of the published figures,
of the profile `nestplan calibrate` fits (on every row) and of that fit when each model is left out, per
(accelerator, framework) and precision, with the factors and CPU time. Prints a Markdown table
(docs/validation.md quotes it).

    python3 bench/stack_validation.py [MEASURED_FOLDER]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from nestplan.calibrate import calibrate, evaluable
from nestplan.validate import validate

FILES = ("dgxc_benchmarking_h100_v24.11.json", "dgxc_benchmarking_gb200_v25.05.json", "llmfoundry_mpt_fsdp.json")


def _stats(errors: list[float]) -> str:
    magnitudes = [abs(e) for e in errors]
    return f"{statistics.median(magnitudes):.1%} / {max(magnitudes):.1%}"


def main(folder: Path) -> None:
    print(
        "| file | accelerator, framework | precision | rows | published figures | calibrated | left out | factors | CPU s |"
    )
    print("|---|---|---|---:|---|---|---|---|---:|")
    for name in FILES:
        runs = evaluable(validate(folder / name))
        for acc, fw in sorted({(r.cluster.accelerator.name, r.job.settings.framework) for r in runs}, key=str):
            start = time.process_time()
            fit = calibrate(runs, accelerator=acc, framework=fw)
            cpu = time.process_time() - start
            precision = {r.id: r.precision for r in runs}
            factors = ", ".join(f"{f.factor.name} {f.value:.3f}" for f in fit.fits if f.informative)
            for label in ("all", *sorted({precision[i] for i in fit.ids})):
                chosen = [k for k, i in enumerate(fit.ids) if label == "all" or precision[i] == label]
                pick = lambda errors: [errors[k] for k in chosen]  # noqa: E731
                print(
                    f"| {name} | {acc}, {fw.value} | {label} | {len(chosen)} | {_stats(pick(fit.error_before))} | "
                    f"{_stats(pick(fit.error_after))} | {_stats(pick(fit.error_held_out))} | "
                    f"{factors if label == 'all' else ''} | {cpu if label == 'all' else 0:.1f} |"
                )


if __name__ == "__main__":
    default = Path(__file__).resolve().parents[2] / "shared" / "reference" / "measured"
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else default)
