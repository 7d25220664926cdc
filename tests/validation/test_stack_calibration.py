"""The calibration profiles the catalog ships (src/nestplan/catalog/profiles/), each made by `nestplan calibrate`
from a published runs file (../shared/reference/measured/, README there; skipped with a reason where the folder
is absent), checked the way a user would trust them: each row predicted by a fit that left its model out.

Issue 26's targets are stated beside what nestplan reaches today (the bounds: a change that makes it worse
fails); where a target is missed the docstring of its bound says so:
- DGX H100, NeMo: BF16 median <= 2.5% and max <= 8% (met); FP8 median <= 4% (met), max <= 12% (missed: Llama 3.1
  405B's proxy at 96 GPUs is predicted 15% slow, GPT-3 175B at 1,024 GPUs 13% fast);
- GB200 NVL72, NeMo: median <= 5%, max <= 12% (missed: with three models, leaving one out fits on two; fitted on
  all three, median 3.5% and max 11.4%);
- PyTorch FSDP (llm-foundry), per accelerator: median <= 6% (met on A100 40GB and 80GB, missed on H100: 7.1%), max
  <= 15% (missed: 27-31% on A100 from two rows the source itself marks as outliers, 19% on H100).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from nestplan.calibrate import calibrate, evaluable
from nestplan.catalog import profile_file
from nestplan.profile import read_profile
from nestplan.validate import validate

MEASURED = Path(__file__).resolve().parents[3] / "shared" / "reference" / "measured"
# (file, accelerator, framework, precision or None): (median bound, max bound) of the leave-one-model-out |error|
CASES = {
    ("dgxc_benchmarking_h100_v24.11.json", "h100-sxm-80gb", "nemo", "bf16"): (0.025, 0.08),
    ("dgxc_benchmarking_h100_v24.11.json", "h100-sxm-80gb", "nemo", "fp8"): (0.04, 0.16),
    ("dgxc_benchmarking_gb200_v25.05.json", "gb200", "nemo", None): (0.12, 0.18),
    ("llmfoundry_mpt_fsdp.json", "a100-40gb", "fsdp", None): (0.06, 0.33),
    ("llmfoundry_mpt_fsdp.json", "a100-80gb", "fsdp", None): (0.045, 0.28),
    ("llmfoundry_mpt_fsdp.json", "h100-sxm-80gb", "fsdp", None): (0.08, 0.20),
}


def _fit(name: str, accelerator: str):
    path = MEASURED / name
    if not path.exists():
        pytest.skip(f"the published runs are not here ({path}): the workspace's shared folder is absent")
    return calibrate(evaluable(validate(path)), accelerator=accelerator)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES, key=str), ids=lambda c: f"{c[1]}-{c[2]}-{c[3] or 'all'}")
def test_leave_one_model_out_error(case) -> None:
    name, accelerator, framework, precision = case
    fit = _fit(name, accelerator)
    assert fit.profile.framework.value == framework
    precisions = {r.id: r.precision for r in evaluable(validate(MEASURED / name)) if r.id in set(fit.ids)}
    errors = [abs(e) for i, e in zip(fit.ids, fit.error_held_out) if precision is None or precisions[i] == precision]
    median_bound, max_bound = CASES[case]
    assert statistics.median(errors) <= median_bound and max(errors) <= max_bound
    # the fit never does worse than the published figures on the rows it was fitted on
    before = statistics.median(abs(e) for e in fit.error_before)
    assert statistics.median(abs(e) for e in fit.error_after) <= before


@pytest.mark.slow
@pytest.mark.parametrize("name, accelerator", sorted({(c[0], c[1]) for c in CASES}))
def test_the_catalog_profile_is_the_fit_of_its_file(name, accelerator) -> None:
    """The catalog's profile is what `nestplan calibrate` makes of the published file: same factors."""
    fit = _fit(name, accelerator)
    shipped = read_profile(profile_file(accelerator, fit.profile.framework.value))
    for f in fit.fits:
        assert shipped.factor(f.factor.name) == pytest.approx(f.value, rel=1e-6)
    assert shipped.rows == fit.profile.rows and shipped.models == fit.profile.models
