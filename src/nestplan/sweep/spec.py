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
"""

from __future__ import annotations

import hashlib
import itertools
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from nestplan import __version__
from nestplan.errors import ConfigError

TOP_KEYS = ("name", "models", "devices", "global_batch_size", "seq_len", "hbm_GiB", "keep", "clusters")
KEEP_CHOICES = ("breakdown", "memory", "stages", "placement")   # parts of the plan JSON kept per case
CLUSTER_KEYS = ("base", "label", "accelerator", "set", "sweep")
LEVEL_FIELDS = ("size", "bandwidth_GBps", "latency_us", "oversubscription")
DEFAULT_GLOBAL_BATCH = 4096


@dataclass(frozen=True)
class ClusterFamily:
    base: str
    label: str
    accelerator: str | None                        # catalog name replacing the base's
    fixed: tuple[tuple[str, Any], ...]            # ("level.field", value)
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
    overrides: tuple[tuple[str, Any], ...]        # "level.field" -> value, fixed and swept
    swept: tuple[str, ...]                        # which overrides are swept (for reports)
    devices: int
    global_batch_size: int
    seq_len: int | None
    hbm_GiB: float | None

    def inputs(self) -> dict[str, Any]:
        return {"model": self.model, "cluster": self.cluster_base, "label": self.cluster_label,
                "accelerator": self.accelerator,
                "overrides": {k: v for k, v in self.overrides}, "swept": list(self.swept),
                "devices": self.devices, "global_batch_size": self.global_batch_size, "seq_len": self.seq_len,
                "hbm_GiB": self.hbm_GiB}

    @property
    def key(self) -> str:
        text = json.dumps({"inputs": self.inputs(), "version": __version__}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def _fail(message: str, field: str, value: Any, allowed: Any = None) -> ConfigError:
    return ConfigError(message, field=field, value=value, limit=allowed)


def _list(data: Mapping[str, Any], key: str, kind: type, default: list | None = None, minimum: float = 1) -> tuple:
    value = data.get(key, default)
    if value is None:
        raise _fail(f"sweep spec: '{key}' is required", key, None)
    values = _range(value, key) if isinstance(value, Mapping) else value if isinstance(value, list) else [value]
    if not values:
        raise _fail(f"sweep spec: '{key}' must not be empty", key, value)
    for v in values:
        ok = isinstance(v, str) if kind is str else (isinstance(v, (int, float)) and not isinstance(v, bool)
                                                      and (kind is float or float(v).is_integer()) and v >= minimum)
        if not ok:
            what = "a string" if kind is str else f"a number >= {minimum}" + (" (integer)" if kind is int else "")
            raise _fail(f"sweep spec: '{key}' value {v!r} must be {what}", key, v, what)
    return tuple(kind(v) for v in values)


def _range(table: Mapping[str, Any], key: str) -> list[float]:
    """{from, to, step} (arithmetic) or {from, to, times} (geometric), both ends included."""
    _unknown(table, ("from", "to", "step", "times"), f"'{key}' range")
    lo, hi = table.get("from"), table.get("to")
    step, times = table.get("step"), table.get("times")
    numbers = [x for x in (lo, hi, step, times) if x is not None]
    if (lo is None or hi is None or (step is None) == (times is None)
            or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in numbers)
            or hi < lo or (step is not None and step <= 0) or (times is not None and times <= 1)):
        raise _fail(f"sweep spec: '{key}' range {dict(table)} needs from <= to and exactly one of step > 0 or "
                    f"times > 1", key, dict(table), "{from, to, step} or {from, to, times}")
    out, x = [], lo
    while x <= hi * (1 + 1e-12) and len(out) <= 10_000:
        out.append(x)
        x = x + step if step is not None else x * times
    return out


def _unknown(table: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise _fail(f"sweep spec: unknown key '{key}' in {where}; allowed: {', '.join(allowed)}", key, key,
                        list(allowed))


def _level_items(table: Any, where: str, swept: bool) -> tuple:
    if not isinstance(table, Mapping):
        raise _fail(f"sweep spec: {where} must be a table of \"level.field\" entries", where, table)
    items = []
    for key, value in table.items():
        level, _, fld = key.partition(".")
        if not level or fld not in LEVEL_FIELDS:
            raise _fail(f"sweep spec: '{key}' in {where} must be \"<level name>.<field>\" with field one of "
                        f"{', '.join(LEVEL_FIELDS)}", key, key, list(LEVEL_FIELDS))
        values = _range(value, key) if isinstance(value, Mapping) else value if isinstance(value, list) else [value]
        if not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 for v in values):
            raise _fail(f"sweep spec: '{key}' in {where} must be {'a list of ' if swept else ''}non-negative "
                        f"numbers, got {value!r}", key, value)
        items.append((key, tuple(values)) if swept else (key, values[0]))
    return tuple(items)


def _family(table: Any, i: int) -> ClusterFamily:
    where = f"clusters[{i}]"
    if not isinstance(table, Mapping):
        raise _fail(f"sweep spec: {where} must be a table", "clusters", table)
    _unknown(table, CLUSTER_KEYS, where)
    base = table.get("base")
    if not isinstance(base, str) or not base:
        raise _fail(f"sweep spec: {where}.base must be a cluster name or file", "base", base)
    label = table.get("label", base)
    if not isinstance(label, str) or not label:
        raise _fail(f"sweep spec: {where}.label must be a non-empty string", "label", label)
    accelerator = table.get("accelerator")
    if accelerator is not None and (not isinstance(accelerator, str) or not accelerator):
        raise _fail(f"sweep spec: {where}.accelerator must be a catalog name", "accelerator", accelerator)
    return ClusterFamily(base, label, accelerator, _level_items(table.get("set", {}), f"{where}.set", False),
                         _level_items(table.get("sweep", {}), f"{where}.sweep", True))


def spec_from_dict(data: Mapping[str, Any]) -> SweepSpec:
    _unknown(data, TOP_KEYS, "the spec")
    name = data.get("name", "sweep")
    if not isinstance(name, str) or not name:
        raise _fail("sweep spec: 'name' must be a non-empty string", "name", name)
    clusters = data.get("clusters")
    if not isinstance(clusters, list) or not clusters:
        raise _fail("sweep spec: at least one [[clusters]] table is required", "clusters", clusters)
    return SweepSpec(
        name=name, models=_list(data, "models", str), devices=_list(data, "devices", int),
        global_batch_sizes=_list(data, "global_batch_size", int, [DEFAULT_GLOBAL_BATCH]),
        seq_lens=_list(data, "seq_len", int) if "seq_len" in data else (None,),
        hbm_GiB=_list(data, "hbm_GiB", float, minimum=1e-3) if "hbm_GiB" in data else (None,),
        clusters=tuple(_family(t, i) for i, t in enumerate(clusters)),
        keep=_keep(data.get("keep", [])))


def _keep(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or any(v not in KEEP_CHOICES for v in value):
        bad = [v for v in value if v not in KEEP_CHOICES] if isinstance(value, list) else value
        raise _fail(f"sweep spec: keep {bad!r} must list some of {', '.join(KEEP_CHOICES)}", "keep", bad,
                    list(KEEP_CHOICES))
    return tuple(value)


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a sweep spec; a bad one raises ConfigError naming the key or value."""
    p = Path(path)
    if not p.is_file():
        raise _fail(f"sweep spec '{p}' not found", "spec", str(p), "an existing TOML file")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise _fail(f"sweep spec '{p}': invalid TOML: {exc}", "spec", str(p)) from None
    return spec_from_dict(data)


def expand(spec: SweepSpec) -> list[Case]:
    """Every case of the spec, in a stable order (models, families, swept values, devices, ...)."""
    cases = []
    for model, fam in itertools.product(spec.models, spec.clusters):
        names = [k for k, _ in fam.swept]
        for values in itertools.product(*(v for _, v in fam.swept)):
            overrides = dict(fam.fixed) | dict(zip(names, values))
            for n, gbs, seq, hbm in itertools.product(spec.devices, spec.global_batch_sizes, spec.seq_lens,
                                                      spec.hbm_GiB):
                cases.append(Case(model, fam.base, fam.label, fam.accelerator, tuple(sorted(overrides.items())), tuple(names), n,
                                  gbs, seq, hbm))
    return cases
