"""Issue 14, catalog: GB200/GB300 accelerators, the gb200-nvl72 and dgx-b200 clusters, dgx-h100 at
4,608 GPUs, and the nemotron family (squared-ReLU non-gated MLP, GQA, partial rotary) with the
Nemotron-4 15B and 340B catalog models. Published figures are stated with their source."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from cli_helpers import run_cli

from nestplan import units
from nestplan.cluster import interconnect_bus_efficiency, load_cluster
from nestplan.cost.compute import _elementwise_bytes
from nestplan.errors import ConfigError
from nestplan.hardware import accelerator_names, load_accelerator
from nestplan.model import load_model, model_names, parse_config
from nestplan.model.config import config_dict
from nestplan.model.layers import Shard, embedding_params, head_params, total_params

SHARED_DGXC = (
    Path(__file__).resolve().parents[2].parent / "shared/reference/measured/dgxc_benchmarking_h100_v24.11.json"
)

# The Nemotron-4 15B config.json as HF NemotronConfig spells it (Parmar et al. 2024, arXiv 2402.16819, Table 1;
# FFN 4 x hidden and partial_rotary_factor 0.5 as the NemotronConfig defaults, which are this model).
NEMOTRON4_15B = {
    "architectures": ["NemotronForCausalLM"],
    "model_type": "nemotron",
    "hidden_size": 6144,
    "num_hidden_layers": 32,
    "num_attention_heads": 48,
    "num_key_value_heads": 8,
    "intermediate_size": 24576,
    "hidden_act": "relu2",
    "vocab_size": 256000,
    "max_position_embeddings": 4096,
    "partial_rotary_factor": 0.5,
    "norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
}


# ---------------------------------------------------------------- accelerators


def test_gb200_datasheet_figures() -> None:
    gb200 = load_accelerator("gb200")
    # GB200 NVL72 datasheet, per 72 GPUs, tensor figures sparse ("dense is one-half"): FP16/BF16 360 PFLOPS,
    # TF32 180 PFLOPS, FP8 720 PFLOPS; FP32 5,760 TFLOPS; 13.4 TB HBM3E at 576 TB/s.
    assert gb200.peak("bf16") == pytest.approx(360e15 / 2 / 72)
    assert gb200.peak("fp16") == pytest.approx(360e15 / 2 / 72)
    assert gb200.peak("tf32") == pytest.approx(180e15 / 2 / 72)
    assert gb200.peak("fp8") == pytest.approx(720e15 / 2 / 72)
    assert gb200.peak("fp32") == pytest.approx(5760e12 / 72)
    assert gb200.hbm_bytes == 186 * units.GiB  # 13.4 TB / 72 = 186 GB (binary, as every NVIDIA entry)
    assert gb200.hbm_bandwidth_Bps == pytest.approx(576e12 / 72)
    assert gb200.hbm_bytes > 189471 * units.MiB  # nvidia-smi on GB200: 189471 MiB, 1 GiB below


def test_gb300_datasheet_figures() -> None:
    gb300 = load_accelerator("gb300")
    # GB300 NVL72, per 72 GPUs (sparse): FP16/BF16 360 PFLOPS, TF32 180 PFLOPS, FP8 720 PFLOPS (as GB200);
    # FP32 6 PFLOPS; up to 576 TB/s of HBM3e.
    assert gb300.peak("bf16") == pytest.approx(2500e12)
    assert gb300.peak("tf32") == pytest.approx(1250e12)
    assert gb300.peak("fp8") == pytest.approx(5000e12)
    assert gb300.peak("fp32") == pytest.approx(6e15 / 72, rel=1e-3)
    assert gb300.hbm_bandwidth_Bps == pytest.approx(8e12)
    # Blackwell Ultra: "288 GB HBM3e"; nvidia-smi on GB300 shows 284208 MiB, which is what is entered
    assert gb300.hbm_bytes == pytest.approx(284208 * units.MiB, rel=1e-3)
    assert gb300.hbm_bytes < 288 * units.GiB


def test_new_accelerators_are_listed_and_have_no_fp4_field() -> None:
    assert {"gb200", "gb300"} <= set(accelerator_names())
    assert all(
        set(load_accelerator(n).peak_flops) == {"bf16", "fp16", "tf32", "fp32", "fp8"} for n in ("gb200", "gb300")
    )


def test_nvlink5_reuses_nvlink4s_ring_efficiency() -> None:
    assert interconnect_bus_efficiency("nvlink5") == interconnect_bus_efficiency("nvlink4")


# ---------------------------------------------------------------- clusters


def test_dgx_h100_is_576_nodes() -> None:
    cluster = load_cluster("dgx-h100")
    assert cluster.devices == 4608  # NVIDIA Eos: 576 DGX H100, 4,608 H100
    assert [lv.size for lv in cluster.topology.levels] == [8, 576]
    assert [lv.size for lv in load_cluster("dgx-h100", 2304).topology.levels] == [8, 288]


def test_gb200_nvl72_is_one_nvlink_domain_per_rack() -> None:
    cluster = load_cluster("gb200-nvl72")
    rack, fabric = cluster.topology.levels
    assert cluster.accelerator.name == "gb200"
    assert (rack.size, fabric.size, cluster.devices) == (72, 128, 9216)  # DGX SuperPOD GB200 RA: 128 racks, 9,216
    assert rack.bandwidth_Bps == 900e9  # NVLink 5: 1.8 TB/s per GPU, both directions
    assert rack.bus_efficiency == interconnect_bus_efficiency("nvlink5")
    assert fabric.bandwidth_Bps == 50e9 and fabric.oversubscription == 1.0  # one 400 Gb/s NDR NIC per GPU
    assert [lv.size for lv in load_cluster("gb200-nvl72", 288).topology.levels] == [72, 4]


def test_dgx_b200() -> None:
    cluster = load_cluster("dgx-b200")
    node, fabric = cluster.topology.levels
    assert cluster.accelerator.name == "b200"
    assert (node.size, fabric.size, cluster.devices) == (8, 2048, 16384)  # DGX SuperPOD B200 RA: 64 SUs
    assert node.bandwidth_Bps == 900e9 and fabric.bandwidth_Bps == 50e9  # 14.4 TB/s / 8; 8x 400 Gb/s per node


def test_plan_on_dgx_h100_at_the_published_2304_gpus(capsys) -> None:
    code, out, _ = run_cli(
        capsys,
        [
            "plan",
            "--model",
            "nemotron4-15b",
            "--cluster",
            "dgx-h100",
            "--devices",
            "2304",
            "--global-batch-size",
            "1152",
            "--seq-len",
            "4096",
            "--json",
        ],
    )
    plan = json.loads(out)
    assert code == 0 and plan["devices_total"] == 2304 and plan["cluster"] == "dgx-h100"


# ---------------------------------------------------------------- the nemotron family


def _check_nemotron4(spec) -> None:
    assert spec.family == "nemotron"
    assert not spec.gated_mlp and spec.num_kv_heads == 8 and spec.rotary_fraction == 0.5
    assert spec.norm == "layernorm" and not spec.linear_bias and not spec.tied_embeddings


def test_nemotron_config_inline() -> None:
    spec = parse_config(NEMOTRON4_15B, "nemotron4-15b")
    _check_nemotron4(spec)
    assert (spec.hidden_size, spec.num_heads, spec.head_dim, spec.ffn_hidden_size) == (6144, 48, 128, 24576)


def test_nemotron_configs_of_the_dgxc_benchmarking_rows() -> None:
    if not SHARED_DGXC.is_file():
        pytest.skip(f"{SHARED_DGXC} (the shared reference measurements) is absent")
    rows = [row for row in json.loads(SHARED_DGXC.read_text())["rows"] if "nemotron4" in row["id"]]
    assert rows
    for row in rows:
        _check_nemotron4(parse_config(row["model_config"], row["model_name"]))


def test_nemotron_defaults_are_nemotron_configs() -> None:
    """transformers' NemotronConfig: no kv heads -> MHA, partial_rotary_factor 0.5, untied, no biases."""
    minimal = {
        k: NEMOTRON4_15B[k]
        for k in (
            "model_type",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "vocab_size",
        )
    }
    spec = parse_config(minimal, "x")
    assert spec.num_kv_heads == 48 and spec.rotary_fraction == 0.5 and spec.max_position_embeddings == 4096
    assert not spec.gated_mlp and not spec.tied_embeddings and not spec.linear_bias
    assert parse_config(minimal | {"mlp_bias": True}, "x").linear_bias
    assert parse_config(minimal | {"partial_rotary_factor": 1}, "x").rotary_fraction == 1.0


@pytest.mark.parametrize("value", [0, 0.0, 1.5, -0.5, True, "0.5"])
def test_bad_partial_rotary_factor_names_the_field(value) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(NEMOTRON4_15B | {"partial_rotary_factor": value}, "x")
    assert info.value.field == "partial_rotary_factor" and "(0, 1]" in str(info.value)


def test_other_families_rotate_the_whole_head() -> None:
    assert load_model("llama3-8b").rotary_fraction == 1.0


def test_nemotron_round_trips_through_config_dict() -> None:
    for name in ("nemotron4-15b", "nemotron4-340b"):
        spec = load_model(name)
        assert parse_config(config_dict(spec), name) == spec
    partial = dataclasses.replace(load_model("nemotron4-15b"), rotary_fraction=0.25, linear_bias=True)
    assert parse_config(config_dict(partial), partial.name) == partial


def test_a_partial_rotary_llama_cannot_be_written() -> None:
    llama = dataclasses.replace(load_model("llama3-8b"), rotary_fraction=0.5)
    with pytest.raises(ConfigError, match="rotary_fraction"):
        config_dict(llama)


# Nemotron-4 15B report (arXiv 2402.16819), section 2: "3.2 billion embedding parameters and 12.5 billion
# non-embedding parameters"; Nemotron-4 340B report (arXiv 2406.11704), section 2.1: "9.4 billion embedding
# parameters and 331.6 billion non-embedding parameters".
@pytest.mark.parametrize(
    ("name", "embedding", "non_embedding"), [("nemotron4-15b", 3.2e9, 12.5e9), ("nemotron4-340b", 9.4e9, 331.6e9)]
)
def test_nemotron4_parameter_counts(name, embedding, non_embedding) -> None:
    spec = load_model(name)
    total = total_params(spec)
    counted_embedding = embedding_params(spec) + head_params(spec, separate_copy=False) - 2 * spec.hidden_size
    assert total == pytest.approx(embedding + non_embedding, rel=0.02)
    assert counted_embedding == pytest.approx(embedding, rel=0.02)
    assert total - counted_embedding == pytest.approx(non_embedding, rel=0.005)


def test_rotary_traffic_scales_with_the_rotary_fraction() -> None:
    """The memory-bound RoPE kernel reads and writes only the rotated share of Q and K."""
    full = dataclasses.replace(load_model("nemotron4-15b"), rotary_fraction=1.0)
    half = load_model("nemotron4-15b")
    shard = Shard(tp=2, micro_batch_size=1, seq_len=4096)
    saved = full.rotary_fraction - half.rotary_fraction
    rope_bytes = saved * 2 * shard.dtype_bytes * shard.tokens * (full.q_channels + full.kv_channels) / shard.tp
    assert _elementwise_bytes(full, 0, shard) - _elementwise_bytes(half, 0, shard) == pytest.approx(rope_bytes)


def test_catalog_lists_the_nemotron_models() -> None:
    assert {"nemotron4-15b", "nemotron4-340b"} <= set(model_names())
