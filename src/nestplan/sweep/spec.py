"""Sweep specification (TOML) and its expansion into cases.

    name = "codesign"
    models = ["gpt3-175b", "mixtral-8x7b"]     # catalog names or config.json paths
    devices = [256, 512, 1024]
    global_batch_size = [4096]                 # optional (default 4096)
    seq_len = [2048]                           # optional (default: the model's, at most 8192)
    hbm_GiB = [80]                             # optional: device memory replaces the accelerator's
    keep = ["breakdown", "memory"]             # optional: also store these parts of each plan JSON

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
from nestplan.errors import ConfigError, brief, printable
from nestplan.inputs import check_string, load_object
from nestplan.job import MAX_GLOBAL_BATCH_SIZE, MAX_SEQ_LEN
from nestplan.network.topology import MAX_DEVICES  # largest device count swept: what one network holds

TOP_KEYS = ("name", "models", "devices", "global_batch_size", "seq_len", "hbm_GiB", "keep", "clusters")
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

    def inputs(self) -> dict[str, Any]:
        return {
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

    @property
    def key(self) -> str:
        text = json.dumps({"inputs": self.inputs(), "version": __version__}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def _fail(message: str, field: str, value: Any, allowed: Any = None) -> ConfigError:
    return ConfigError(message, field=field, value=value, limit=allowed)


def _shown(value: Any) -> str:
    """A value as an error line quotes it: one line, at most 80 characters."""
    return brief(value, 80)


def _number_ok(v: Any, integer: bool, minimum: float, maximum: float) -> bool:
    """A finite number in [minimum, maximum], whole where ``integer`` (compared before any conversion)."""
    return (
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and (isinstance(v, int) or math.isfinite(v))
        and minimum <= v <= maximum
        and (not integer or isinstance(v, int) or v.is_integer())
    )


def _values(value: Any, key: str) -> list:
    """A list, a range table or a single value, as a list."""
    if isinstance(value, Mapping):
        return _range(value, key)
    return value if isinstance(value, list) else [value]


def _list(
    data: Mapping[str, Any],
    key: str,
    kind: type,
    default: list | None = None,
    minimum: float = 1,
    maximum: float = math.inf,
) -> tuple:
    value = data.get(key, default)
    if value is None:
        raise _fail(f"sweep spec: '{key}' is required", key, None)
    values = _values(value, key)
    if not values:
        raise _fail(f"sweep spec: '{key}' must not be empty", key, value)
    for v in values:
        if kind is str and isinstance(v, str) and v:
            check_string(v, f"'{key}' value", "sweep spec")
        elif kind is str or not _number_ok(v, kind is int, minimum, maximum):
            what = (
                "a non-empty string"
                if kind is str
                else f"{'an integer' if kind is int else 'a number'} from {minimum:g} to {maximum:g}"
            )
            raise _fail(f"sweep spec: '{key}' value {_shown(v)} must be {what}", key, v, what)
    return tuple(kind(v) for v in values)


def _range(table: Mapping[str, Any], key: str) -> list[float]:
    """{from, to, step} (arithmetic) or {from, to, times} (geometric, from > 0), both ends included."""
    _unknown(table, ("from", "to", "step", "times"), f"'{key}' range")
    lo, hi = table.get("from"), table.get("to")
    step, times = table.get("step"), table.get("times")
    numbers = [x for x in (lo, hi, step, times) if x is not None]
    if (
        lo is None
        or hi is None
        or (step is None) == (times is None)
        or not all(_number_ok(x, False, -math.inf, math.inf) for x in numbers)
        or hi < lo
        or (step is not None and step <= 0)
        or (times is not None and (times <= 1 or lo <= 0))
    ):
        raise _fail(
            f"sweep spec: '{key}' range {_shown(dict(table))} needs from <= to and exactly one of "
            f"step > 0 or times > 1 (with from > 0)",
            key,
            dict(table),
            "{from, to, step} or {from, to, times}",
        )
    out, x = [], lo
    while x <= hi or math.isclose(x, hi, rel_tol=1e-12):
        if len(out) == MAX_RANGE_VALUES:
            raise _fail(
                f"sweep spec: '{key}' range {_shown(dict(table))} gives more than {MAX_RANGE_VALUES:,} values",
                key,
                dict(table),
                MAX_RANGE_VALUES,
            )
        out.append(x)
        x = x + step if step is not None else x * times
    return out


def _unknown(table: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise _fail(
                f"sweep spec: unknown key '{printable(str(key))}' in {where}; allowed: {', '.join(allowed)}",
                key,
                key,
                list(allowed),
            )


def _level_items(table: Any, where: str, swept: bool) -> tuple:
    if not isinstance(table, Mapping):
        raise _fail(f'sweep spec: {where} must be a table of "level.field" entries', where, table)
    items = []
    for key, value in table.items():
        level, _, fld = key.partition(".")
        if not level or fld not in LEVEL_FIELDS:
            raise _fail(
                f"sweep spec: '{printable(key)}' in {where} must be \"<level name>.<field>\" with field one of "
                f"{', '.join(LEVEL_FIELDS)}",
                key,
                key,
                list(LEVEL_FIELDS),
            )
        values = _values(value, key) if swept else [value]
        if not values or not all(_number_ok(v, False, 0, MAX_LEVEL_VALUE) for v in values):
            allowed = f"{'a list of ' if swept else 'one '}number{'s' if swept else ''} from 0 to {MAX_LEVEL_VALUE:,}"
            raise _fail(
                f"sweep spec: '{printable(key)}' in {where} must be {allowed}, got {_shown(value)}", key, value, allowed
            )
        items.append((key, tuple(values)) if swept else (key, value))
    return tuple(items)


def _text(table: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str | None:
    """An optional non-empty string field, free of control characters."""
    value = table.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _fail(
            f"sweep spec: {where}.{key} must be a non-empty string, got {_shown(value)}",
            key,
            value,
            "a non-empty string",
        )
    return check_string(value, f"{where}.{key}", "sweep spec")


def _family(table: Any, i: int) -> ClusterFamily:
    where = f"clusters[{i}]"
    if not isinstance(table, Mapping):
        raise _fail(f"sweep spec: {where} must be a table", "clusters", table)
    _unknown(table, CLUSTER_KEYS, where)
    base = _text(table, "base", where)
    if base is None:
        raise _fail(f"sweep spec: {where}.base must be a cluster name or file", "base", None)
    return ClusterFamily(
        base,
        _text(table, "label", where, base),
        _text(table, "accelerator", where),
        _level_items(table.get("set", {}), f"{where}.set", False),
        _level_items(table.get("sweep", {}), f"{where}.sweep", True),
    )


def spec_from_dict(data: Mapping[str, Any]) -> SweepSpec:
    _unknown(data, TOP_KEYS, "the spec")
    name = _text(data, "name", "spec", "sweep")
    clusters = data.get("clusters")
    if not isinstance(clusters, list) or not clusters:
        raise _fail("sweep spec: at least one [[clusters]] table is required", "clusters", clusters)
    spec = SweepSpec(
        name=name,
        models=_list(data, "models", str),
        devices=_list(data, "devices", int, maximum=MAX_DEVICES),
        global_batch_sizes=_list(data, "global_batch_size", int, [DEFAULT_GLOBAL_BATCH], maximum=MAX_GLOBAL_BATCH_SIZE),
        seq_lens=_list(data, "seq_len", int, maximum=MAX_SEQ_LEN) if "seq_len" in data else (None,),
        hbm_GiB=_list(data, "hbm_GiB", float, minimum=1e-3, maximum=MAX_HBM_GiB) if "hbm_GiB" in data else (None,),
        clusters=tuple(_family(t, i) for i, t in enumerate(clusters)),
        keep=_keep(data.get("keep", [])),
    )
    cases = case_count(spec)
    if cases > MAX_CASES:
        raise _fail(
            f"sweep spec: expands to {cases:,} cases; at most {MAX_CASES:,} allowed (split it into several specs)",
            "cases",
            cases,
            MAX_CASES,
        )
    return spec


def _keep(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or any(v not in KEEP_CHOICES for v in value):
        bad = [v for v in value if v not in KEEP_CHOICES] if isinstance(value, list) else value
        raise _fail(
            f"sweep spec: keep {_shown(bad)} must list some of {', '.join(KEEP_CHOICES)}",
            "keep",
            bad,
            list(KEEP_CHOICES),
        )
    return tuple(value)


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a sweep spec; a bad one raises ConfigError naming the key or value."""
    return spec_from_dict(load_object(path, "sweep spec", "toml"))


def case_count(spec: SweepSpec) -> int:
    """How many cases :func:`expand` gives, without building them."""
    variants = sum(math.prod(len(values) for _, values in fam.swept) for fam in spec.clusters)
    return (
        len(spec.models)
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
            for n, gbs, seq, hbm in itertools.product(
                spec.devices, spec.global_batch_sizes, spec.seq_lens, spec.hbm_GiB
            ):
                cases.append(
                    Case(model, fam.base, fam.label, fam.accelerator, overrides, tuple(names), n, gbs, seq, hbm)
                )
    return cases
