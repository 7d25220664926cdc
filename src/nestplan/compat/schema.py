"""The NEST authors' solver input (``dp_input.json``), read and validated.

Format (the authors' artifact, scai-tech/Nest; see docs/design.md section 7, "Reference data"): ``nodes`` and
``edges`` per offered tensor-parallel width, the network as ``devices_per_level`` /
``bws`` (bytes/s) / ``latency_per_level`` (s), ``maxDevices``, ``maxMemoryPerDevice``
(bytes), ``mbsInBatch``, ``ep_degree``, ``cp_degree``, ``sp_enabled``,
``activationRecomputation``, ``optimizerAlgorithm`` and ``baselines``. Layer latencies
are in the authors' estimator unit (cycles / ``frequency``, which they read as
milliseconds); everything else is already SI, so nothing is converted here.
Every malformed field raises ConfigError naming the field, the value and what is allowed;
every number is finite and within a bound (``MAX_*`` below), integers are JSON integers
(``mbsInBatch`` excepted: the authors write it as ``4096.0``).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from nestplan.errors import ConfigError
from nestplan.inputs import load_object
from nestplan.network.topology import MAX_DEVICES, MAX_LEVELS

EMBEDDING_ID = -1

# Bounds on a NEST input, far beyond the authors' cases (<= 1,024 devices, 97 nodes, 4,096 microbatches,
# two widths) but finite: the search's work grows with the cube of the layers (256 layers, two widths,
# 4,096 devices: ~40 s here; 512: over 5 minutes and 7 GB).
MAX_NEST_LAYERS = 256  # transformer nodes per width (GPT-3 has 96)
MAX_NEST_WIDTHS = 8  # tensor-parallel widths offered (1, 2, 4, ... 128)
MAX_NEST_BASELINES = 16  # baselines re-costed (the authors give 3)
# closed ranges of the numbers: every time (latency x microbatches, bytes / bandwidth) stays finite
NEST_MICROBATCHES_RANGE = (1, 2**16)  # mbsInBatch: the authors use at most 4,096 (the search tries every d up to it)
NEST_LATENCY_RANGE = (0.0, 1e12)  # a layer's optimalLatencyFw/Bw in estimator units (the authors' largest: ~822)
NEST_BYTES_RANGE = (0.0, 2.0**60)  # parameter, activation and edge sizes: up to 1 EiB
NEST_MEMORY_RANGE = (1.0, 2.0**60)  # maxMemoryPerDevice: 1 B to 1 EiB (the authors': 64 and 90 GiB)
NEST_BANDWIDTH_RANGE = (1e6, 1e15)  # bws: 1 MB/s to 1 PB/s (the authors': 1.3e10 to 9.7e11)
NEST_LEVEL_LATENCY_RANGE = (0.0, 1.0)  # latency_per_level, seconds (the authors' largest: 3e-4)
NEST_FREQUENCY_RANGE = (1.0, 1e12)  # the estimator's divisor, informational (the authors': 1.05e6)


class NestOptimizer(enum.Enum):
    SGD = "sgd"
    ADAM = "adam"


@dataclass(frozen=True)
class NestLayer:
    """One node of the authors' graph: the embedding (id -1) or a transformer layer."""

    id: int
    fw: float  # optimalLatencyFw, estimator unit per microbatch
    bw: float  # optimalLatencyBw
    param_bytes: float  # per device at this tensor width
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
        same = all(
            (x.fw, x.bw, x.param_bytes, x.activation_bytes)
            == (first.fw, first.bw, first.param_bytes, first.activation_bytes)
            for x in self.layers
        )
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
        return math.prod(self.devices_per_level[: level + 1])


@dataclass(frozen=True)
class NestBaseline:
    name: str
    p: int
    d: int
    t: int
    layer_partition: tuple[int, ...] | None


@dataclass(frozen=True)
class NestInput:
    graphs: tuple[NestGraph, ...]  # one per offered width, ascending
    network: NestNetwork
    max_devices: int
    memory_bytes: float
    microbatches: int  # mbsInBatch: microbatches in the global batch
    ep_degree: int
    cp_degree: int
    sp_enabled: bool
    recompute: bool
    optimizer: NestOptimizer
    baselines: tuple[NestBaseline, ...]
    frequency: float | None  # the estimator's divisor (informational)

    @property
    def num_layers(self) -> int:
        return self.graphs[0].num_layers

    def graph(self, width: int) -> NestGraph | None:
        return next((g for g in self.graphs if g.width == width), None)

    def stage_devices(self, width: int) -> int:
        """a = t * ep * cp devices per pipeline stage (the authors' stage size)."""
        return width * self.ep_degree * self.cp_degree


def _err(field: str, value: Any, allowed: str) -> ConfigError:
    shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return ConfigError(
        f"NEST input: {field} = {shown} is not allowed; expected {allowed}", field=field, value=shown, limit=allowed
    )


def _get(obj: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(obj, Mapping) or key not in obj:
        raise ConfigError(f"NEST input: {where}{key} is missing", field=f"{where}{key}", value=None, limit="a value")
    return obj[key]


def _number(obj: Mapping[str, Any], key: str, bounds: tuple[float, float], where: str = "") -> float:
    """A number in the closed range ``bounds``."""
    value = _get(obj, key, where)
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:  # NaN fails too
        raise _err(f"{where}{key}", value, f"a number in [{low:g}, {high:g}]")
    return float(value)


def _integer(obj: Mapping[str, Any], key: str, where: str = "", *, maximum: int, minimum: int = 1) -> int:
    """A JSON integer (not a bool, not ``2.0``) in minimum..maximum."""
    value = _get(obj, key, where)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise _err(f"{where}{key}", value, f"an integer in {minimum}..{maximum}")
    return value


def _flag(obj: Mapping[str, Any], key: str, where: str = "", default: bool | None = None) -> bool:
    """true or false; ``default`` where the key may be absent."""
    value = _get(obj, key, where) if default is None or key in obj else default
    if not isinstance(value, bool):
        raise _err(f"{where}{key}", value, "true or false")
    return value


def _level_list(raw: Mapping[str, Any], key: str, n: int) -> dict[str, Any]:
    """``raw[key]``, a list of ``n`` values (1..MAX_LEVELS when ``n`` is 0), as a holder whose keys
    ``"0]"``, ``"1]"`` ... make ``key[i]`` the field name of each."""
    value = _get(raw, key, "")
    if not isinstance(value, list) or (n and len(value) != n) or not 1 <= len(value) <= MAX_LEVELS:
        raise _err(key, value, f"a list of {n or f'1 to {MAX_LEVELS}'} numbers, one per network level")
    return {f"{i}]": v for i, v in enumerate(value)}


def _network(raw: Mapping[str, Any]) -> NestNetwork:
    sizes = _level_list(raw, "devices_per_level", 0)
    dpl = tuple(_integer(sizes, k, "devices_per_level[", maximum=MAX_DEVICES) for k in sizes)
    bws = _level_list(raw, "bws", len(dpl))
    latencies = _level_list(raw, "latency_per_level", len(dpl))
    return NestNetwork(
        dpl,
        tuple(_number(bws, k, NEST_BANDWIDTH_RANGE, "bws[") for k in bws),
        tuple(_number(latencies, k, NEST_LEVEL_LATENCY_RANGE, "latency_per_level[") for k in latencies),
    )


def _graph(width: int, nodes: Any, edges: Any) -> NestGraph:
    where = f"nodes[{width}]"
    if not isinstance(nodes, list) or not 2 <= len(nodes) <= MAX_NEST_LAYERS + 1:
        raise _err(where, nodes, f"a list of the embedding (id -1) and 1 to {MAX_NEST_LAYERS} transformer layers")
    parsed: dict[int, NestLayer] = {}
    for k, node in enumerate(nodes):
        at = f"{where}[{k}]."
        nid = _integer(node, "id", at, minimum=-1, maximum=MAX_NEST_LAYERS - 1)
        if nid in parsed:
            raise _err(f"{at}id", nid, "ids that occur once")
        parsed[nid] = NestLayer(
            nid,
            _number(node, "optimalLatencyFw", NEST_LATENCY_RANGE, at),
            _number(node, "optimalLatencyBw", NEST_LATENCY_RANGE, at),
            _number(node, "parameterSize", NEST_BYTES_RANGE, at),
            _number(node, "activationSize", NEST_BYTES_RANGE, at),
            _flag(node, "isTensorParallelized", at, default=False),
        )
    n_layers = len(parsed) - 1
    if set(parsed) != set(range(EMBEDDING_ID, n_layers)):
        raise _err(f"{where}.id", sorted(parsed)[:8], f"exactly -1 (embedding) and 0..{n_layers - 1} (a chain)")
    if not isinstance(edges, list):
        raise _err(f"edges[{width}]", edges, "a list of {sourceId, destId, communicationCost}")
    chain: dict[int, float] = {}
    for k, edge in enumerate(edges):
        at = f"edges[{width}][{k}]."
        src = _integer(edge, "sourceId", at, minimum=-1, maximum=MAX_NEST_LAYERS - 1)
        dst = _integer(edge, "destId", at, minimum=-1, maximum=MAX_NEST_LAYERS - 1)
        cost = _number(edge, "communicationCost", NEST_BYTES_RANGE, at)
        if dst == src + 1:
            chain[dst] = cost
    missing = [i for i in range(n_layers) if i not in chain]
    if missing:
        raise _err(f"edges[{width}]", f"no edge {missing[0] - 1} -> {missing[0]}", "the chain edges (i - 1) -> i")
    return NestGraph(
        width, parsed[EMBEDDING_ID], tuple(parsed[i] for i in range(n_layers)), tuple(chain[i] for i in range(n_layers))
    )


def _baselines(raw: Any) -> tuple[NestBaseline, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping) or len(raw) > MAX_NEST_BASELINES:
        raise _err("baselines", raw, f"an object {{name: {{p, d, t}}}} of at most {MAX_NEST_BASELINES} baselines")
    out = []
    for name, b in raw.items():
        at = f"baselines.{name}."
        part = b.get("layer_partition") if isinstance(b, Mapping) else None
        p = _integer(b, "p", at, maximum=MAX_DEVICES)
        if part is not None:
            if (
                not isinstance(part, list)
                or len(part) != p
                or any(isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= MAX_NEST_LAYERS + 1 for x in part)
            ):
                raise _err(f"{at}layer_partition", part, f"{p} integers in 1..{MAX_NEST_LAYERS + 1} (one per stage)")
            part = tuple(part)
        out.append(
            NestBaseline(
                str(name), p, _integer(b, "d", at, maximum=MAX_DEVICES), _integer(b, "t", at, maximum=MAX_DEVICES), part
            )
        )
    return tuple(out)


def parse_input(raw: Mapping[str, Any]) -> NestInput:
    """Validate the authors' input object and build a NestInput."""
    if not isinstance(raw, Mapping):
        raise _err("(top level)", raw, "a JSON object")
    network = _network(raw)
    max_devices = _integer(raw, "maxDevices", maximum=MAX_DEVICES)
    if network.devices != max_devices:
        raise _err(
            "devices_per_level", list(network.devices_per_level), f"sizes whose product is maxDevices = {max_devices}"
        )
    nodes, edges = _get(raw, "nodes", ""), _get(raw, "edges", "")
    if not isinstance(nodes, Mapping) or not 1 <= len(nodes) <= MAX_NEST_WIDTHS:
        raise _err("nodes", nodes, f'an object {{"<tensor width>": [node, ...]}} of 1 to {MAX_NEST_WIDTHS} widths')
    graphs = []
    for key in nodes:
        width = str(key)
        if not (width.isascii() and width.isdigit() and len(width) <= 7 and 1 <= int(width) <= max_devices):
            raise _err("nodes", key, f"keys that are tensor-parallel widths (integers 1..maxDevices = {max_devices})")
        graphs.append(_graph(int(width), nodes[key], edges.get(key) if isinstance(edges, Mapping) else None))
    graphs.sort(key=lambda g: g.width)
    if len({g.num_layers for g in graphs}) != 1:
        raise _err("nodes", {g.width: g.num_layers for g in graphs}, "the same number of layers at every width")
    optimizer = str(raw.get("optimizerAlgorithm", "SGD")).strip().lower()
    if optimizer not in {o.value for o in NestOptimizer}:
        raise _err("optimizerAlgorithm", raw.get("optimizerAlgorithm"), "SGD or Adam")
    microbatches = _number(raw, "mbsInBatch", NEST_MICROBATCHES_RANGE)
    if microbatches != int(microbatches):
        raise _err("mbsInBatch", microbatches, "a whole number of microbatches")
    return NestInput(
        graphs=tuple(graphs),
        network=network,
        max_devices=max_devices,
        memory_bytes=_number(raw, "maxMemoryPerDevice", NEST_MEMORY_RANGE),
        microbatches=int(microbatches),
        ep_degree=_integer(raw, "ep_degree", maximum=max_devices),
        cp_degree=_integer(raw, "cp_degree", maximum=max_devices),
        sp_enabled=_flag(raw, "sp_enabled", default=False),
        recompute=_flag(raw, "activationRecomputation"),
        optimizer=NestOptimizer(optimizer),
        baselines=_baselines(raw.get("baselines")),
        frequency=(_number(raw, "frequency", NEST_FREQUENCY_RANGE) if raw.get("frequency") is not None else None),
    )


def read_input(path: str | Path) -> NestInput:
    """Read (through ``nestplan.inputs``) and validate a ``dp_input.json`` file."""
    return parse_input(load_object(path, "NEST input", "json"))
