"""The framework a job runs: presets of run settings, kernels, calibration profiles and their trust band."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nestplan.calibrate import _bounded_ridge
from nestplan.cluster import load_cluster
from nestplan.cost.kernels import (
    FLASH1_OVER_FLASH2,
    FLASH2_HOPPER_FORWARD,
    Kernels,
    attention_kernel,
    relative_attention_speed,
)
from nestplan.errors import ConfigError
from nestplan.hardware.accelerator import Architecture
from nestplan.profile import FACTOR_NAMES, Profile, apply_profile, calibrated_cluster, is_tie, read_profile, trust_band
from nestplan.settings import FRAMEWORK_PRESETS, AttentionKernel, Framework, RunSettings


def test_a_framework_brings_its_presets_and_a_given_setting_wins() -> None:
    nemo = RunSettings.from_mapping({"framework": "nemo"})
    assert nemo.grad_dtype == "bf16" and nemo.tp_comm_overlap
    assert RunSettings.from_mapping({"framework": "nemo", "grad_dtype": "fp32"}).grad_dtype == "fp32"
    assert RunSettings.from_mapping({}).framework is Framework.MEGATRON
    assert set(FRAMEWORK_PRESETS) == set(Framework)


def test_each_framework_runs_its_attention_kernel() -> None:
    assert attention_kernel(RunSettings(framework=Framework.NEMO)) is AttentionKernel.CUDNN
    assert attention_kernel(RunSettings(framework=Framework.FSDP)) is AttentionKernel.FLASH2
    named = RunSettings(framework=Framework.FSDP, attention_kernel=AttentionKernel.FLASH1)
    assert attention_kernel(named) is AttentionKernel.FLASH1


def test_kernel_speeds_follow_their_published_comparisons() -> None:
    # FlashAttention-3 is 1.5-2.0x FlashAttention-2 forward on H100; FlashAttention-2 ~2x FlashAttention
    assert relative_attention_speed(AttentionKernel.FLASH2, Architecture.HOPPER)[0] == FLASH2_HOPPER_FORWARD
    assert 1 / 2.0 <= FLASH2_HOPPER_FORWARD <= 1 / 1.5
    flash1 = relative_attention_speed(AttentionKernel.FLASH1, Architecture.AMPERE)
    assert flash1 == (FLASH1_OVER_FLASH2, FLASH1_OVER_FLASH2)
    with pytest.raises(ConfigError, match="flash3 does not run on ampere"):
        relative_attention_speed(AttentionKernel.FLASH3, Architecture.AMPERE)


def test_a_slower_kernel_and_eager_elementwise_make_a_step_slower() -> None:
    from nestplan.api import evaluate, job_for
    from nestplan.model import load_model
    from nestplan.strategy.dims import ParallelDims

    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", 8)
    plan = ParallelDims(tp=1, pp=1, dp=8, zero=1, recompute="selective")
    steps = {
        fw: evaluate(model, cluster, plan, job_for(model, cluster, 64, 8192, framework=fw), profile="none").step_time_s
        for fw in ("megatron", "fsdp")
    }
    assert steps["fsdp"] > 1.05 * steps["megatron"]
    assert Kernels.of(RunSettings(framework=Framework.FSDP), cluster.accelerator).eager


PROFILE = """
accelerator = "h100-sxm-80gb"
framework = "nemo"
source = "a test"
[factors]
gemm = 0.9
attention = 0.5
collective = 0.8
[validation]
median_error = 0.03
max_error = 0.09
rows = 12
models = 3
"""


def test_a_profile_scales_the_figures_it_names_once(tmp_path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(PROFILE)
    profile = read_profile(path)
    cluster = load_cluster("dgx-h100", 16)
    calibrated = apply_profile(cluster, profile)
    acc, base = calibrated.accelerator, cluster.accelerator
    assert math.isclose(acc.matmul_efficiency, 0.9 * base.matmul_efficiency)
    assert acc.attention_factor == 0.5 and acc.memory_efficiency == base.memory_efficiency
    for lv, old in zip(calibrated.topology.levels, cluster.topology.levels):
        assert math.isclose(lv.bus_efficiency, min(1.0, 0.8 * old.bus_efficiency))
    assert apply_profile(calibrated, profile) is calibrated  # never applied twice
    again = read_profile(_written(tmp_path, profile))  # round trip
    assert all(again.factor(n) == profile.factor(n) for n in FACTOR_NAMES) and again.rows == profile.rows


def _written(tmp_path, profile: Profile):
    out = tmp_path / "again.toml"
    out.write_text(profile.to_toml())
    return out


def test_a_profile_is_refused_on_another_accelerator_or_framework(tmp_path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(PROFILE)
    with pytest.raises(ConfigError, match="calibrated on h100-sxm-80gb"):
        calibrated_cluster(load_cluster("dgx-a100", 8), Framework.NEMO, path)
    with pytest.raises(ConfigError, match="calibrated on nemo runs"):
        calibrated_cluster(load_cluster("dgx-h100", 8), Framework.FSDP, path)
    assert calibrated_cluster(load_cluster("dgx-h100", 8), Framework.MEGATRON, path).accelerator.calibration


def test_unknown_profile_keys_are_refused_by_name(tmp_path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(PROFILE.replace("gemm = 0.9", "gemmm = 0.9"))
    with pytest.raises(ConfigError, match="gemmm"):
        read_profile(path)


def test_the_trust_band_and_ties() -> None:
    cluster = load_cluster("dgx-h100", 8)
    band = trust_band(None, "h100-sxm-80gb", Framework.TORCHTITAN)
    assert not band["validated"] and "not validated" in band["note"]
    assert not is_tie(1.0, 1.0, band)
    profile = Profile("p", "h100-sxm-80gb", Framework.NEMO, {}, 0.03, 0.09, 12, 3)
    cal = apply_profile(cluster, profile).accelerator.calibration
    band = trust_band(cal, "h100-sxm-80gb", Framework.NEMO)
    assert band["validated"] and band["median_error"] == 0.03
    assert is_tie(1.02, 1.0, band) and not is_tie(1.04, 1.0, band)


def test_the_bounded_ridge_solves_and_respects_bounds() -> None:
    J = np.array([[1.0], [1.0], [1.0]])
    r = np.array([-0.2, -0.2, -0.2])  # predicted 20% below measured in log: the factor should fall
    x = _bounded_ridge(J, r, np.zeros(1), np.array([1e6]), np.array([-1.0]), np.array([1.0]))
    assert math.isclose(x[0], 0.2, rel_tol=1e-6)
    x = _bounded_ridge(J, r, np.zeros(1), np.array([1e6]), np.array([-1.0]), np.array([0.1]))
    assert x[0] == 0.1
    x = _bounded_ridge(J, r, np.zeros(1), np.array([0.01]), np.array([-1.0]), np.array([1.0]))
    assert abs(x[0]) < 0.01  # a tight prior keeps the factor near 1


def test_a_name_from_a_file_never_becomes_a_profile_path() -> None:
    from nestplan.catalog import profile_file

    assert profile_file("h100-sxm-80gb", "nemo") is not None
    for name in ("../profiles/h100-sxm-80gb", "h100-sxm-80gb/..", ".hidden", "a\\b", "H100 SXM"):
        assert profile_file(name, "nemo") is None


def test_a_sweep_spec_sweeps_frameworks_and_keeps_megatron_keys() -> None:
    from nestplan.sweep.spec import expand, spec_from_dict

    base = {"models": ["llama3-8b"], "devices": [16], "clusters": [{"base": "dgx-h100"}]}
    (only,) = expand(spec_from_dict(base))
    both = expand(spec_from_dict(base | {"frameworks": ["megatron", "fsdp"]}))
    assert [c.framework for c in both] == ["megatron", "fsdp"]
    assert both[0].key == only.key and both[1].key != only.key  # earlier stores keep their keys
    with pytest.raises(ConfigError, match="frameworks"):
        spec_from_dict(base | {"frameworks": ["megatorn"]})


def test_compare_costs_every_plan_on_the_framework_given() -> None:
    from nestplan.api import CompareCase, compare

    rows = {
        fw: compare([CompareCase("llama3-8b", "dgx-h100", (16,), framework=fw)], ("manual",), 64)[0].rows
        for fw in (Framework.MEGATRON, Framework.FSDP)
    }
    manual = {fw: next(r for r in found if r.planner == "manual") for fw, found in rows.items()}
    assert manual[Framework.FSDP].tokens_per_s < manual[Framework.MEGATRON].tokens_per_s
