"""Sweep specification (TOML) and its expansion into cases.

    name = "codesign"
    models = ["gpt3-175b", "mixtral-8x7b"]     # catalog names or config.json paths
    devices = [256, 512, 1024]
    global_batch_size = [4096]                 # optional (default 4096)
    seq_len = [2048]                           # optional (default: the model's, at most 8192)
    hbm_GiB = [80]                             # optional: device memory replaces the accelerator's
    keep = ["breakdown", "memory"]             # optional: also store these parts of each plan JSON
    tokens = 15e12                             # optional (or steps = N): each case's whole run
    price_per_gpu_hour_usd = 2.0               # optional: the run's cost (and price_per_kwh_usd)

    [[clusters]]                               # one or more cluster families
    base = "h100-spine-leaf"                   # catalog name or cluster file
    label = "spine-leaf"                       # optional (default: base)
    accelerator = "h200-141gb"                 # optional: a catalog accelerator replacing the base's
    [clusters.set]                             # fixed level fields, "level.field" = value
    "spine.size" = 128
    [clusters.sweep]                           # swept level fields, "level.field" = [values]
    "spine.oversubscription" = [1, 2, 4, 8]
    "leaf.size" = [2, 4, 8]

A list may also be a range: {from = 256, to = 1024, times = 2} or {from = 1, to = 8, step = 1}.
Level fields are those of a cluster file's [[levels]] tables (size, bandwidth_GBps,
latency_us, oversubscription). Every case is keyed by a hash of its inputs and nestplan's
version, so a re-run finds the cases it already finished.

Work is bounded before anything runs: a range gives at most MAX_RANGE_VALUES values, a spec
at most MAX_CASES cases, every number is finite and within its MAX_* bound, every name free of
control characters; anything else is one ConfigError naming the key and the value.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nestplan.version import __version__
from nestplan.errors import brief, printable
from nestplan.inputs import Fields, load_object
from nestplan.cost.run import MAX_STEPS, MAX_TOKENS
from nestplan.hardware.facility import PRICE_PER_GPU_HOUR_RANGE, PRICE_PER_KWH_RANGE
from nestplan.job import MAX_GLOBAL_BATCH_SIZE, MAX_SEQ_LEN
from nestplan.network.topology import MAX_DEVICES  # largest device count swept: what one network holds
from nestplan.settings import Framework

RUN_KEYS = ("tokens", "steps", "price_per_gpu_hour_usd", "price_per_kwh_usd")  # one value each, for every case
TOP_KEYS = (
    "name",
    "models",
    "devices",
    "global_batch_size",
    "seq_len",
    "hbm_GiB",
    "keep",
    "clusters",
    "frameworks",
    *RUN_KEYS,
)
DEFAULT_FRAMEWORK = Framework.MEGATRON.value
KEEP_CHOICES = ("breakdown", "memory", "stages", "placement")  # parts of the plan JSON kept per case
CLUSTER_KEYS = ("base", "label", "accelerator", "set", "sweep")
LEVEL_FIELDS = ("size", "bandwidth_GBps", "latency_us", "oversubscription")
DEFAULT_GLOBAL_BATCH = 4096
MAX_CASES = 100_000  # cases one spec may expand to
MAX_RANGE_VALUES = 10_000  # values one {from, to, step|times} range may give
MAX_HBM_GiB = 2**20  # device memory
MAX_LEVEL_VALUE = 2**24  # any level field (units, GB/s, us or a ratio)


@dataclass(frozen=True)
class ClusterFamily:
    base: str
    label: str
    accelerator: str | None  # catalog name replacing the base's
    fixed: tuple[tuple[str, Any], ...]  # ("level.field", value)
    swept: tuple[tuple[str, tuple[Any, ...]], ...]


@dataclass(frozen=True)
class SweepSpec:
    name: str
    models: tuple[str, ...]
    devices: tuple[int, ...]
    global_batch_sizes: tuple[int, ...]
    seq_lens: tuple[int | None, ...]
    hbm_GiB: tuple[float | None, ...]
    clusters: tuple[ClusterFamily, ...]
    keep: tuple[str, ...] = ()
    run: tuple[tuple[str, float], ...] = ()  # RUN_KEYS given: the run's length and prices
    frameworks: tuple[str, ...] = (DEFAULT_FRAMEWORK,)  # the software each case runs on (settings.Framework)


@dataclass(frozen=True)
class Case:
    """One plan to find: every input that defines it, hashable and JSON-serialisable."""

    model: str
    cluster_base: str
    cluster_label: str
    accelerator: str | None
    overrides: tuple[tuple[str, Any], ...]  # "level.field" -> value, fixed and swept
    swept: tuple[str, ...]  # which overrides are swept (for reports)
    devices: int
    global_batch_size: int
    seq_len: int | None
    hbm_GiB: float | None
    run: tuple[tuple[str, float], ...] = ()  # the spec's run keys (none: the key of a case without a run)
    framework: str = DEFAULT_FRAMEWORK  # in the case's key only when another (earlier stores keep their keys)

    def inputs(self) -> dict[str, Any]:
        framework = {} if self.framework == DEFAULT_FRAMEWORK else {"framework": self.framework}
        return (
            ({"run": dict(self.run)} if self.run else {})
            | framework
            | {
                "model": self.model,
                "cluster": self.cluster_base,
                "label": self.cluster_label,
                "accelerator": self.accelerator,
                "overrides": {k: v for k, v in self.overrides},
                "swept": list(self.swept),
                "devices": self.devices,
                "global_batch_size": self.global_batch_size,
                "seq_len": self.seq_len,
                "hbm_GiB": self.hbm_GiB,
            }
        )

    @property
    def key(self) -> str:
        text = json.dumps({"inputs": self.inputs(), "version": __version__}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def _shown(value: Any) -> str:
    """A value as an error line quotes it: one line, at most 80 characters."""
    return brief(value, 80)


def _numbers(f: Fields, key: str, integer: bool, minimum: float, maximum: float) -> tuple:
    """``key``'s values as given (a list, a range or one value; at most ``MAX_RANGE_VALUES``), each a number
    in [minimum, maximum], whole where ``integer``."""
    values = f.many(key, MAX_RANGE_VALUES, expand=_range)
    for index, value in values.data.items():
        if not values.number(index, minimum, maximum).is_integer() and integer:
            raise values.error(
                f"field '{values.name(index)}' must be an integer, got {_shown(value)}",
                values.name(index),
                value,
                "an integer",
            )
    return tuple(values.data.values())


def _range(table: Fields) -> list[float]:
    """{from, to, step} (arithmetic) or {from, to, times} (geometric, from > 0), both ends included."""
    table.refuse_unknown(("from", "to", "step", "times"))
    lo, hi, step, times = (table.raw(key, None) for key in ("from", "to", "step", "times"))
    numbers = [x for x in (lo, hi, step, times) if x is not None]
    shown, key = _shown(dict(table.data)), table.where.rstrip(".")
    if (
        lo is None
        or hi is None
        or (step is None) == (times is None)
        or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in numbers)
        or hi < lo
        or (step is not None and step <= 0)
        or (times is not None and (times <= 1 or lo <= 0))
    ):
        raise table.error(
            f"'{key}' range {shown} needs from <= to and exactly one of step > 0 or times > 1 (with from > 0)",
            key,
            dict(table.data),
            "{from, to, step} or {from, to, times}",
        )
    out, x = [], lo
    while x <= hi or math.isclose(x, hi, rel_tol=1e-12):
        if len(out) == MAX_RANGE_VALUES:
            raise table.error(
                f"'{key}' range {shown} gives more than {MAX_RANGE_VALUES:,} values",
                key,
                dict(table.data),
                MAX_RANGE_VALUES,
            )
        out.append(x)
        x = x + step if step is not None else x * times
    return out


def _level_items(f: Fields, swept: bool) -> tuple:
    """The "level.field" entries of a family's ``set`` (one number each) or ``sweep`` (values each) table."""
    items = []
    for key in f.data:
        level, _, fld = str(key).partition(".")
        if not level or fld not in LEVEL_FIELDS:
            raise f.error(
                f"'{printable(str(key))}' in {f.where.rstrip('.')} must be \"<level name>.<field>\" with field one of "
                f"{', '.join(LEVEL_FIELDS)}",
                str(key),
                str(key),
                list(LEVEL_FIELDS),
            )
        if swept:
            items.append((key, _numbers(f, key, False, 0, MAX_LEVEL_VALUE)))
        else:
            f.number(key, 0, MAX_LEVEL_VALUE)
            items.append((key, f.data[key]))
    return tuple(items)


def _family(f: Fields) -> ClusterFamily:
    f.refuse_unknown(CLUSTER_KEYS)
    base = f.string("base")
    return ClusterFamily(
        base,
        f.string("label", base),
        f.string("accelerator") if f.has("accelerator") else None,
        _level_items(f.table("set", {}), False),
        _level_items(f.table("sweep", {}), True),
    )


def spec_from_dict(data: Mapping[str, Any]) -> SweepSpec:
    f = Fields(data, "sweep spec")
    f.refuse_unknown(TOP_KEYS)
    models = f.many("models", MAX_RANGE_VALUES)
    keep = f.listed("keep", len(KEEP_CHOICES), [])
    spec = SweepSpec(
        name=f.string("name", "sweep"),
        models=tuple(models.string(index) for index in models.data),
        devices=tuple(int(n) for n in _numbers(f, "devices", True, 1, MAX_DEVICES)),
        global_batch_sizes=tuple(int(n) for n in _numbers(f, "global_batch_size", True, 1, MAX_GLOBAL_BATCH_SIZE))
        if f.has("global_batch_size")
        else (DEFAULT_GLOBAL_BATCH,),
        seq_lens=tuple(int(n) for n in _numbers(f, "seq_len", True, 1, MAX_SEQ_LEN)) if f.has("seq_len") else (None,),
        hbm_GiB=tuple(float(x) for x in _numbers(f, "hbm_GiB", False, 1e-3, MAX_HBM_GiB))
        if f.has("hbm_GiB")
        else (None,),
        clusters=tuple(_family(table) for table in f.tables("clusters", MAX_CASES)),
        keep=tuple(keep.choice(index, KEEP_CHOICES) for index in keep.data),
        run=_run(f),
        frameworks=_frameworks(f),
    )
    cases = case_count(spec)
    if cases > MAX_CASES:
        raise f.error(
            f"expands to {cases:,} cases; at most {MAX_CASES:,} allowed (split it into several specs)",
            "cases",
            cases,
            MAX_CASES,
        )
    return spec


def _run(f: Fields) -> tuple[tuple[str, float], ...]:
    """The spec's run keys: tokens or steps (not both), prices only with one of them."""
    if f.has("tokens") and f.has("steps"):
        raise f.error("give the run's length as tokens or as steps, not both", "tokens", "tokens and steps", "one")
    bounds = {
        "tokens": (1, MAX_TOKENS),
        "steps": (1, MAX_STEPS),
        "price_per_gpu_hour_usd": PRICE_PER_GPU_HOUR_RANGE,
        "price_per_kwh_usd": PRICE_PER_KWH_RANGE,
    }
    run = {key: f.number(key, *bounds[key]) for key in RUN_KEYS if f.has(key)}
    if "steps" in run:
        run["steps"] = f.integer("steps", MAX_STEPS)
    if run and not {"tokens", "steps"} & set(run):
        raise f.error("prices need the run's length: give tokens or steps", "tokens", sorted(run), "tokens or steps")
    return tuple(run.items())


def _frameworks(f: Fields) -> tuple[str, ...]:
    """``frameworks``: the software the cases run on, each a settings.Framework name (default megatron)."""
    if not f.has("frameworks"):
        return (DEFAULT_FRAMEWORK,)
    listed = f.listed("frameworks", len(Framework))
    return tuple(dict.fromkeys(listed.choice(index, [fw.value for fw in Framework]) for index in listed.data))


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a sweep spec; a bad one raises ConfigError naming the key or value."""
    return spec_from_dict(load_object(path, "sweep spec", "toml"))


def case_count(spec: SweepSpec) -> int:
    """How many cases :func:`expand` gives, without building them."""
    variants = sum(math.prod(len(values) for _, values in fam.swept) for fam in spec.clusters)
    return (
        len(spec.models)
        * len(spec.frameworks)
        * variants
        * len(spec.devices)
        * len(spec.global_batch_sizes)
        * len(spec.seq_lens)
        * len(spec.hbm_GiB)
    )


def expand(spec: SweepSpec) -> list[Case]:
    """Every case of the spec, in a stable order (models, families, swept values, devices, ...)."""
    cases = []
    for model, fam in itertools.product(spec.models, spec.clusters):
        names = [k for k, _ in fam.swept]
        for values in itertools.product(*(v for _, v in fam.swept)):
            overrides = tuple(sorted((dict(fam.fixed) | dict(zip(names, values))).items()))
            for n, gbs, seq, hbm, fw in itertools.product(
                spec.devices, spec.global_batch_sizes, spec.seq_lens, spec.hbm_GiB, spec.frameworks
            ):
                cases.append(
                    Case(
                        model,
                        fam.base,
                        fam.label,
                        fam.accelerator,
                        overrides,
                        tuple(names),
                        n,
                        gbs,
                        seq,
                        hbm,
                        spec.run,
                        fw,
                    )
                )
    return cases
