"""The round-trip matrix for DeepSpeed (issue 27 item 2). DeepSpeed builds no model from ds_config.json: the user's
training script does, from the ``config.json`` the export writes beside it (the model as nestplan read it). For every
catalog model the DeepSpeed export takes, transformers 5.12.1 reads that config.json into its own config class
(``AutoConfig.for_model``: its defaults and validators) and must hold every field as written (the rotary base and
scaling in its ``rope_parameters``), the fields whose reading back (``parse_config``) gives every stated fact; the model transformers
builds from it on the meta device (``AutoModelForCausalLM.from_config``, or ``AutoModel`` for an encoder) must have
``total_params`` parameters (transformers counts a tied head once; MTP modules are not in its models, and nestplan
counts them apart; a router's correction bias, a buffer in some of its models, is counted as nestplan counts it).
A model_type transformers 5.12.1 does not know is listed as not built.

``python3 -m pytest tests/unit/test_real_deepspeed_facts.py -s`` prints the matrix.
"""

from __future__ import annotations

import json

import pytest
from planned_cases import evaluated

from nestplan import api
from nestplan.errors import PlannerError
from nestplan.export import deepspeed
from nestplan.export.plan import ExportInput
from nestplan.model.config import model_names, parse_config
from nestplan.model.layers.params import total_params
from nestplan.model.stated import stated_facts
from nestplan.strategy.dims import ParallelDims

transformers = pytest.importorskip("transformers", reason="transformers 5.12.1 is needed: see .ci/run")
import torch  # noqa: E402

# fields transformers' config class sets itself whatever config.json says: DeepseekV2Config.__init__ makes head_dim
# the rotary part (qk_rope_head_dim), which its attention reads as such (the model built has nestplan's count)
DERIVED = {"deepseek_v2": ("head_dim",)}
HEAVY = ("deepseek-v3", "kimi-k2", "korthikanti-1t")  # the slow run builds them


def exported_config(name: str, tmp_path) -> dict | str:
    """The config.json the DeepSpeed export of a small plan (8 GPUs, ZeRO 1) writes, or why it refused."""
    m = api.resolve_model(name)
    seq = min(4096, m.max_position_embeddings) if m.learned_position_embeddings else 4096
    plan = evaluated(name, "dgx-h100", 8, ParallelDims(dp=8, zero=1), 64, seq)
    try:
        export = deepspeed.export(ExportInput(plan, "test"))
    except PlannerError as refusal:
        assert "\n" not in str(refusal)
        return f"refused: {refusal}"
    export.write(tmp_path)
    assert any(deepspeed.MODEL_FILE in note for note in export.notes)
    return json.loads((tmp_path / deepspeed.MODEL_FILE).read_text())


def kept(config, key: str, value) -> bool:
    """Whether transformers' config holds ``key`` as written: its attribute (attribute_map resolves a renamed
    key), or, for the rotary base and scaling, transformers 5's ``rope_parameters`` (per layer type for Gemma 3)."""
    if key not in ("rope_theta", "rope_scaling", "rope_local_base_freq"):
        return getattr(config, key) == value
    params = config.rope_parameters
    if key == "rope_local_base_freq":
        return params["sliding_attention"]["rope_theta"] == value
    params = params.get("full_attention", params)
    if key == "rope_theta":
        return params["rope_theta"] == value
    return all(params.get(k) == v for k, v in value.items())


def round_trip(name: str, tmp_path, build: bool) -> str:
    m = api.resolve_model(name)
    exported = exported_config(name, tmp_path)
    if isinstance(exported, str):
        return exported
    fields = dict(exported)
    model_type = fields.pop("model_type")
    try:
        config = transformers.AutoConfig.for_model(model_type, **fields)
    except ValueError as unknown:
        return f"not built: transformers 5.12.1 does not know model_type {model_type!r} ({str(unknown)[:60]})"
    assert stated_facts(parse_config(exported, name)) == stated_facts(m)  # config_dict's inverse
    derived = DERIVED.get(model_type, ())
    changed = [key for key, value in fields.items() if key not in derived and not kept(config, key, value)]
    assert not changed, f"{name}: transformers' config changes {changed}"
    if not build:
        return "facts equal (-m slow builds it)"
    auto = transformers.AutoModelForCausalLM if m.causal else transformers.AutoModel
    with torch.device("meta"):
        model = auto.from_config(config)
    count = sum(p.numel() for p in model.parameters())
    count += sum(b.numel() for key, b in model.named_buffers() if key.endswith("e_score_correction_bias"))
    if not m.causal:  # BERT's pooler, which nestplan does not cost (no next-sentence head in pretraining here)
        count -= sum(p.numel() for p in model.pooler.parameters()) if getattr(model, "pooler", None) else 0
    assert count == total_params(m), (name, count, total_params(m))
    return f"built, {count:,} parameters; facts equal"


@pytest.mark.parametrize("name", [n for n in model_names() if n not in HEAVY])
def test_deepspeed_round_trip(name, tmp_path) -> None:
    print(f"\n| {name} | {round_trip(name, tmp_path, build=True)} |")


@pytest.mark.slow
@pytest.mark.parametrize("name", HEAVY)
def test_deepspeed_round_trip_of_the_largest(name, tmp_path) -> None:
    print(f"\n| {name} | {round_trip(name, tmp_path, build=True)} |")


@pytest.mark.parametrize("name", HEAVY)
def test_deepspeed_facts_of_the_largest(name, tmp_path) -> None:
    print(f"\n| {name} | {round_trip(name, tmp_path, build=False)} |")
