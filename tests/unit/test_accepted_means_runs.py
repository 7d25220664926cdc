"""What nestplan accepts, the software can run; what the software runs, nestplan accepts (issue 30): FP8
recipes per accelerator, gradient reduction dtypes, a Jamba whose experts fall on no layer, a saved plan
exported onto another cluster."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run_cli

from nestplan import api
from nestplan.errors import ConfigError
from nestplan.model.config import config_dict, load_model, parse_config
from nestplan.settings import Fp8Recipe, RunSettings
from nestplan.strategy.legality import accelerator_conflict

EVALUATE = ["evaluate", "--model", "llama3-8b", "--devices", "8", "--tp", "8"]
EVALUATE += ["--global-batch-size", "16", "--seq-len", "1024"]


@pytest.mark.parametrize(
    ("cluster", "recipe", "refused"),
    [
        ("dgx-h100", "mxfp8", "fp8 recipe mxfp8 needs tensor cores that scale 32-element blocks"),
        ("dgx-a100", "delayed", "has no FP8 tensor cores"),
        ("dgx-h100", "tensorwise", None),
        ("dgx-h100", "blockwise", None),
        ("dgx-b200", "mxfp8", None),
    ],
)
def test_fp8_recipes_are_legal_per_accelerator(capsys, cluster, recipe, refused) -> None:
    code, _, err = run_cli(capsys, [*EVALUATE, "--cluster", cluster, "--fp8-recipe", recipe])
    if refused is None:
        assert code == 0, err
    else:
        assert code == 2 and refused in err and err.count("\n") == 1


def test_a_saved_plan_cannot_smuggle_mxfp8_onto_hopper(capsys, tmp_path) -> None:
    """The rule is the legality module's, which every evaluation and every plan read asks."""
    code, saved, err = run_cli(capsys, [*EVALUATE, "--cluster", "dgx-b200", "--fp8-recipe", "mxfp8", "--json"])
    assert code == 0, err
    (tmp_path / "plan.json").write_text(saved, encoding="utf-8")
    with pytest.raises(ConfigError, match="mxfp8"):
        api.load_plan(tmp_path / "plan.json", cluster="dgx-h100")
    h100 = api.resolve_cluster("dgx-h100").accelerator
    assert accelerator_conflict(RunSettings(fp8_recipe=Fp8Recipe.MXFP8), h100) is not None
    assert accelerator_conflict(RunSettings(fp8_recipe=Fp8Recipe.TENSORWISE), h100) is None


@pytest.mark.parametrize(("dtype", "accepted"), [("fp8", False), ("tf32", False), ("fp32", True), ("bf16", True)])
def test_gradients_reduce_in_fp32_bf16_or_fp16(capsys, dtype, accepted) -> None:
    code, _, err = run_cli(capsys, [*EVALUATE, "--cluster", "dgx-h100", "--grad-reduce-dtype", dtype])
    assert (code == 0) is accepted, err
    if not accepted:
        assert f"grad_dtype '{dtype}' is not one of fp32, bf16, fp16" in err


def test_a_jamba_whose_expert_period_falls_past_its_layers_is_written_as_read(capsys, tmp_path) -> None:
    """Its 16 experts sit on no layer of a 3-layer stack: it evaluates, so its plan JSON holds it."""
    config = config_dict(load_model("jamba-1.5-mini")) | {"num_hidden_layers": 3, "expert_layer_period": 4}
    config |= {"expert_layer_offset": 3, "name": "jamba-small"}
    spec = parse_config(config, "jamba-small")
    assert parse_config(config_dict(spec), "jamba-small") == spec
    path = tmp_path / "jamba.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    code, out, err = run_cli(
        capsys, [*EVALUATE[:1], "--model", str(path), *EVALUATE[3:], "--cluster", "dgx-h100", "--json"]
    )
    assert code == 0, err
    assert json.loads(out)["model"] == "jamba-small"


def test_a_plan_exported_onto_another_cluster_quotes_that_clusters_prediction(capsys, tmp_path) -> None:
    code, saved, err = run_cli(capsys, [*EVALUATE, "--cluster", "dgx-h100", "--json"])
    assert code == 0, err
    (tmp_path / "plan.json").write_text(saved, encoding="utf-8")
    code, a100, err = run_cli(capsys, [*EVALUATE, "--cluster", "dgx-a100", "--json"])
    assert code == 0, err
    step = json.loads(a100)["prediction"]["step_time_s"]
    out = tmp_path / "export"
    code, _, err = run_cli(
        capsys,
        ["export", str(tmp_path / "plan.json"), "--framework", "megatron", "--out", str(out), "--cluster", "dgx-a100"],
    )
    assert code == 0, err
    script = (out / "launch_megatron.sh").read_text(encoding="utf-8")
    assert f"predicted by nestplan: step {step:.3f} s" in script
    assert json.loads(saved)["prediction"]["step_time_s"] != pytest.approx(step, rel=1e-3)
