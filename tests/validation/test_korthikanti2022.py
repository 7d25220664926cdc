"""Validation against Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models" (MLSys 2023, arXiv 2205.05198), on DGX A100 80GB (Selene).

Figures are stated here with their source; ../shared/reference/measured/korthikanti2022.json
holds the same data. Configurations: Table 3 (tp 8; pp 1/8/35/64; interleave 1/3/3/1;
global batch = GPUs; microbatch 4/1/1/1; sequence 2048; vocab 51200; fp16; Adam; the
attention of 2022 Megatron-LM, i.e. no flash attention).
"""

from __future__ import annotations

import statistics

import pytest

from nestplan import api
from nestplan.job import Job
from nestplan.model import layers as L
from nestplan.strategy.dims import ParallelDims
from nestplan.units import GiB
from nestplan.settings import RunSettings
from nestplan.strategy.enums import Recompute

# name: (tp, pp, gpus, global batch, microbatch, interleave)   -- Table 3
CONFIGS = {
    "22B": (8, 1, 8, 4, 4, 1),
    "175B": (8, 8, 64, 64, 1, 3),
    "530B": (8, 35, 280, 280, 1, 3),
    "1T": (8, 64, 512, 512, 1, 1),
}
# Table 5: iteration time in seconds
TABLE5 = {
    "full": {"22B": 1.42, "175B": 18.13, "530B": 49.05, "1T": 94.42},
    "sp_selective": {"22B": 1.10, "175B": 13.75, "530B": 37.83, "1T": 71.49},
}
# Figure 1: GiB per GPU of the first pipeline stage
FIG1_STATES = {"22B": 45.5625, "175B": 45.5625, "530B": 31.640625, "1T": 32.958984375}
FIG1_ACT_NONE = {"22B": 59.25, "175B": 66.84375, "530B": 114.0234375, "1T": 131.25}
FIG1_ACT_SP_SEL = {"22B": 9.5625, "175B": 12.3515625, "530B": 23.076171875, "1T": 26.5625}
# Figure 7: activation memory in % of no recomputation
FIG7 = {
    "22B": {"sequence_parallel": 66.84, "selective": 49.42, "sequence_parallel_selective": 16.18, "full": 7.64},
    "175B": {"sequence_parallel": 62.04, "selective": 56.53, "sequence_parallel_selective": 18.49, "full": 8.71},
    "530B": {"sequence_parallel": 58.31, "selective": 62.04, "sequence_parallel_selective": 20.27, "full": 9.42},
    "1T": {"sequence_parallel": 58.31, "selective": 62.04, "sequence_parallel_selective": 20.27, "full": 9.42},
}
TIME_TOLERANCE = 0.15  # each Table 5 time within 15%
TIME_MEDIAN_TOLERANCE = 0.08  # median error within 8%
MEMORY_TOLERANCE = 0.10  # Figure 1 within 10%
RATIO_TOLERANCE_PP = 5.0  # Figure 7 within 5 percentage points


def _plan(name: str, mode: str) -> tuple:
    tp, pp, gpus, gbs, mbs, v = CONFIGS[name]
    model = api.resolve_model(f"korthikanti-{name.lower()}")
    cluster = api.resolve_cluster("dgx-a100", gpus)
    job = Job(global_batch_size=gbs, seq_len=2048, dtype="fp16", settings=RunSettings(flash_attention=False))
    recompute = {"full": "full", "sp_selective": "selective", "none": "none", "sp_none": "none"}[mode]
    dims = ParallelDims(
        tp=tp,
        pp=pp,
        dp=1,
        sp=mode.startswith("sp"),
        recompute=recompute,
        micro_batch_size=mbs,
        schedule="interleaved" if v > 1 else "1f1b",
        virtual_stages=v,
    )
    return model, cluster, dims, job


def _predict_table5() -> dict[tuple[str, str], float]:
    out = {}
    for mode in TABLE5:
        for name in CONFIGS:
            out[(mode, name)] = api.evaluate(*_plan(name, mode)).step_time_s
    return out


@pytest.fixture(scope="module")
def table5_predictions() -> dict[tuple[str, str], float]:
    return _predict_table5()


@pytest.mark.parametrize("mode", list(TABLE5))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_table5_iteration_time(table5_predictions, name: str, mode: str) -> None:
    published = TABLE5[mode][name]
    predicted = table5_predictions[(mode, name)]
    assert abs(predicted / published - 1) <= TIME_TOLERANCE, f"{name} {mode}: {predicted:.2f} s vs {published} s"


def test_table5_median_error(table5_predictions) -> None:
    errors = [abs(table5_predictions[(mode, name)] / TABLE5[mode][name] - 1) for mode in TABLE5 for name in CONFIGS]
    assert statistics.median(errors) <= TIME_MEDIAN_TOLERANCE, errors


def test_table5_selective_speedup_direction(table5_predictions) -> None:
    """Sequence parallelism + selective recomputation is faster than full recomputation (Table 5)."""
    for name in CONFIGS:
        assert table5_predictions[("sp_selective", name)] < table5_predictions[("full", name)]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_figure1_memory(name: str) -> None:
    pred_none = api.evaluate(*_plan(name, "none"))
    pred_sel = api.evaluate(*_plan(name, "sp_selective"))
    first = pred_none.stages[0].memory_bytes
    # Figure 1 counts the transformer layers' 12 l h^2 parameters only (45.5625 GiB =
    # 12 * 48 * 6144^2 * 18 B / 8 for 22B); take out the embedding the first stage also holds.
    model = api.resolve_model(f"korthikanti-{name.lower()}")
    tp = CONFIGS[name][0]
    embedding_params = (model.vocab_size / tp + model.max_position_embeddings) * model.hidden_size
    bytes_per_param = 2 + 4 + 12  # fp16 weight, fp32 gradient, fp32 master + Adam moments
    states = (first["weights"] + first["gradients"] + first["optimizer"] - embedding_params * bytes_per_param) / GiB
    assert abs(states / FIG1_STATES[name] - 1) <= MEMORY_TOLERANCE, (states, FIG1_STATES[name])
    act_none = first["activations"] / GiB
    assert abs(act_none / FIG1_ACT_NONE[name] - 1) <= MEMORY_TOLERANCE, (act_none, FIG1_ACT_NONE[name])
    act_sel = pred_sel.stages[0].memory_bytes["activations"] / GiB
    assert abs(act_sel / FIG1_ACT_SP_SEL[name] - 1) <= MEMORY_TOLERANCE, (act_sel, FIG1_ACT_SP_SEL[name])


def _layer_activations(name: str, sp: bool, recompute: Recompute) -> float:
    tp, _, _, _, mbs, _ = CONFIGS[name]
    model = api.resolve_model(f"korthikanti-{name.lower()}")
    shard = L.Shard(tp=tp, sp=sp, micro_batch_size=mbs, seq_len=2048, dtype_bytes=2, flash=False)
    return L.block_activation_bytes(model, 0, shard, recompute)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_figure7_activation_ratios(name: str) -> None:
    base = _layer_activations(name, False, Recompute.NONE)
    ours = {
        "sequence_parallel": _layer_activations(name, True, Recompute.NONE),
        "selective": _layer_activations(name, False, Recompute.SELECTIVE),
        "sequence_parallel_selective": _layer_activations(name, True, Recompute.SELECTIVE),
        "full": _layer_activations(name, False, Recompute.FULL),
    }
    for key, value in ours.items():
        percent = 100.0 * value / base
        assert abs(percent - FIG7[name][key]) <= RATIO_TOLERANCE_PP, (key, percent, FIG7[name][key])


def test_korthikanti_per_layer_formula_exact() -> None:
    """Table 2 closed forms for a GPT layer: sbh(10 + 24/t + 5as/(ht)) and sbh/t (34 + 5as/h)."""
    model = api.resolve_model("korthikanti-175b")
    s, b, h, a, t = 2048, 1, model.hidden_size, model.num_heads, 8
    tp_only = L.Shard(tp=t, micro_batch_size=b, seq_len=s, flash=False)
    tp_sp = L.Shard(tp=t, sp=True, micro_batch_size=b, seq_len=s, flash=False)
    assert L.block_activation_bytes(model, 0, tp_only, Recompute.NONE) == pytest.approx(
        s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    )
    assert L.block_activation_bytes(model, 0, tp_sp, Recompute.NONE) == pytest.approx(
        s * b * h / t * (34 + 5 * a * s / h)
    )
    assert L.block_activation_bytes(model, 0, tp_sp, Recompute.SELECTIVE) == pytest.approx(s * b * h / t * 34)
