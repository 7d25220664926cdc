"""Validation against NVIDIA's DGX Cloud benchmarking recipes, release v24.11.1 (NeMo 24.09/24.11 on
DGX H100): 88 published step times of Llama 3.1 8B/70B/405B, Nemotron-4 15B/340B, GPT-3 175B and
Grok-1 314B, BF16 and FP8, 8-2,304 GPUs (github.com/NVIDIA/dgxc-benchmarking, tag v24.11.1; the
rows with their configuration as run: ../shared/reference/measured/dgxc_benchmarking_h100_v24.11.json,
read through `nestplan validate`'s reader, skipped with a reason where the folder is absent). Each row
is evaluated as the recipe ran it: the settings the shared file does not carry per row (FP8 parameters,
Grok-1's tp overlap, the optimizer's state) are added from the recipes by dgxc_recipes.py, which cites
where each is set.

Two factors were calibrated on ten of these rows (the Hopper GEMM ceilings, on Llama 3.1 8B at tp 1:
catalog/accelerators.toml, bench/calibrate_gemm.py); every other row is a prediction. The bounds
below are what nestplan reaches today, so that a change that makes it worse fails; issue 14's
targets (median |error| <= 5% and max <= 12% per precision, tp 1/4/8 means within 4 points) are
stated beside them: BF16 meets them; FP8 does not (Grok-1, a mixture of experts, is predicted
8-17% fast, GPT-3 at 1,024 GPUs 16% fast, Llama 3.1 405B's 21-layer proxy 11.5% slow).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from dgxc_recipes import rows_as_run

from nestplan.validate import RowResult, validate

RUNS = Path(__file__).resolve().parents[3] / "shared" / "reference" / "measured" / "dgxc_benchmarking_h100_v24.11.json"

# precision: (median |error| bound, max |error| bound): BF16 meets the targets (0.05 and 0.12) with
# room (median 2.7%, max 9.0%); FP8 does not (median 6.0%; Grok-1's 2-layer proxy at 8 GPUs is 17.1% fast)
BOUNDS = {"bf16": (0.03, 0.10), "fp8": (0.065, 0.18)}
CALIBRATED = "llama3.1-8b"  # the rows the two GEMM ceilings were calibrated on


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[RowResult]:
    if not RUNS.exists():
        pytest.skip(f"the published runs are not here ({RUNS}): the NEST workspace's shared folder is absent")
    as_run = tmp_path_factory.mktemp("runs") / "as_run.json"
    as_run.write_text(json.dumps(rows_as_run(RUNS)))
    return validate(as_run)


def test_every_published_run_is_expressible_and_fits(results) -> None:
    """Every row evaluates with the flags nestplan has, and every configuration that ran is predicted to fit."""
    assert len(results) == 88
    assert [r.problem for r in results if r.run is None] == []
    assert [r.id for r in results if not r.fits] == []


def test_the_shared_rows_as_given_still_evaluate() -> None:
    """The shared file itself, without the recipe settings it lacks, is read and evaluated row by row."""
    if not RUNS.exists():
        pytest.skip(f"the published runs are not here ({RUNS})")
    assert [r.problem for r in validate(RUNS) if r.run is None] == []


@pytest.mark.parametrize("precision", sorted(BOUNDS))
def test_error_per_precision(results, precision) -> None:
    errors = [abs(r.error) for r in results if r.run.precision == precision]
    median_bound, max_bound = BOUNDS[precision]
    assert len(errors) == 44
    assert statistics.median(errors) <= median_bound
    assert max(errors) <= max_bound


def test_the_calibration_rows_are_matched(results) -> None:
    """The ceilings were chosen so that these rows' mean error is zero, per precision."""
    for precision in BOUNDS:
        errors = [r.error for r in results if CALIBRATED in r.id and r.run.precision == precision]
        assert len(errors) == 5 and abs(statistics.fmean(errors)) < 0.005


def test_dense_models_off_the_calibration_rows(results) -> None:
    """Dense models other than the calibration rows: median |error| within 4%, every row within 17%."""
    errors = [abs(r.error) for r in results if CALIBRATED not in r.id and r.run.model.num_experts == 0]
    assert len(errors) == 60
    assert statistics.median(errors) <= 0.04
    assert max(errors) <= 0.17
