"""The NEST authors' solver input (``dp_input.json``), read and validated.

Format (the authors' artifact, scai-tech/Nest; see DESIGN.md section 7): ``nodes`` and
``edges`` per offered tensor-parallel width, the network as ``devices_per_level`` /
``bws`` (bytes/s) / ``latency_per_level`` (s), ``maxDevices``, ``maxMemoryPerDevice``
(bytes), ``mbsInBatch``, ``ep_degree``, ``cp_degree``, ``sp_enabled``,
``activationRecomputation``, ``optimizerAlgorithm`` and ``baselines``. Layer latencies
are in the authors' estimator unit (cycles / ``frequency``, which they read as
milliseconds); everything else is already SI, so nothing is converted here.
Every malformed field raises ConfigError naming the field, the value and what is allowed.
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from nestplan.errors import ConfigError

EMBEDDING_ID = -1


class NestOptimizer(enum.Enum):
    SGD = "sgd"
    ADAM = "adam"


@dataclass(frozen=True)
class NestLayer:
    """One node of the authors' graph: the embedding (id -1) or a transformer layer."""

    id: int
    fw: float                 # optimalLatencyFw, estimator unit per microbatch
    bw: float                 # optimalLatencyBw
    param_bytes: float        # per device at this tensor width
    activation_bytes: float
    tensor_parallel: bool


@dataclass(frozen=True)
class NestGraph:
    """The layer chain at one tensor-parallel width; ``entering_bytes[i]`` is the chain edge
    (i - 1) -> i (i = 0: embedding -> layer 0)."""

    width: int
    embedding: NestLayer
    layers: tuple[NestLayer, ...]
    entering_bytes: tuple[float, ...]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def homogeneous(self) -> bool:
        first = self.layers[0]
        same = all((x.fw, x.bw, x.param_bytes, x.activation_bytes) ==
                   (first.fw, first.bw, first.param_bytes, first.activation_bytes) for x in self.layers)
        return same and len(set(self.entering_bytes[1:])) <= 1


@dataclass(frozen=True)
class NestNetwork:
    """Levels innermost first: devices per unit of the level below, bytes/s and seconds."""

    devices_per_level: tuple[int, ...]
    bandwidth_Bps: tuple[float, ...]
    latency_s: tuple[float, ...]

    @property
    def devices(self) -> int:
        return math.prod(self.devices_per_level)

    def unit(self, level: int) -> int:
        """Devices in one unit of ``level``."""
        return math.prod(self.devices_per_level[:level + 1])


@dataclass(frozen=True)
class NestBaseline:
    name: str
    p: int
    d: int
    t: int
    layer_partition: tuple[int, ...] | None


@dataclass(frozen=True)
class NestInput:
    graphs: tuple[NestGraph, ...]         # one per offered width, ascending
    network: NestNetwork
    max_devices: int
    memory_bytes: float
    microbatches: int                     # mbsInBatch: microbatches in the global batch
    ep_degree: int
    cp_degree: int
    sp_enabled: bool
    recompute: bool
    optimizer: NestOptimizer
    baselines: tuple[NestBaseline, ...]
    frequency: float | None               # the estimator's divisor (informational)

    @property
    def num_layers(self) -> int:
        return self.graphs[0].num_layers

    def graph(self, width: int) -> NestGraph | None:
        return next((g for g in self.graphs if g.width == width), None)

    def stage_devices(self, width: int) -> int:
        """a = t * ep * cp devices per pipeline stage (the authors' stage size)."""
        return width * self.ep_degree * self.cp_degree


def _err(field: str, value: Any, allowed: str) -> ConfigError:
    shown = value if not isinstance(value, (dict, list)) else type(value).__name__
    return ConfigError(f"NEST input: {field} = {shown!r} is not allowed; expected {allowed}",
                       field=field, value=shown, limit=allowed)


def _get(obj: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(obj, Mapping) or key not in obj:
        raise ConfigError(f"NEST input: {where}{key} is missing", field=f"{where}{key}", value=None,
                          limit="a value")
    return obj[key]


def _number(obj: Mapping[str, Any], key: str, where: str = "", *, positive: bool = False,
            minimum: float = 0.0) -> float:
    value = _get(obj, key, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _err(f"{where}{key}", value, "a finite number")
    if value < minimum or (positive and value <= 0):
        raise _err(f"{where}{key}", value, "a number > 0" if positive else f"a number >= {minimum:g}")
    return float(value)


def _integer(obj: Mapping[str, Any], key: str, where: str = "", *, minimum: int = 1) -> int:
    value = _get(obj, key, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < minimum:
        raise _err(f"{where}{key}", value, f"an integer >= {minimum}")
    return int(value)


def _flag(obj: Mapping[str, Any], key: str) -> bool:
    value = _get(obj, key, "")
    if not isinstance(value, bool):
        raise _err(key, value, "true or false")
    return value


def _levels(raw: Mapping[str, Any], key: str, n: int, *, integer: bool = False) -> tuple:
    value = _get(raw, key, "")
    if not isinstance(value, list) or (n and len(value) != n) or not value:
        raise _err(key, value, f"a list of {n or 'one or more'} numbers, one per network level")
    holder = {f"{i}]": v for i, v in enumerate(value)}
    if integer:
        return tuple(_integer(holder, f"{i}]", f"{key}[") for i in range(len(value)))
    return tuple(_number(holder, f"{i}]", f"{key}[", positive=key == "bws") for i in range(len(value)))


def _graph(width: int, nodes: Any, edges: Any) -> NestGraph:
    where = f"nodes[{width}]"
    if not isinstance(nodes, list) or len(nodes) < 2:
        raise _err(where, nodes, "a list of the embedding (id -1) and one node per transformer layer")
    parsed: dict[int, NestLayer] = {}
    for k, node in enumerate(nodes):
        at = f"{where}[{k}]."
        nid = _integer(node, "id", at, minimum=-1)
        if nid in parsed:
            raise _err(f"{at}id", nid, "ids that occur once")
        parsed[nid] = NestLayer(nid, _number(node, "optimalLatencyFw", at), _number(node, "optimalLatencyBw", at),
                                _number(node, "parameterSize", at), _number(node, "activationSize", at),
                                bool(node.get("isTensorParallelized", False)))
    n_layers = len(parsed) - 1
    if set(parsed) != set(range(EMBEDDING_ID, n_layers)):
        raise _err(f"{where}.id", sorted(parsed)[:8], f"exactly -1 (embedding) and 0..{n_layers - 1} (a chain)")
    if not isinstance(edges, list):
        raise _err(f"edges[{width}]", edges, "a list of {sourceId, destId, communicationCost}")
    chain: dict[int, float] = {}
    for k, edge in enumerate(edges):
        at = f"edges[{width}][{k}]."
        src, dst = _integer(edge, "sourceId", at, minimum=-1), _integer(edge, "destId", at, minimum=-1)
        cost = _number(edge, "communicationCost", at)
        if dst == src + 1:
            chain[dst] = cost
    missing = [i for i in range(n_layers) if i not in chain]
    if missing:
        raise _err(f"edges[{width}]", f"no edge {missing[0] - 1} -> {missing[0]}", "the chain edges (i - 1) -> i")
    return NestGraph(width, parsed[EMBEDDING_ID], tuple(parsed[i] for i in range(n_layers)),
                     tuple(chain[i] for i in range(n_layers)))


def _baselines(raw: Any, n_layers: int) -> tuple[NestBaseline, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise _err("baselines", raw, "an object {name: {p, d, t}}")
    out = []
    for name, b in raw.items():
        at = f"baselines.{name}."
        part = b.get("layer_partition") if isinstance(b, Mapping) else None
        p = _integer(b, "p", at)
        if part is not None:
            if not isinstance(part, list) or len(part) != p or any(
                    isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in part):
                raise _err(f"{at}layer_partition", part, f"{p} positive integers (one per stage)")
            part = tuple(part)
        out.append(NestBaseline(str(name), p, _integer(b, "d", at), _integer(b, "t", at), part))
    return tuple(out)


def parse_input(raw: Mapping[str, Any]) -> NestInput:
    """Validate the authors' input object and build a NestInput."""
    if not isinstance(raw, Mapping):
        raise _err("(top level)", raw, "a JSON object")
    dpl = _levels(raw, "devices_per_level", 0, integer=True)
    network = NestNetwork(dpl, _levels(raw, "bws", len(dpl)), _levels(raw, "latency_per_level", len(dpl)))
    max_devices = _integer(raw, "maxDevices")
    if network.devices != max_devices:
        raise _err("devices_per_level", list(dpl), f"sizes whose product is maxDevices = {max_devices}")
    nodes, edges = _get(raw, "nodes", ""), _get(raw, "edges", "")
    if not isinstance(nodes, Mapping) or not nodes:
        raise _err("nodes", nodes, "an object {\"<tensor width>\": [node, ...]}")
    graphs = []
    for key in nodes:
        if not str(key).isdigit() or int(key) < 1:
            raise _err("nodes", key, "keys that are tensor-parallel widths (positive integers)")
        graphs.append(_graph(int(key), nodes[key], edges.get(key) if isinstance(edges, Mapping) else None))
    graphs.sort(key=lambda g: g.width)
    if len({g.num_layers for g in graphs}) != 1:
        raise _err("nodes", {g.width: g.num_layers for g in graphs}, "the same number of layers at every width")
    optimizer = str(raw.get("optimizerAlgorithm", "SGD")).strip().lower()
    if optimizer not in {o.value for o in NestOptimizer}:
        raise _err("optimizerAlgorithm", raw.get("optimizerAlgorithm"), "SGD or Adam")
    microbatches = _number(raw, "mbsInBatch", positive=True)
    if microbatches != int(microbatches):
        raise _err("mbsInBatch", microbatches, "a whole number of microbatches")
    frequency = raw.get("frequency")
    return NestInput(
        graphs=tuple(graphs), network=network, max_devices=max_devices,
        memory_bytes=_number(raw, "maxMemoryPerDevice", positive=True), microbatches=int(microbatches),
        ep_degree=_integer(raw, "ep_degree"), cp_degree=_integer(raw, "cp_degree"),
        sp_enabled=bool(raw.get("sp_enabled", False)), recompute=_flag(raw, "activationRecomputation"),
        optimizer=NestOptimizer(optimizer), baselines=_baselines(raw.get("baselines"), graphs[0].num_layers),
        frequency=float(frequency) if isinstance(frequency, (int, float)) and frequency > 0 else None)


def read_input(path: str | Path) -> NestInput:
    """Read and validate a ``dp_input.json`` file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read NEST input {p}: {exc.strerror}", field="input", value=str(p)) from exc
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"NEST input {p} is not valid JSON: {exc.msg} at line {exc.lineno}",
                          field="input", value=str(p), limit="a JSON object") from exc
    return parse_input(raw)
