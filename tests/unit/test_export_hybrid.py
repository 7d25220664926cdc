"""The Megatron-LM export of Mamba-2 hybrid stacks (Nemotron-H): Megatron-LM's hybrid entry point, the
layer pattern derived from the ModelSpec with the costed pipeline split as '|' segments, the Mamba-2
sizes, and the refusals (Mamba-1, blocks no hybrid layer builds, MTP, mixer shapes Megatron-core fixes).
Fast: no Megatron here; test_real_megatron.py runs Megatron-LM's own validation on these exports."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from cli_helpers import run_cli

import nestplan
from nestplan import api
from nestplan.errors import ConfigError
from nestplan.export import megatron, nemo, torchtitan
from nestplan.export.plan import ExportInput
from nestplan.job import Job
from nestplan.model.spec import FFN, Block, Mixer, ModelSpec
from nestplan.plan import Plan
from nestplan.strategy.dims import ParallelDims

CATALOG = Path(nestplan.__file__).parent / "catalog" / "models"
TABLE = Path(megatron.__file__).parent / "megatron_flags.txt"
NEMOTRON_H = api.resolve_model("nemotron-h-8b")
SPLIT_FLAGS = (
    "--pipeline-model-parallel-layout",
    "--num-virtual-stages-per-pipeline-rank",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
)


def _plan(dims: ParallelDims, model: str | ModelSpec = "nemotron-h-8b", devices: int = 16, **job) -> Plan:
    return api.evaluate_full(model, "dgx-h100", dims, Job.from_flat(256, 8192, **job), devices=devices).plan


def _flags(plan: Plan) -> dict[str, object]:
    flags, _ = megatron.all_flags(ExportInput(plan, "test"))
    return dict(flags)


def _segments(plan: Plan) -> list[int]:
    return [len(s) for s in megatron.hybrid_pattern(plan).split("|")]


# ---------------------------------------------------------------- the layer pattern
@pytest.mark.parametrize("name", ["nemotron-h-8b", "nemotron-h-56b", "nemotron-3-nano-30b-a3b"])
def test_the_pattern_from_the_spec_is_the_published_one(name: str) -> None:
    """One Megatron-core symbol per block, from mixer_of / has_ffn / is_moe_layer, equals the
    hybrid_override_pattern of the model's published config.json (Nemotron-H 8B: M-M-M-M*-...)."""
    published = json.loads((CATALOG / f"{name}.json").read_text())["hybrid_override_pattern"]
    assert megatron.hybrid_layers(api.resolve_model(name)) == published


def test_the_pattern_follows_the_spec_not_a_stored_string() -> None:
    """Blocks 0 and 1 swapped in the spec (an MLP first, then a Mamba mixer): the pattern swaps too."""
    first, second, *rest = NEMOTRON_H.blocks
    spec = replace(NEMOTRON_H, blocks=(second, first, *rest))
    assert megatron.hybrid_layers(spec)[:4] == "-MM-"


def test_one_stage_has_no_pipes() -> None:
    plan = _plan(ParallelDims(tp=2, sp=True, dp=8, zero=1))
    assert "|" not in megatron.hybrid_pattern(plan)


def test_an_uneven_split_is_two_segments_of_the_costed_blocks() -> None:
    plan = _plan(ParallelDims(tp=2, sp=True, pp=2, dp=4, zero=1, layers_per_stage=(28, 24)))
    pattern = megatron.hybrid_pattern(plan)
    assert _segments(plan) == [28, 24]
    assert pattern.replace("|", "") == megatron.hybrid_layers(NEMOTRON_H)


def test_an_even_split_has_pipes_too() -> None:
    """Megatron-core splits a pipe-free pattern evenly itself, but calls that deprecated: pipes always."""
    plan = _plan(ParallelDims(tp=1, pp=4, dp=4, zero=1))
    assert _segments(plan) == [13, 13, 13, 13]


def test_interleaving_is_segments_in_model_order() -> None:
    """Segment v pp + k is chunk v of pipeline rank k: pp 2 x v 2 gives four segments, the costed chunks."""
    plan = _plan(
        ParallelDims(
            tp=2,
            sp=True,
            pp=2,
            dp=4,
            zero=1,
            schedule="interleaved",
            virtual_stages=2,
            layers_per_stage=(12, 14, 14, 12),
        )
    )
    assert _segments(plan) == [12, 14, 14, 12]


def test_a_chunk_without_blocks_is_an_empty_segment() -> None:
    plan = _plan(
        ParallelDims(
            tp=2, sp=True, pp=2, dp=4, zero=1, schedule="interleaved", virtual_stages=2, layers_per_stage=(0, 26, 26, 0)
        )
    )
    pattern = megatron.hybrid_pattern(plan)
    assert pattern.startswith("|M-") and pattern.endswith("-|") and _segments(plan) == [0, 26, 26, 0]


def test_a_v_schedule_is_refused_naming_interleaved_with_the_stages_keeping_their_blocks() -> None:
    plan = _plan(
        ParallelDims(
            tp=2, sp=True, pp=2, dp=4, zero=1, schedule="dualpipev", virtual_stages=2, layers_per_stage=(26, 26)
        )
    )
    with pytest.raises(ConfigError, match="no dualpipev schedule and would run interleaved with 2 chunks"):
        megatron.export(ExportInput(plan, "test"))
    assert _segments(_plan(megatron.runs_instead(plan))) == [13, 13, 13, 13]


@pytest.mark.parametrize(
    "dims",
    [
        ParallelDims(tp=2, sp=True, pp=2, dp=4, zero=1, layers_per_stage=(28, 24)),
        ParallelDims(tp=1, pp=4, dp=4, zero=1, layers_per_stage=(10, 14, 14, 14)),
        ParallelDims(tp=2, sp=True, pp=2, dp=4, zero=1, schedule="interleaved", virtual_stages=2),
    ],
)
def test_the_split_is_only_in_the_pattern(dims: ParallelDims) -> None:
    """Megatron-core's validate_args refuses a layout, virtual stages and (with pipes) first/last counts
    beside a hybrid pattern: none is emitted, and the pattern's segments are the costed virtual stages."""
    plan = _plan(dims)
    flags = _flags(plan)
    assert not set(SPLIT_FLAGS) & set(flags)
    assert _segments(plan) == list(plan.dims.virtual_stage_layers(NEMOTRON_H.num_layers))


# ---------------------------------------------------------------- the flags and the script
def test_nemotron_h_flags() -> None:
    """The Mamba-2 sizes from spec.mamba, the layer specs, GQA without positions, the squared-ReLU MLP."""
    plan = _plan(ParallelDims(tp=2, sp=True, pp=2, dp=4, zero=1, layers_per_stage=(28, 24)))
    flags = _flags(plan)
    assert (
        flags["--mamba-num-heads"],
        flags["--mamba-head-dim"],
        flags["--mamba-state-dim"],
        flags["--mamba-num-groups"],
    ) == (128, 64, 128, 8)
    assert flags["--spec"] == ("megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec")
    assert (flags["--num-layers"], flags["--hidden-size"], flags["--ffn-hidden-size"]) == (52, 4096, 21504)
    assert (flags["--num-attention-heads"], flags["--num-query-groups"]) == (32, 8)
    assert flags["--position-embedding-type"] == "none" and "--rotary-percent" not in flags
    assert "--squared-relu" in flags and "--swiglu" not in flags and "--apply-layernorm-1p" not in flags
    assert flags["--normalization"] == "RMSNorm" and "--disable-bias-linear" in flags


def test_every_flag_is_in_the_table() -> None:
    plan = _plan(
        ParallelDims(tp=2, sp=True, ep=4, pp=2, dp=1, zero=1, layers_per_stage=(27, 25)), "nemotron-3-nano-30b-a3b"
    )
    lines = TABLE.read_text().splitlines()
    known = {line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()}
    assert set(_flags(plan)) <= known


def test_the_script_runs_megatron_lms_hybrid_entry_point() -> None:
    plan = _plan(ParallelDims(tp=2, sp=True, pp=2, dp=4, zero=1, layers_per_stage=(28, 24)))
    export = megatron.export(ExportInput(plan, "test"))
    text = export.files[0].text
    assert '"$MEGATRON_LM/pretrain_hybrid.py"' in text and "pretrain_gpt.py" not in text
    pattern = megatron.hybrid_pattern(plan)
    assert f"--hybrid-layer-pattern '{pattern}'" in text  # '*' and '|' quoted: one literal word
    assert any("pretrain_hybrid.py" in n and "megatron-core 0.19" in n for n in export.notes)


def test_gpt_exports_keep_their_entry_point_and_positions() -> None:
    plan = api.evaluate_full(
        "nemotron4-15b",
        "dgx-h100",
        ParallelDims(tp=4, sp=True, dp=4, zero=1),
        Job(global_batch_size=256, seq_len=4096),
        devices=16,
    ).plan
    flags = _flags(plan)
    assert flags["--position-embedding-type"] == "rope" and "--rotary-percent" in flags
    assert "--squared-relu" in flags and "--apply-layernorm-1p" in flags and "--hybrid-layer-pattern" not in flags
    assert '"$MEGATRON_LM/pretrain_gpt.py"' in megatron.export(ExportInput(plan, "test")).files[0].text


def test_a_hybrid_moe_places_its_experts_by_pattern() -> None:
    """Nemotron 3 Nano: E blocks in the pattern, no --moe-layer-freq (a GPT's placement), the experts' sizes."""
    plan = _plan(
        ParallelDims(tp=2, sp=True, ep=4, pp=2, dp=1, zero=1, layers_per_stage=(27, 25)), "nemotron-3-nano-30b-a3b"
    )
    flags = _flags(plan)
    assert "--moe-layer-freq" not in flags and "E" in flags["--hybrid-layer-pattern"]
    assert (flags["--num-experts"], flags["--moe-router-topk"], flags["--moe-ffn-hidden-size"]) == (128, 6, 1856)


def test_the_moe_overlap_a_hybrid_cannot_run_is_noted_with_its_prediction() -> None:
    """Megatron-core's combined 1F1B (the MoE all-to-all overlap) asks the model for build_schedule_plan,
    which only GPTModel has: the flag is left out and the note quotes the step without the overlap."""
    plan = _plan(
        ParallelDims(tp=2, sp=True, ep=4, pp=2, dp=1, zero=1, schedule="interleaved", virtual_stages=2),
        "nemotron-3-nano-30b-a3b",
        moe_comm_overlap=True,
    )
    export = megatron.export(ExportInput(plan, "test"))
    assert "--overlap-moe-expert-parallel-comm" not in _flags(plan)
    assert any("GPT models only" in n and "nestplan predicts step" in n for n in export.notes)


def test_a_chunk_length_megatron_core_fixes_otherwise_is_noted() -> None:
    spec = replace(NEMOTRON_H, mamba=replace(NEMOTRON_H.mamba, chunk_size=256))
    plan = _plan(ParallelDims(tp=2, sp=True, dp=8, zero=1), spec)
    assert any("chunks of 128 tokens" in n for n in megatron.export(ExportInput(plan, "test")).notes)


def test_the_planner_exports_nemotron_h_for_megatron(capsys, tmp_path) -> None:
    """plan --export megatron no longer refuses before the search."""
    code, out, err = run_cli(
        capsys,
        [
            "plan",
            "--model",
            "nemotron-h-8b",
            "--cluster",
            "dgx-h100",
            "--devices",
            "16",
            "--export",
            "megatron",
            "--out",
            str(tmp_path),
        ],
    )
    assert code == 0, err
    assert "pretrain_hybrid.py" in (tmp_path / "launch_megatron.sh").read_text()


# ---------------------------------------------------------------- refusals
def test_mamba_1_is_refused_before_the_search(capsys) -> None:
    code, _, err = run_cli(
        capsys,
        ["plan", "--model", "jamba-1.5-mini", "--cluster", "dgx-h100", "--devices", "16", "--export", "megatron"],
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "Mamba-1 mixers in layers" in err and "none in Megatron-core" in err


@pytest.mark.parametrize(
    "spec, what",
    [
        (
            replace(
                NEMOTRON_H,
                blocks=tuple(replace(b, ffn=b.ffn if b.ffn != FFN.NONE else FFN.DENSE) for b in NEMOTRON_H.blocks),
            ),
            "a mixer and an FFN, or neither) in layers 0,2,4",
        ),
        (
            replace(NEMOTRON_H, blocks=NEMOTRON_H.blocks[:7] + (Block(Mixer.NONE, FFN.NONE),) + NEMOTRON_H.blocks[8:]),
            "or neither) in layers 7",
        ),
        (replace(NEMOTRON_H, mtp_layers=1), "1 MTP modules"),
        (replace(NEMOTRON_H, mamba=replace(NEMOTRON_H.mamba, conv_kernel=3)), "conv1d of width 3"),
        (replace(NEMOTRON_H, mamba=replace(NEMOTRON_H.mamba, conv_bias=False)), "conv1d without bias"),
    ],
    ids=["mixer-and-ffn", "neither", "mtp", "conv-width", "conv-bias"],
)
def test_what_no_hybrid_layer_builds_is_refused(spec: ModelSpec, what: str) -> None:
    with pytest.raises(ConfigError) as err:
        api.check_exportable(spec, "megatron")
    assert what in str(err.value) and "\n" not in str(err.value)


def test_fp8_where_the_mixer_asserts_a_width_is_refused() -> None:
    """MambaMixer asserts 2 d + 2 G N + H a multiple of 16 under FP8: 120 heads of 64 give 17,528."""
    spec = replace(NEMOTRON_H, mamba=replace(NEMOTRON_H.mamba, num_heads=120))
    plan = _plan(ParallelDims(tp=1, dp=16, zero=1), spec, fp8_recipe="delayed")
    with pytest.raises(ConfigError, match="multiple of 16; .* is 17528"):
        megatron.export(ExportInput(plan, "test"))


def test_a_mamba_2_hybrid_is_accepted_before_the_search() -> None:
    api.check_exportable("nemotron-h-8b", "megatron")


@pytest.mark.parametrize("check_model", [nemo.check_model, torchtitan.check_model], ids=["bridge", "torchtitan"])
def test_the_gpt_recipes_still_refuse_hybrids(check_model) -> None:
    """Megatron-Bridge's recipes (GPT ones) and torchtitan build no hybrid: one line naming the Mamba layers."""
    with pytest.raises(ConfigError) as err:
        check_model(NEMOTRON_H)
    assert "Mamba-2 mixers in layers 0,2,4" in str(err.value) and "\n" not in str(err.value)
