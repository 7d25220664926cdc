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

from nestplan.errors import ConfigError, brief
from nestplan.inputs import Fields, load_object
from nestplan.network.topology import MAX_DEVICES, MAX_LEVELS

EMBEDDING_ID = -1

# Bounds on a NEST input, far beyond the authors' cases (<= 1,024 devices, 97 nodes, 4,096 microbatches,
# two widths) but finite: the search's work grows with the cube of the layers (256 layers, two widths,
# 4,096 devices: ~40 s here; 512: over 5 minutes and 7 GB).
MAX_NEST_LAYERS = 256  # transformer nodes per width (GPT-3 has 96)
MAX_NEST_WIDTHS = 8  # tensor-parallel widths offered (1, 2, 4, ... 128)
MAX_NEST_BASELINES = 16  # baselines re-costed (the authors give 3)
MAX_NEST_EDGES = 2**20  # edges per width (the authors give the chain's, one per layer)
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


# keys of the authors' objects; ``bandwidth``, ``energy`` and ``num_transformer_layers`` are written by their
# tools and not read here
_TOP_KEYS = (
    "nodes",
    "edges",
    "devices_per_level",
    "bws",
    "latency_per_level",
    "maxDevices",
    "maxMemoryPerDevice",
    "mbsInBatch",
    "ep_degree",
    "cp_degree",
    "sp_enabled",
    "activationRecomputation",
    "optimizerAlgorithm",
    "baselines",
    "frequency",
    "bandwidth",
)
_NODE_KEYS = (
    "id",
    "optimalLatencyFw",
    "optimalLatencyBw",
    "parameterSize",
    "activationSize",
    "isTensorParallelized",
    "energy",
)
_EDGE_KEYS = ("sourceId", "destId", "communicationCost")
_BASELINE_KEYS = ("p", "d", "t", "layer_partition", "num_transformer_layers")


def _refuse(f: Fields, key: str, value: Any, allowed: str) -> ConfigError:
    return f.error(
        f"{f.name(key)} = {brief(value, 60)} is not allowed; expected {allowed}", f.name(key), brief(value), allowed
    )


def _network(f: Fields) -> NestNetwork:
    sizes = f.listed("devices_per_level", MAX_LEVELS, minimum=1)
    dpl = tuple(sizes.integer(key, MAX_DEVICES) for key in sizes.data)
    bws = f.listed("bws", len(dpl), minimum=len(dpl))
    latencies = f.listed("latency_per_level", len(dpl), minimum=len(dpl))
    return NestNetwork(
        dpl,
        tuple(bws.number(key, *NEST_BANDWIDTH_RANGE) for key in bws.data),
        tuple(latencies.number(key, *NEST_LEVEL_LATENCY_RANGE) for key in latencies.data),
    )


def _layer(f: Fields) -> NestLayer:
    f.refuse_unknown(_NODE_KEYS)
    return NestLayer(
        f.integer("id", MAX_NEST_LAYERS - 1, minimum=-1),
        f.number("optimalLatencyFw", *NEST_LATENCY_RANGE),
        f.number("optimalLatencyBw", *NEST_LATENCY_RANGE),
        f.number("parameterSize", *NEST_BYTES_RANGE),
        f.number("activationSize", *NEST_BYTES_RANGE),
        f.flag("isTensorParallelized", False),
    )


def _chain(f: Fields, key: str, n_layers: int) -> tuple[float, ...]:
    """The bytes of each chain edge (i - 1) -> i of the edge list ``key``."""
    chain: dict[int, float] = {}
    for edge in f.tables(key, MAX_NEST_EDGES, minimum=0):
        edge.refuse_unknown(_EDGE_KEYS)
        src = edge.integer("sourceId", MAX_NEST_LAYERS - 1, minimum=-1)
        dst = edge.integer("destId", MAX_NEST_LAYERS - 1, minimum=-1)
        cost = edge.number("communicationCost", *NEST_BYTES_RANGE)
        if dst == src + 1:
            chain[dst] = cost
    missing = [i for i in range(n_layers) if i not in chain]
    if missing:
        raise _refuse(f, key, f"no edge {missing[0] - 1} -> {missing[0]}", "the chain edges (i - 1) -> i")
    return tuple(chain[i] for i in range(n_layers))


def _graph(width: int, nodes: Any, edges: Any) -> NestGraph:
    f = Fields({f"nodes[{width}]": nodes, f"edges[{width}]": edges}, "NEST input")
    parsed: dict[int, NestLayer] = {}
    for node in f.tables(f"nodes[{width}]", MAX_NEST_LAYERS + 1, minimum=2):
        layer = _layer(node)
        if layer.id in parsed:
            raise _refuse(node, "id", layer.id, "ids that occur once")
        parsed[layer.id] = layer
    n_layers = len(parsed) - 1
    if set(parsed) != set(range(EMBEDDING_ID, n_layers)):
        raise _refuse(
            f, f"nodes[{width}].id", sorted(parsed)[:8], f"exactly -1 (embedding) and 0..{n_layers - 1} (a chain)"
        )
    return NestGraph(
        width, parsed[EMBEDDING_ID], tuple(parsed[i] for i in range(n_layers)), _chain(f, f"edges[{width}]", n_layers)
    )


def _baselines(f: Fields) -> tuple[NestBaseline, ...]:
    if not f.has("baselines"):
        return ()
    table = f.table("baselines")
    if len(table.data) > MAX_NEST_BASELINES:
        raise _refuse(
            f, "baselines", table.data, f"an object {{name: {{p, d, t}}}} of at most {MAX_NEST_BASELINES} baselines"
        )
    out = []
    for name in table.data:
        b = table.table(name)
        b.refuse_unknown(_BASELINE_KEYS)
        p = b.integer("p", MAX_DEVICES)
        part = b.listed("layer_partition", p, minimum=p) if b.has("layer_partition") else None
        parts = None if part is None else tuple(part.integer(k, MAX_NEST_LAYERS + 1) for k in part.data)
        out.append(NestBaseline(str(name), p, b.integer("d", MAX_DEVICES), b.integer("t", MAX_DEVICES), parts))
    return tuple(out)


def _graphs(f: Fields, max_devices: int) -> tuple[NestGraph, ...]:
    """One layer chain per offered width, ascending; every width with the same number of layers."""
    nodes, edges = f.raw("nodes"), f.raw("edges")
    if not isinstance(nodes, Mapping) or not 1 <= len(nodes) <= MAX_NEST_WIDTHS:
        raise _refuse(
            f, "nodes", nodes, f'an object {{"<tensor width>": [node, ...]}} of 1 to {MAX_NEST_WIDTHS} widths'
        )
    graphs = []
    for key in nodes:
        width = str(key)
        if not (width.isascii() and width.isdigit() and len(width) <= 7 and 1 <= int(width) <= max_devices):
            raise _refuse(
                f, "nodes", key, f"keys that are tensor-parallel widths (integers 1..maxDevices = {max_devices})"
            )
        graphs.append(_graph(int(width), nodes[key], edges.get(key) if isinstance(edges, Mapping) else None))
    graphs.sort(key=lambda g: g.width)
    if len({g.num_layers for g in graphs}) != 1:
        raise _refuse(f, "nodes", {g.width: g.num_layers for g in graphs}, "the same number of layers at every width")
    return tuple(graphs)


def parse_input(raw: Mapping[str, Any]) -> NestInput:
    """Validate the authors' input object and build a NestInput."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"NEST input: the top level must be a JSON object, got {brief(raw)}", field="(top level)")
    f = Fields(raw, "NEST input")
    f.refuse_unknown(_TOP_KEYS)
    network = _network(f)
    max_devices = f.integer("maxDevices", MAX_DEVICES)
    if network.devices != max_devices:
        raise _refuse(
            f,
            "devices_per_level",
            list(network.devices_per_level),
            f"sizes whose product is maxDevices = {max_devices}",
        )
    graphs = _graphs(f, max_devices)
    optimizer = str(f.raw("optimizerAlgorithm", "SGD")).strip().lower()
    if optimizer not in {o.value for o in NestOptimizer}:
        raise _refuse(f, "optimizerAlgorithm", raw.get("optimizerAlgorithm"), "SGD or Adam")
    microbatches = f.number("mbsInBatch", *NEST_MICROBATCHES_RANGE)
    if microbatches != int(microbatches):
        raise _refuse(f, "mbsInBatch", microbatches, "a whole number of microbatches")
    return NestInput(
        graphs=graphs,
        network=network,
        max_devices=max_devices,
        memory_bytes=f.number("maxMemoryPerDevice", *NEST_MEMORY_RANGE),
        microbatches=int(microbatches),
        ep_degree=f.integer("ep_degree", max_devices),
        cp_degree=f.integer("cp_degree", max_devices),
        sp_enabled=f.flag("sp_enabled", False),
        recompute=f.flag("activationRecomputation"),
        optimizer=NestOptimizer(optimizer),
        baselines=_baselines(f),
        frequency=f.number("frequency", *NEST_FREQUENCY_RANGE) if f.has("frequency") else None,
    )


def read_input(path: str | Path) -> NestInput:
    """Read (through ``nestplan.inputs``) and validate a ``dp_input.json`` file."""
    return parse_input(load_object(path, "NEST input", "json"))
