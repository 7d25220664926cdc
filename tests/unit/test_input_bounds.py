"""Every input file reader is bounded and validated: a hostile file is one ConfigError line naming the field.

Readers: a model's ``config.json`` (``load_model``), a cluster file in TOML and JSON with its
``[accelerator]`` table (``load_cluster``), a NEST solver input (``read_input``). Each gets the
same file-level attacks (deep nesting, non-finite and huge numbers, invalid UTF-8, an empty file,
a top-level list, control characters) and its own field-level ones (sizes far beyond the bounds,
``2.0`` or ``true`` as an integer, values outside their physical range).
"""

from __future__ import annotations

import copy
import json
import math

import pytest

from nestplan import api
from nestplan.cluster import load_cluster
from nestplan.compat.schema import MAX_NEST_LAYERS, read_input
from nestplan.errors import ConfigError
from nestplan.job import Job
from nestplan.model import load_model
from nestplan.model.config import (
    MAX_EXPERTS,
    MAX_FFN,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_LAYERS,
    MAX_POSITIONS,
    MAX_VOCAB,
)
from nestplan.network import graph as graph_module
from nestplan.network.graph import from_graph
from nestplan.network.topology import MAX_DEVICES
from nestplan.strategy.dims import ParallelDims
from tests.unit.cli_helpers import run_cli

# ---------------------------------------------------------------- valid inputs the attacks start from

LLAMA = {
    "model_type": "llama",
    "_name_or_path": "org/tiny",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
}

ACCELERATOR = {
    "name": "chip",
    "peak_bf16_TFLOPS": 100,
    "hbm_GiB": 16,
    "hbm_bandwidth_TBps": 1.0,
    "matmul_efficiency": 0.8,
    "matmul_half_dim": 64.0,
    "memory_efficiency": 0.8,
    "reserved_GiB": 2.0,
}

CLUSTER = {
    "name": "tiny",
    "accelerator": ACCELERATOR,
    "levels": [
        {"name": "node", "size": 4, "bandwidth_GBps": 450, "latency_us": 1, "bus_efficiency": 0.8},
        {"name": "leaf", "size": 2, "bandwidth_GBps": 50, "latency_us": 3, "oversubscription": 2},
    ],
}

CLUSTER_TOML = """
name = "tiny"
accelerator = "h100-sxm-80gb"

[[levels]]
name = "node"
size = 4
bandwidth_GBps = 450
latency_us = 1

[[levels]]
name = "leaf"
size = 2
bandwidth_GBps = 50
latency_us = 3
"""


def _nest(layers: int = 4) -> dict:
    nodes = [
        {
            "id": i,
            "optimalLatencyFw": 1.0,
            "optimalLatencyBw": 2.0,
            "parameterSize": 1e6,
            "activationSize": 1e6,
            "isTensorParallelized": False,
        }
        for i in range(-1, layers)
    ]
    edges = [{"sourceId": i - 1, "destId": i, "communicationCost": 1e6} for i in range(layers)]
    return {
        "nodes": {"1": nodes},
        "edges": {"1": edges},
        "devices_per_level": [2, 2],
        "bws": [1e11, 1e10],
        "latency_per_level": [1e-5, 1e-4],
        "maxDevices": 4,
        "maxMemoryPerDevice": 1e12,
        "mbsInBatch": 8.0,
        "ep_degree": 1,
        "cp_degree": 1,
        "sp_enabled": False,
        "activationRecomputation": True,
        "optimizerAlgorithm": "SGD",
        "frequency": 1.05e6,
        "baselines": {"Manual": {"p": 2, "d": 2, "t": 1}},
    }


def _changed(base: dict, path: str, value) -> dict:
    """A deep copy of ``base`` with the field at ``path`` ('levels.0.size', 'nodes.1.2.id') set to ``value``."""
    data = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value
    return data


def _one_line_naming(err: ConfigError, *names: str) -> None:
    message = str(err)
    assert "\n" not in message and "\r" not in message
    for name in names:
        assert name in message, (name, message)


# ---------------------------------------------------------------- file-level attacks, every reader

DEEP = '{"a": ' * 100_000 + "1" + "}" * 100_000
FILE_ATTACKS = [
    # (id, file bytes as a function of a valid JSON text, words the message must hold)
    ("deep-nesting-1e5", lambda good: DEEP.encode(), ["nested deeper than 64"]),
    ("nan", lambda good: good.replace("}", ', "x": NaN}', 1).encode(), ["NaN"]),
    ("infinity", lambda good: good.replace("}", ', "x": -Infinity}', 1).encode(), ["Infinity"]),
    ("1e999", lambda good: good.replace("}", ', "x": 1e999}', 1).encode(), ["x", "finite"]),
    ("5000-digit-int", lambda good: good.replace("}", ', "x": 1' + "0" * 5000 + "}", 1).encode(), ["digit"]),
    ("invalid-utf8", lambda good: good.encode() + b"\xff\xfe", ["not UTF-8"]),
    ("empty", lambda good: b"", ["invalid JSON"]),
    ("top-level-list", lambda good: b"[1, 2]", ["top level", "list"]),
    ("control-character", lambda good: good.replace("}", ', "x": "a\\u001b[2Jb"}', 1).encode(), ["x", "control"]),
]
READERS = {
    "model": (lambda path: load_model(str(path)), json.dumps(LLAMA), "model config file"),
    "cluster": (lambda path: load_cluster(str(path)), json.dumps(CLUSTER), "cluster file"),
    "nest": (read_input, json.dumps(_nest()), "NEST input"),
}


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("attack, content, words", FILE_ATTACKS, ids=[a[0] for a in FILE_ATTACKS])
def test_file_level_attacks(tmp_path, reader, attack, content, words):
    read, good, what = READERS[reader]
    path = tmp_path / "input.json"
    path.write_bytes(content(good))
    with pytest.raises(ConfigError) as info:
        read(path)
    _one_line_naming(info.value, what, *words)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_the_valid_inputs_read(tmp_path, reader):
    read, good, _ = READERS[reader]
    path = tmp_path / "input.json"
    path.write_text(good)
    read(path)


def test_deep_toml_cluster_file(tmp_path):
    path = tmp_path / "deep.toml"
    path.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n" + CLUSTER_TOML)
    with pytest.raises(ConfigError) as info:
        load_cluster(str(path))
    _one_line_naming(info.value, "cluster file", "nested deeper than 64")


@pytest.mark.parametrize("load", [load_model, load_cluster], ids=["model", "cluster"])
@pytest.mark.parametrize(
    "text",
    ["a" * 5000, "a" * 5000 + ".json", "x/" + "a" * 300, "a\x00b.json", "a\x00b", "~no-such-user-here/c.json"],
    ids=["long-name", "long-file", "long-component", "nul-file", "nul-name", "unknown-home"],
)
def test_names_that_cannot_be_probed(load, text):
    with pytest.raises(ConfigError) as info:
        load(text)
    _one_line_naming(info.value, "model" if load is load_model else "cluster")


# ---------------------------------------------------------------- model config.json

MODEL_ATTACKS = [
    ("num_hidden_layers", 2**63),
    ("num_hidden_layers", 10**12),
    ("num_hidden_layers", 10**6),
    ("num_hidden_layers", MAX_LAYERS + 1),
    ("num_hidden_layers", 2.0),
    ("num_hidden_layers", True),
    ("num_hidden_layers", -3),
    ("hidden_size", MAX_HIDDEN * 2),
    ("hidden_size", 256.0),
    ("num_attention_heads", MAX_HEADS * 2),
    ("num_key_value_heads", False),
    ("head_dim", MAX_HEAD_DIM * 2),
    ("intermediate_size", MAX_FFN + 1),
    ("vocab_size", MAX_VOCAB + 1),
    ("max_position_embeddings", MAX_POSITIONS + 1),
    ("max_position_embeddings", 0),
    ("num_hidden_layers", "32"),
]


@pytest.mark.parametrize("field, value", MODEL_ATTACKS, ids=[f"{f}={v!r}"[:40] for f, v in MODEL_ATTACKS])
def test_model_fields_out_of_bounds(tmp_path, field, value):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_changed(LLAMA, field, value)))
    with pytest.raises(ConfigError) as info:
        load_model(str(path))
    _one_line_naming(info.value, f"'{field}'")
    assert info.value.field == field


@pytest.mark.parametrize("field, value", [("num_local_experts", MAX_EXPERTS + 1), ("num_experts_per_tok", 2.0)])
def test_moe_fields_out_of_bounds(tmp_path, field, value):
    data = _changed(LLAMA | {"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2}, field, value)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as info:
        load_model(str(path))
    _one_line_naming(info.value, f"'{field}'")


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("_name_or_path", "evil\nname", ["_name_or_path", "control character"]),
        ("_name_or_path", "a\u2028b", ["_name_or_path", "control character"]),
        ("name", "x\x1b[31m", ["name", "control character"]),
        ("_name_or_path", "n" * 201, ["_name_or_path", "201 characters", "200"]),
    ],
)
def test_model_names(tmp_path, key, value, words):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA | {"_name_or_path": None} | {key: value}))
    with pytest.raises(ConfigError) as info:
        load_model(str(path))
    _one_line_naming(info.value, *words)


def test_model_name_from_a_folder_with_a_control_character(tmp_path):
    folder = tmp_path / "ckpt\x1b[2J"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA | {"_name_or_path": None}))
    with pytest.raises(ConfigError) as info:
        load_model(str(folder))
    _one_line_naming(info.value, "folder name", "control character")


def test_max_seq_len_only_for_learned_positions():
    assert load_model("bert-large").max_seq_len == 512  # 512 learned positions (Devlin et al. 2019)
    assert load_model("gpt3-175b").max_seq_len == load_model("gpt3-175b").max_position_embeddings
    assert load_model("llama3-8b").max_seq_len is None  # rotary: no hard limit


def test_a_model_at_every_bound_reads(tmp_path):
    data = {
        "model_type": "mixtral",
        "hidden_size": MAX_HIDDEN,
        "num_hidden_layers": MAX_LAYERS,
        "num_attention_heads": MAX_HEADS,
        "num_key_value_heads": MAX_HEADS,
        "head_dim": MAX_HEAD_DIM,
        "intermediate_size": MAX_FFN,
        "vocab_size": MAX_VOCAB,
        "max_position_embeddings": MAX_POSITIONS,
        "num_local_experts": MAX_EXPERTS,
        "num_experts_per_tok": MAX_EXPERTS,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    spec = load_model(str(path))
    assert (spec.num_layers, spec.num_experts, spec.q_channels) == (MAX_LAYERS, MAX_EXPERTS, MAX_HEADS * MAX_HEAD_DIM)


def test_the_deepest_model_evaluates(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA | {"num_hidden_layers": MAX_LAYERS}))
    prediction = api.evaluate(str(path), "dgx-h100", ParallelDims(tp=8, pp=8), Job(global_batch_size=16, seq_len=512))
    assert math.isfinite(prediction.step_time_s) and prediction.step_time_s > 0


# ---------------------------------------------------------------- cluster files and accelerator tables

CLUSTER_ATTACKS = [
    ("levels.0.size", 2**63, "levels[0].size"),
    ("levels.0.size", 2.0, "levels[0].size"),
    ("levels.0.size", True, "levels[0].size"),
    ("levels.0.size", 0, "levels[0].size"),
    ("levels.1.bandwidth_GBps", 0, "levels[1].bandwidth_GBps"),
    ("levels.1.bandwidth_GBps", 1e300, "levels[1].bandwidth_GBps"),
    ("levels.1.bandwidth_GBps", 1e-300, "levels[1].bandwidth_GBps"),
    ("levels.1.latency_us", -1, "levels[1].latency_us"),
    ("levels.1.latency_us", 10**400, "levels[1].latency_us"),
    ("levels.1.oversubscription", 0.5, "levels[1].oversubscription"),
    ("levels.1.oversubscription", 1e9, "levels[1].oversubscription"),
    ("levels.0.bus_efficiency", 1.5, "levels[0].bus_efficiency"),
    ("levels.0.bus_efficiency", 0, "levels[0].bus_efficiency"),
    ("levels.0.name", "", "levels[0].name"),
    ("name", "n" * 201, "name"),
    ("name", ["x"], "name"),
    ("source", {"a": 1}, "source"),
    ("levels", [], "levels"),
    ("accelerator.reserved_GiB", -1.0, "reserved_GiB"),
    ("accelerator.reserved_GiB", 16, "reserved_GiB"),
    ("accelerator.matmul_efficiency", 1.5, "matmul_efficiency"),
    ("accelerator.memory_efficiency", 0.0, "memory_efficiency"),
    ("accelerator.memory_efficiency", 1e-300, "memory_efficiency"),
    ("levels.0.bus_efficiency", 1e-300, "levels[0].bus_efficiency"),
    ("accelerator.peak_bf16_TFLOPS", 0, "peak_bf16_TFLOPS"),
    ("accelerator.peak_bf16_TFLOPS", 1e300, "peak_bf16_TFLOPS"),
    ("accelerator.peak_bf16_TFLOPS", True, "peak_bf16_TFLOPS"),
    ("accelerator.hbm_GiB", -16, "hbm_GiB"),
    ("accelerator.hbm_GB", 16, "hbm_GB"),
    ("accelerator.hbm_bandwidth_TBps", 0, "hbm_bandwidth_TBps"),
    ("accelerator.hbm_bandwidth_TBps", 10**400, "hbm_bandwidth_TBps"),
    ("accelerator.hbm_bandwidth_TBps", 1e-300, "hbm_bandwidth_TBps"),
    ("accelerator.peak_bf16_TFLOPS", 5e-324, "peak_bf16_TFLOPS"),
    ("accelerator.matmul_half_dim", 1e300, "matmul_half_dim"),
    ("accelerator.source", 3, "source"),
    ("accelerator.name", "n" * 201, "name"),
    ("accelerator.name", 7, "name"),
]


@pytest.mark.parametrize("field, value, named", CLUSTER_ATTACKS, ids=[f"{f}={v!r}"[:40] for f, v, _ in CLUSTER_ATTACKS])
def test_cluster_fields_out_of_range(tmp_path, field, value, named):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(_changed(CLUSTER, field, value)))
    with pytest.raises(ConfigError) as info:
        load_cluster(str(path))
    _one_line_naming(info.value, named)
    assert info.value.field in (named, "hbm_GiB")  # both capacities given: the message names both


def test_too_many_devices_and_levels(tmp_path):
    half = 2**11
    wide = _changed(_changed(CLUSTER, "levels.0.size", half), "levels.1.size", half)  # 2^22 devices
    deep = _changed(CLUSTER, "levels", [CLUSTER["levels"][0] | {"size": 1}] * 17)
    for data, words in [(wide, ["4194304 devices", str(MAX_DEVICES)]), (deep, ["levels", "17", "16"])]:
        path = tmp_path / "cluster.json"
        path.write_text(json.dumps(data))
        with pytest.raises(ConfigError) as info:
            load_cluster(str(path))
        _one_line_naming(info.value, *words)


TORUS = ("torus", "tpuv4-nest")
GRAPH = ("graph", "a100-80gb")


@pytest.mark.parametrize(
    "kind, table, named",
    [
        (TORUS, {"dims": [2**40, 2], "link_bandwidth_GBps": 50, "hop_latency_us": 1}, "dims[0]"),
        (TORUS, {"dims": [2] * 17, "link_bandwidth_GBps": 50, "hop_latency_us": 1}, "dims"),
        (TORUS, {"dims": [2.0, 2], "link_bandwidth_GBps": 50, "hop_latency_us": 1}, "dims[0]"),
        (TORUS, {"dims": [4, 4], "link_bandwidth_GBps": 1e300, "hop_latency_us": 1}, "link_bandwidth_GBps"),
        (GRAPH, {"devices": 2, "edges": [[0, 2**40, 100, 1], [1, 2**40, 100, 1]]}, "v"),
        (GRAPH, {"devices": 2**63, "edges": [[0, 1, 100, 1]]}, "devices"),
        (GRAPH, {"devices": 2, "edges": [[0, 1, 100, -1]]}, "latency_us"),
    ],
)
def test_torus_and_graph_tables(tmp_path, kind, table, named):
    key, accelerator = kind
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"name": "t", "accelerator": accelerator, key: table}))
    with pytest.raises(ConfigError) as info:
        load_cluster(str(path))
    _one_line_naming(info.value, named)


def _line(devices: int) -> list[tuple[int, int, float, float]]:
    return [(i, i + 1, 1e11, 1e-6) for i in range(devices - 1)]


def test_graph_whose_latencies_would_take_too_long():
    # a line of 4,096 devices: every Bellman-Ford sweep moves one hop, ~4,096^2 x 8,190 relaxations;
    # refused by the hop count before any sweep
    with pytest.raises(ConfigError) as info:
        from_graph("line", 4096, _line(4096))
    _one_line_naming(info.value, "link relaxations", "[[levels]]")


def test_graph_sweep_stops_at_its_budget(monkeypatch):
    # a line of 8: the hop count promises at least 8 x 14 x 4 = 448 cells, the sweep takes 8 x 14 x 8
    assert from_graph("line", 8, _line(8)).topology.devices == 8
    monkeypatch.setattr(graph_module, "MAX_RELAXATIONS", 600)
    with pytest.raises(ConfigError, match="more than 600 link relaxations"):
        from_graph("line", 8, _line(8))


@pytest.mark.parametrize(
    "field, value",
    [("name", "evil\nname"), ("name", "a\x1b[31mb"), ("levels.0.name", "n\x00"), ("accelerator.name", "c\x85")],
)
def test_cluster_names_without_control_characters(tmp_path, field, value):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(_changed(CLUSTER, field, value)))
    with pytest.raises(ConfigError) as info:
        load_cluster(str(path))
    _one_line_naming(info.value, "control character")


def test_cluster_toml_integers_are_integers(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(CLUSTER_TOML.replace("size = 4", "size = 4.0"))
    with pytest.raises(ConfigError) as info:
        load_cluster(str(path))
    _one_line_naming(info.value, "size", "integer", "4.0")
    path.write_text(CLUSTER_TOML.replace("latency_us = 3", "latency_us = nan"))
    with pytest.raises(ConfigError) as info:
        load_cluster(str(path))
    _one_line_naming(info.value, "latency_us", "finite")


# ---------------------------------------------------------------- NEST solver input

NEST_ATTACKS = [
    ("maxDevices", 4.0),
    ("maxDevices", 2**63),
    ("maxDevices", True),
    ("devices_per_level", [2**63, 2]),
    ("devices_per_level", [1] * 17),
    ("bws", [1e300, 1e10]),
    ("bws", [0, 1e10]),
    ("bws", [1e-300, 1e10]),
    ("latency_per_level", [-1e-5, 1e-4]),
    ("mbsInBatch", 1e300),
    ("mbsInBatch", 2**17),
    ("mbsInBatch", 2.5),
    ("maxMemoryPerDevice", -1),
    ("maxMemoryPerDevice", 1e300),
    ("ep_degree", 2.0),
    ("cp_degree", 10**6),
    ("frequency", 10**400),
    ("frequency", 0),
    ("sp_enabled", "yes"),
    ("nodes.1.2.optimalLatencyFw", 1e300),
    ("nodes.1.2.parameterSize", -1.0),
    ("nodes.1.2.id", 2**63),
    ("nodes.1.2.isTensorParallelized", 1),
    ("edges.1.1.communicationCost", 1e300),
    ("edges.1.1.destId", 1.0),
    ("baselines.Manual.p", 2**63),
    ("baselines.Manual.d", 2.0),
]


@pytest.mark.parametrize("field, value", NEST_ATTACKS, ids=[f"{f}={v!r}"[:40] for f, v in NEST_ATTACKS])
def test_nest_fields_out_of_range(tmp_path, field, value):
    path = tmp_path / "dp_input.json"
    path.write_text(json.dumps(_changed(_nest(), field, value)))
    with pytest.raises(ConfigError) as info:
        read_input(path)
    named = field.split(".")[-1] if not field.startswith("baselines") else field.split(".", 1)[1]
    _one_line_naming(info.value, named)


@pytest.mark.parametrize(
    "nodes, named",
    [
        ({"9999999999": _nest()["nodes"]["1"]}, "tensor-parallel widths"),
        ({"\u0663": _nest()["nodes"]["1"]}, "tensor-parallel widths"),  # an Arabic-Indic digit three
        ({str(w): _nest()["nodes"]["1"] for w in range(1, 10)}, "widths"),
        ({"1": _nest(MAX_NEST_LAYERS + 1)["nodes"]["1"]}, "nodes[1]"),
    ],
)
def test_nest_widths_and_layers(tmp_path, nodes, named):
    path = tmp_path / "dp_input.json"
    path.write_text(json.dumps(_nest() | {"nodes": nodes}))
    with pytest.raises(ConfigError) as info:
        read_input(path)
    _one_line_naming(info.value, named)


def test_nest_input_keeps_the_authors_float_microbatches(tmp_path):
    path = tmp_path / "dp_input.json"
    path.write_text(json.dumps(_nest()))
    assert read_input(path).microbatches == 8


# ---------------------------------------------------------------- through the CLI: exit 2, one line


def _cli_error(capsys, argv: list[str]) -> str:
    code, out, err = run_cli(capsys, argv)
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_cli_refuses_a_trillion_layers(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA | {"num_hidden_layers": 10**12}))
    line = _cli_error(
        capsys,
        [
            "evaluate",
            "--model",
            str(path),
            "--cluster",
            "dgx-h100",
            "--devices",
            "8",
            "--tp",
            "8",
            "--pp",
            "1",
            "--dp",
            "1",
            "--global-batch-size",
            "8",
        ],
    )
    assert "num_hidden_layers" in line and "1000000000000" in line and str(MAX_LAYERS) in line


def test_cli_refuses_a_negative_reserve(tmp_path, capsys):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(_changed(CLUSTER, "accelerator.reserved_GiB", -100.0)))
    line = _cli_error(capsys, ["plan", "--model", "llama3-8b", "--cluster", str(path), "--devices", "8"])
    assert "reserved_GiB" in line and "-100" in line


def test_cli_refuses_a_deeply_nested_nest_input(tmp_path, capsys):
    path = tmp_path / "dp_input.json"
    path.write_text(DEEP)
    line = _cli_error(capsys, ["nest-solve", str(path)])
    assert "NEST input" in line and "nested deeper" in line
