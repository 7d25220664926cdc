"""Calibration profiles: a few named, physically meaningful factors for one (accelerator, framework),
fitted on measured runs by ``nestplan calibrate`` (nestplan.calibrate) and applied with ``--profile``.

A factor multiplies a figure the cost model already has (1 = the figure as published):

==================  ===========================================================================
gemm                the GEMM ceiling (``matmul_efficiency``): cuBLAS's kernels, the clock a chip
                    sustains at its power limit, the SMs overlapped collectives take
fp8_gemm            the FP8 GEMM ceiling (``fp8_matmul_efficiency``)
attention           every attention kernel's speed (``attention_factor``): the kernel as the
                    framework builds and launches it
memory              the HBM efficiency of memory-bound kernels (``memory_efficiency``)
collective          every network level's bus efficiency (NCCL's achieved bus bandwidth)
==================  ===========================================================================

A profile file (TOML)::

    accelerator = "h100-sxm-80gb"     # the catalog name of the accelerator it was fitted on
    framework = "nemo"                # nestplan.settings.Framework
    source = "nestplan calibrate RUNS.json: 44 rows"
    [factors]                          # each optional, default 1
    gemm = 0.98
    [validation]                       # leave-one-model-out |error| of the fit (the trust band)
    median_error = 0.021
    max_error = 0.071
    rows = 44
    models = 5

The catalog ships the profiles calibrated on the published runs (catalog/profiles/, made by
``nestplan calibrate``: docs/validation.md says which rows); one applies to a job on its accelerator
and framework unless ``--profile`` names another. Megatron-LM runs the kernels NeMo does (Megatron-Core
with Transformer Engine), so a ``nemo`` profile serves ``megatron`` jobs too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Union

from nestplan.catalog import profile_file
from nestplan.cluster import Cluster
from nestplan.errors import ConfigError, printable
from nestplan.hardware.accelerator import ATTENTION_FACTOR_RANGE, Calibration
from nestplan.inputs import Fields, load_object
from nestplan.settings import Framework


@dataclass(frozen=True)
class Factor:
    """One calibrated factor: its name, its bounds (a physical range around 1) and the spread of the prior
    that pulls it toward 1 (the published figure), as a fraction (0.15: a 15% change costs as much as a
    one-sigma error on a row)."""

    name: str
    low: float
    high: float
    prior: float
    help: str


FACTORS: tuple[Factor, ...] = (
    Factor("gemm", 0.5, 1.3, 0.15, "GEMM ceiling (matmul_efficiency)"),
    Factor("fp8_gemm", 0.4, 1.5, 0.2, "FP8 GEMM ceiling (fp8_matmul_efficiency)"),
    Factor("attention", 0.25, 1.6, 0.3, "attention kernels' speed (attention_factor)"),
    Factor("memory", 0.5, 1.2, 0.15, "HBM efficiency of memory-bound kernels (memory_efficiency)"),
    Factor("collective", 0.5, 1.2, 0.15, "bus efficiency of every network level"),
)
FACTOR_NAMES = tuple(f.name for f in FACTORS)
# the frameworks whose kernels a profile of another framework also describes
SHARED_KERNELS = {Framework.MEGATRON: Framework.NEMO}
_KEYS = ("accelerator", "framework", "source", "factors", "validation")
_VALIDATION_KEYS = ("median_error", "max_error", "rows", "models")
MAX_ROWS = 10**6


@dataclass(frozen=True)
class Profile:
    """A calibration profile (module docstring); ``factors`` by name, each in its Factor's bounds."""

    name: str
    accelerator: str
    framework: Framework
    factors: Mapping[str, float]
    median_error: float
    max_error: float
    rows: int
    models: int
    source: str = ""

    def factor(self, name: str) -> float:
        return self.factors.get(name, 1.0)

    def serves(self, framework: Framework) -> bool:
        """Whether this profile describes ``framework``'s kernels: its own, or those it shares (SHARED_KERNELS)."""
        return self.framework is framework or SHARED_KERNELS.get(framework) is self.framework

    def to_toml(self) -> str:
        """The profile as a file (``read_profile`` reads it back)."""
        lines = [
            f"accelerator = {json.dumps(self.accelerator)}",
            f"framework = {json.dumps(self.framework.value)}",
            f"source = {json.dumps(self.source)}",
            "",
            "[factors]",
            *(f"{name} = {self.factor(name)!r}  # {f.help}" for name, f in zip(FACTOR_NAMES, FACTORS)),
            "",
            "[validation]  # leave-one-model-out |error| of predicted step times",
            f"median_error = {self.median_error!r}",
            f"max_error = {self.max_error!r}",
            f"rows = {self.rows}",
            f"models = {self.models}",
        ]
        return "\n".join(lines) + "\n"


def read_profile(path: str | Path, name: str | None = None) -> Profile:
    """A profile file, every field checked (unknown keys refused by name)."""
    label = printable(str(path))
    f = Fields(load_object(path, "profile", "toml"), f"profile '{label}'")
    f.refuse_unknown(_KEYS)
    factors = f.table("factors", {})
    factors.refuse_unknown(FACTOR_NAMES)
    values = {k.name: factors.number(k.name, k.low, k.high) for k in FACTORS if factors.has(k.name)}
    validation = f.table("validation")
    validation.refuse_unknown(_VALIDATION_KEYS)
    return Profile(
        name=name or Path(path).stem,
        accelerator=f.string("accelerator", maximum=200),
        framework=Framework(f.choice("framework", [fw.value for fw in Framework])),
        factors=MappingProxyType(values),
        median_error=validation.number("median_error", 0.0, 100.0),
        max_error=validation.number("max_error", 0.0, 100.0),
        rows=validation.integer("rows", MAX_ROWS, minimum=0),
        models=validation.integer("models", MAX_ROWS, minimum=0),
        source=f.string("source", "", blank=True),
    )


ProfileChoice = Union[str, Path, Profile, None]
NO_PROFILE = "none"  # --profile none: the published figures, no calibration


def calibrated_cluster(cluster: Cluster, framework: Framework, profile: ProfileChoice = None) -> Cluster:
    """``cluster`` with a calibration profile applied (nestplan.profile): ``profile`` (a Profile or a file),
    or without one the catalog's for its accelerator and ``framework``, if any; ``"none"`` applies none. A
    profile fitted on another framework's runs is refused (its kernels are not this job's)."""
    if isinstance(profile, str) and profile.strip().lower() == NO_PROFILE:
        return cluster
    if profile is None:
        chosen = catalog_profile(cluster.accelerator.name, framework)
        return cluster if chosen is None else apply_profile(cluster, chosen)
    chosen = profile if isinstance(profile, Profile) else read_profile(profile)
    if not chosen.serves(framework):
        raise ConfigError(
            f"profile '{printable(chosen.name)}' was calibrated on {chosen.framework.value} runs, and the job runs "
            f"{framework.value}",
            field="profile",
            value=chosen.framework.value,
            limit=framework.value,
        )
    return apply_profile(cluster, chosen)


@lru_cache(maxsize=None)
def catalog_profile(accelerator: str, framework: Framework) -> Profile | None:
    """The catalog's profile for ``accelerator`` under ``framework`` (or the framework whose kernels it
    shares), None where the published runs calibrate none; each read once (the catalog does not change)."""
    for fw in (framework, SHARED_KERNELS.get(framework)):
        if fw is None:
            continue
        path = profile_file(accelerator, fw.value)
        if path is not None:
            return read_profile(path, f"{accelerator}.{fw.value}")
    return None


def apply_profile(cluster: Cluster, profile: Profile) -> Cluster:
    """``cluster`` with ``profile``'s factors applied to its accelerator's figures and its levels' bus
    efficiencies (each at most 1), and the profile recorded (``Accelerator.calibration``); a cluster
    already calibrated is returned as it is, and a profile of another accelerator is refused."""
    acc = cluster.accelerator
    if acc.calibration is not None:
        return cluster
    if profile.accelerator != acc.name:
        raise ConfigError(
            f"profile '{printable(profile.name)}' was calibrated on {printable(profile.accelerator)}, "
            f"not on {acc.name} (cluster '{cluster.name}')",
            field="profile",
            value=profile.accelerator,
            limit=acc.name,
        )
    fp8 = acc.fp8_matmul_efficiency or acc.matmul_efficiency  # FP8 GEMMs at the BF16 ceiling unless stated
    calibrated = replace(
        acc,
        matmul_efficiency=min(1.0, acc.matmul_efficiency * profile.factor("gemm")),
        fp8_matmul_efficiency=min(1.0, fp8 * profile.factor("fp8_gemm")),
        memory_efficiency=min(1.0, acc.memory_efficiency * profile.factor("memory")),
        attention_factor=min(ATTENTION_FACTOR_RANGE[1], acc.attention_factor * profile.factor("attention")),
        calibration=Calibration(
            profile.name,
            profile.framework.value,
            profile.median_error,
            profile.max_error,
            profile.rows,
            profile.models,
        ),
    )
    topology = cluster.topology.with_bus_efficiency(profile.factor("collective"))
    return replace(cluster, accelerator=calibrated, topology=topology)


def trust_band(calibration: Calibration | None, accelerator: str, framework: Framework) -> dict[str, object]:
    """How far a prediction on ``accelerator`` under ``framework`` can be trusted: its calibration's
    leave-one-model-out |error| (median, max, over how many runs), or not validated where no runs back it."""
    if calibration is None:
        return {
            "validated": False,
            "note": f"not validated: no measured runs of {framework.value} on {accelerator} calibrate it",
        }
    return {
        "validated": True,
        "median_error": calibration.median_error,
        "max_error": calibration.max_error,
        "rows": calibration.rows,
        "models": calibration.models,
        "profile": calibration.name,
        "note": f"+/-{calibration.median_error:.1%} (leave-one-model-out median |error| over {calibration.rows} runs "
        f"of {calibration.models} models of {calibration.framework} on {accelerator}; max {calibration.max_error:.1%})",
    }


def is_tie(step_s: float, best_step_s: float, band: Mapping[str, object]) -> bool:
    """Whether a runner-up's step is within the best's trust band (the median |error|): a tie."""
    return bool(band.get("validated")) and step_s / best_step_s - 1.0 <= float(band["median_error"])
