"""The architecture facts a config states (norm epsilon, activation, RoPE base and scaling, router weights):
read with each family's names and Hugging Face's defaults, from ``rope_scaling`` or transformers 5's
``rope_parameters``, refused by name where transformers would not take them, and written back exactly."""

from __future__ import annotations

import json

import pytest

from nestplan.errors import ConfigError
from nestplan.model.config import config_dict, load_model, model_names, parse_config
from nestplan.model.facts import Facts, RopeType, RouterScore
from nestplan.model.stated import stated_facts

LLAMA = {
    "model_type": "llama",
    "hidden_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 1024,
    "vocab_size": 1000,
}


def _read(**extra) -> Facts:
    return parse_config(LLAMA | extra, "tiny").facts


def test_absent_facts_take_the_familys_hugging_face_defaults() -> None:
    assert _read() == Facts(norm_eps=1e-6, activation="silu", rope_theta=10000.0)
    bert = load_model("bert-large").facts
    assert (bert.norm_eps, bert.activation, bert.rope_theta) == (1e-12, "gelu", None)  # BertConfig, no rotary


@pytest.mark.parametrize(
    ("name", "theta", "kind", "factor"),
    [
        ("llama3-70b", 500000.0, None, None),  # Meta's config.json: rope_theta 500000, no scaling
        ("llama3.1-70b", 500000.0, RopeType.LLAMA3, 8.0),  # Llama 3.1: llama3 scaling x8 from 8,192
        ("deepseek-v3", 10000.0, RopeType.YARN, 40.0),  # DeepSeek-V3's config.json: yarn x40 from 4,096
        ("gpt-oss-120b", 150000.0, RopeType.YARN, 32.0),  # gpt-oss model card: yarn x32
        ("gemma3-27b", 1_000_000.0, RopeType.LINEAR, 8.0),  # Gemma 3 27B: linear x8 on global layers
    ],
)
def test_catalog_rope_as_the_configs_state_it(name, theta, kind, factor) -> None:
    facts = load_model(name).facts
    assert facts.rope_theta == theta
    assert (facts.rope_scaling.kind if facts.rope_scaling else None) == kind
    assert (facts.rope_scaling.factor if facts.rope_scaling else None) == factor


def test_routers_as_the_families_define_them() -> None:
    v3 = load_model("deepseek-v3").facts.router
    assert (v3.score, v3.renormalised, v3.scaling_factor) == (RouterScore.SIGMOID, True, 2.5)
    assert load_model("kimi-k2").facts.router.scaling_factor == 2.827  # Kimi K2's routed_scaling_factor
    assert load_model("mixtral-8x7b").facts.router.renormalised  # softmax over the top-k logits
    assert not load_model("llama4-scout").facts.router.renormalised  # a sigmoid of the chosen logits
    assert load_model("qwen3-235b-a22b").facts.router.renormalised  # norm_topk_prob true in its config
    assert load_model("llama3-8b").facts.router is None


def test_rope_parameters_of_transformers_5_read_as_rope_scaling() -> None:
    old = _read(rope_theta=500000.0, rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32})
    new = _read(rope_parameters={"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0, "beta_fast": 32})
    assert old == new and old.rope_scaling.get("beta_fast") == 32.0
    assert _read(rope_scaling={"type": "linear", "factor": 2.0}).rope_scaling.kind is RopeType.LINEAR


def test_gemma3_per_layer_type_rope_parameters() -> None:
    config = json.loads(json.dumps(config_dict(load_model("gemma3-27b"))))
    config.pop("rope_theta"), config.pop("rope_local_base_freq"), config.pop("rope_scaling")
    config["rope_parameters"] = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    }
    assert parse_config(config, "gemma3-27b").facts == load_model("gemma3-27b").facts


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "high_freq_factor"),  # required by transformers
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "alpha": 1}}, "alpha"),  # unknown to yarn
        ({"rope_scaling": {"rope_type": "ntk-by-parts", "factor": 4.0}}, "rope_type"),
        ({"rope_scaling": {"factor": 4.0}}, "factor"),  # no type: the default rope takes no factor
        ({"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_parameters": {}}, "rope_parameters"),
        ({"rope_scaling": "yarn"}, "rope_scaling"),
        ({"rope_theta": -1.0}, "rope_theta"),
        ({"rms_norm_eps": 2.0}, "rms_norm_eps"),
        ({"hidden_act": "swiglu2"}, "hidden_act"),
    ],
)
def test_facts_transformers_would_refuse_are_refused_by_name(extra, named) -> None:
    with pytest.raises(ConfigError) as err:
        _read(**extra)
    assert named in str(err.value)


@pytest.mark.parametrize("name", model_names())
def test_every_catalog_models_facts_are_written_back_exactly(name) -> None:
    model = load_model(name)
    again = parse_config(json.loads(json.dumps(config_dict(model))), name)
    assert again.facts == model.facts and stated_facts(again) == stated_facts(model)


def test_stated_facts_name_what_an_export_must_carry() -> None:
    facts = stated_facts(load_model("deepseek-v3"))
    assert facts["router_scaling_factor"] == 2.5 and facts["routing_groups"] == (8, 4)
    assert facts["rope_scaling"]["rope_type"] == "yarn" and facts["attention_variant"] == "mla"
    assert "router_score" not in stated_facts(load_model("llama3-8b"))


def test_qwen3_moe_as_transformers_5_writes_it() -> None:
    """transformers 5's Qwen3MoeConfig saves its expert count as num_local_experts (its attribute_map)."""
    config = config_dict(load_model("qwen3-235b-a22b"))
    config["num_local_experts"] = config.pop("num_experts")
    assert parse_config(config, "qwen3-235b-a22b") == load_model("qwen3-235b-a22b")
    config["num_experts"] = 64  # both, disagreeing: the older key is read, the other refused by name
    with pytest.raises(ConfigError, match="num_local_experts"):
        parse_config(config, "qwen3-235b-a22b")
