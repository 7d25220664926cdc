"""Print nestplan's predictions next to Korthikanti et al. 2022 Table 5 (iteration time, DGX A100).

Run: python bench/validate_korthikanti.py
The same configurations and tolerances are asserted in tests/validation/test_korthikanti2022.py.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "validation"))

from nestplan import api  # noqa: E402
from test_korthikanti2022 import CONFIGS, TABLE5, _plan  # noqa: E402


def main() -> None:
    errors = []
    print(f"{'model':6s} {'mode':14s} {'published s':>12s} {'predicted s':>12s} {'error':>8s} {'MFU':>6s}")
    for mode, times in TABLE5.items():
        for name in CONFIGS:
            pred = api.evaluate(*_plan(name, mode))
            err = pred.step_time_s / times[name] - 1
            errors.append(abs(err))
            print(f"{name:6s} {mode:14s} {times[name]:12.2f} {pred.step_time_s:12.2f} {err:+8.1%} {pred.mfu:6.1%}")
    print(f"median |error| {statistics.median(errors):.1%}, max |error| {max(errors):.1%}")


if __name__ == "__main__":
    main()
