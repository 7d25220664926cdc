"""The round-trip matrix for torchtitan 0.3.0 (issue 27, item 2): the model as exported is the model as read.

For every catalog model: a small plan is exported, the written config module is imported as torchtitan's
``--module nestplan_torchtitan --config nestplan_plan`` imports it, and torchtitan builds the model on the
meta device (as its trainer does). Each fact ``stated_facts`` names is read back from torchtitan's own
configs (``titan_facts``) and must equal the model's, or be named in the export's notes; torchtitan's
parameter count (with DeepSeek-V3's correction biases, which torchtitan keeps as the ``expert_bias_E``
buffer: models/common/moe.py ``MoE``) must equal ``total_params`` of the model it builds, which differs
from the model's only by noted facts. A model the export refuses is refused in one line naming why.

``python3 -m pytest -q -s tests/unit/test_real_torchtitan_facts.py`` prints the matrix.
"""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("torchtitan", reason="torchtitan 0.3.0 (the version the export targets) is not installed")

import torch  # noqa: E402
from torchtitan.models.common import RMSNorm  # noqa: E402
from torchtitan.models.common.feed_forward import FeedForward  # noqa: E402
from torchtitan.models.common.moe import MoE  # noqa: E402
from torchtitan.models.common.nn_modules import LayerNorm  # noqa: E402
from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher  # noqa: E402
from torchtitan.models.deepseek_v3.model import Attention as LatentAttention  # noqa: E402
from torchtitan.models.gpt_oss.model import Attention as SinkAttention  # noqa: E402
from torchtitan.models.gpt_oss.moe import GptOssGroupedExperts  # noqa: E402

from nestplan import api  # noqa: E402
from nestplan.errors import PlannerError  # noqa: E402
from nestplan.export import build  # noqa: E402
from nestplan.export.torchtitan import CONFIG_FUNCTION, CONFIG_MODULE  # noqa: E402
from nestplan.export.torchtitan_arch import run_model  # noqa: E402
from nestplan.job import Job  # noqa: E402
from nestplan.model.config import load_model, model_names  # noqa: E402
from nestplan.model.layers.params import total_params  # noqa: E402
from nestplan.model.stated import stated_facts  # noqa: E402
from nestplan.strategy.dims import ParallelDims  # noqa: E402

MATRIX: dict[str, str] = {}  # model: its row, printed by test_the_matrix_is_complete
SCALING = {"none": None, "llama": "llama3", "yarn": "yarn"}  # RoPE.Config.scaling as Hugging Face's rope_type
# Hugging Face's rope_scaling keys as torchtitan's RoPE.Config fields (models/common/rope.py)
ROPE_FIELDS = {
    "llama3": {"factor": "scaling_factor", "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor"}
    | {"original_max_position_embeddings": "original_max_position_embeddings"},
    "yarn": {"factor": "rope_factor", "beta_fast": "beta_fast", "beta_slow": "beta_slow", "truncate": "truncate"}
    | {"original_max_position_embeddings": "original_seq_len"},
}


def _small_plan(name: str, pp: int = 1):
    """A plan of 8 devices (data parallel, or ``pp`` stages), sequence within the model's positions."""
    seq = min(2048, load_model(name).max_position_embeddings)
    dims = ParallelDims(dp=8 // pp, pp=pp, zero=3 if pp == 1 else 1)
    job = Job(global_batch_size=64, seq_len=seq)
    return api.evaluate_full(name, "h100-spine-leaf", dims, job, devices=8).plan


def _imported(plan, folder, monkeypatch):
    """(torchtitan's Trainer.Config from the written config module, the export's notes)."""
    export = build(plan, "torchtitan", "test")
    export.write(folder)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, CONFIG_MODULE, raising=False)
    module = __import__(CONFIG_MODULE)
    return getattr(module, CONFIG_FUNCTION)(), export.notes


def _rope_scaling(rope, attention, stated: dict | None) -> dict | None:
    """The rope_scaling object torchtitan computes with, under the stated object's keys."""
    kind = SCALING[rope.scaling]
    if kind is None:
        return None
    fields = ROPE_FIELDS[kind] | (
        {"mscale_all_dim": "mscale", "mscale": "mscale"} if isinstance(attention, LatentAttention.Config) else {}
    )
    read = {"rope_type": kind}
    for key in stated or {}:
        if key in fields:
            source = attention if fields[key] == "mscale" else rope
            read[key] = getattr(source, fields[key])
    return read


def _router_facts(model, m) -> dict:
    """The MoE facts of torchtitan's MoE configs (one value over all MoE layers)."""
    moes = [cfg for _, cfg, _, _ in model.traverse(MoE.Config)]
    routers = {
        (r.score_func, r.top_k, r.route_norm, r.route_scale, r.num_expert_groups or 1, r.num_limited_groups or 1)
        for r in (moe.router for moe in moes)
    }
    assert len(routers) == 1, routers
    score, top_k, norm, scale, groups, limited = routers.pop()
    moe = moes[0]
    shared = moe.shared_experts.w1.out_features // m.shared_expert_ffn_hidden_size if moe.shared_experts else 0
    dispatch = moe.routed_experts.token_dispatcher
    return {
        "router_score": score,
        "router_top_k": top_k,
        "router_renormalised": norm,
        "router_scaling_factor": scale,
        # TokenChoiceTopKRouter scores every expert; renormalised over the top k, a softmax over all of them
        # is the softmax over the top-k logits (Mixtral's, Qwen3's), the same router
        "router_scores_all_experts": m.router_scores_all_experts if (score == "softmax" and norm) else True,
        "routing_groups": (groups, limited),
        "shared_experts": shared,
        "router_bias": bool(moe.router.gate.bias) or moe.load_balance_coeff is not None,
        "capacity": "dropless" if type(dispatch) is AllToAllTokenDispatcher.Config else type(dispatch).__name__,
    }


def titan_facts(model, m, stated: dict) -> dict:
    """Every fact ``stated_facts`` names, read from torchtitan's model config ``model`` (``m`` gives the
    sizes a count is read in: the head size, the shared expert's width)."""
    attentions = [layer.attention for layer in model.layers]
    first = attentions[0]
    latent, sinks = isinstance(first, LatentAttention.Config), isinstance(first, SinkAttention.Config)
    ffns = [cfg for _, cfg, _, _ in model.traverse(FeedForward.Config)]
    oss = [cfg for _, cfg, _, _ in model.traverse(GptOssGroupedExperts.Config)]
    eps = {cfg.eps for _, cfg, _, _ in model.traverse(RMSNorm.Config)}
    assert len(eps) == 1, eps
    head_dim = (
        first.qk_nope_head_dim + first.qk_rope_head_dim if latent else first.head_dim or model.dim // first.n_heads
    )
    kv_heads = None if latent else (first.n_kv_heads or first.n_heads)
    windows = [getattr(a, "sliding_window_size", None) for a in attentions]
    qkv = None if latent else first.qkv_linear
    facts = {
        "norm": "rmsnorm" if not any(True for _ in model.traverse(LayerNorm.Config)) else "layernorm",
        "norm_eps": eps.pop(),
        # FeedForward.forward and GroupedExperts.forward: F.silu; gpt-oss's swiglu: x * sigmoid(1.702 x)
        "activation": "quick_gelu" if oss else "silu",
        "gated_mlp": all(f.w3 is not None for f in ffns),
        "vocab_size": model.tok_embeddings.num_embeddings,
        "tied_embeddings": model.enable_weight_tying,
        "attention_variant": "mla"
        if latent
        else ("mha" if kv_heads == first.n_heads else ("mqa" if kv_heads == 1 else "gqa")),
        "qk_norm": "head" if getattr(first, "qk_norm", None) is not None else "none",
        "window": (next((w for w in windows if w), None), sum(1 for w in windows if w)),
        "attention_chunk": None,
        "rope_layers": sum(1 for a in attentions if a.rope is not None),
        "rotary_fraction": first.rope.dim / head_dim,
        "attention_sinks": sinks,
        "parallel_block": False,  # TransformerBlock.forward: x + attn(norm(x)), then + ffn(norm(x))
        "block_norms": 2,  # attention_norm, ffn_norm
        "rope_theta": first.rope.theta,
        "rope_scaling": _rope_scaling(first.rope, first, stated.get("rope_scaling")),
        "linear_bias": bool(first.wo.bias),
        "qkv_bias": qkv is not None
        and not first.wo.bias
        and any(getattr(lin, "bias", False) for lin in (getattr(qkv, "wqkv", None), getattr(qkv, "wq", None))),
    }
    if any(True for _ in model.traverse(MoE.Config)):
        facts |= _router_facts(model, m)
    if oss:  # gpt-oss's swiglu clamps both halves at swiglu_limit and adds 1 to the linear half (addcmul)
        facts |= {"glu_clamp": oss[0].swiglu_limit, "glu_linear_offset": 1.0}
    if getattr(model, "mtp_layers", None):
        facts["mtp_layers"] = len(model.mtp_layers)
    return {name: facts.get(name) for name in stated}


def meta_params(model_config) -> int:
    """Parameters of the model torchtitan builds on the meta device, and its persistent correction biases
    (``MoE.expert_bias_E``: DeepSeek-V3's, not trained by gradients, counted by nestplan as the router bias)."""
    with torch.device("meta"):
        model = model_config.build()
    biases = sum(b.numel() for name, b in model.named_buffers() if name.endswith("expert_bias_E"))
    return sum(p.numel() for p in model.parameters()) + biases


def check_round_trip(name: str, pp: int, folder, monkeypatch) -> str:
    """Assert the round trip of ``name``; its matrix row."""
    m = load_model(name)
    try:
        plan = _small_plan(name, pp)
        config, notes = _imported(plan, folder, monkeypatch)
    except PlannerError as refusal:
        assert "\n" not in str(refusal)
        return f"refused: {str(refusal).split('; ', 1)[-1]}"
    built = run_model(m, pipelined=pp > 1)
    stated = stated_facts(m)
    read = titan_facts(config.model_spec.model, m, stated)
    made = stated_facts(built)
    assert read == {k: made.get(k) for k in stated}  # torchtitan builds the model the export says it builds
    noted = sorted(k for k in stated if read[k] != stated[k])
    text = " ".join(notes)
    assert all(f"{k} " in text for k in noted), (noted, notes)  # every fact it builds otherwise, named
    params = meta_params(config.model_spec.model)
    assert params == total_params(built)
    assert params == total_params(m) or noted  # a different count only where a fact is noted
    equal = len(stated) - len(noted)
    return f"built {config.model_spec.name}: {equal}/{len(stated)} facts equal, params {params:,}" + (
        f" (nestplan {int(total_params(m)):,}); noted: {', '.join(noted)}" if noted else " = nestplan"
    )


@pytest.mark.parametrize("name", model_names())
def test_round_trip(name, tmp_path, monkeypatch) -> None:
    MATRIX[name] = check_round_trip(name, 1, tmp_path, monkeypatch)


def test_pipelined_unties_the_embeddings_and_notes_it(tmp_path, monkeypatch) -> None:
    """torchtitan refuses weight tying with pipeline parallelism (Decoder.Config.update_from_config): a tied
    model split in stages is built untied, named as tied_embeddings, its larger count quoted."""
    row = check_round_trip("gemma2-9b", 2, tmp_path, monkeypatch)
    assert "tied_embeddings" in row


def test_qwen3_moe_keeps_its_query_key_norms(tmp_path, monkeypatch) -> None:
    """The issue's bug: the Qwen3-MoE export removed QK-norm while its note said otherwise."""
    config, notes = _imported(_small_plan("qwen3-235b-a22b"), tmp_path, monkeypatch)
    layers = config.model_spec.model.layers
    assert all(b.attention.qk_norm is not None and b.attention.qk_norm.normalized_shape == 128 for b in layers)
    assert not any("qk_norm" in n for n in notes)


def test_the_matrix_is_complete() -> None:
    """Every catalog model has a row (run after the parametrised round trips); printed with -s."""
    missing = [name for name in model_names() if name not in MATRIX]
    if missing:
        pytest.skip(f"run with the round trips: {len(missing)} rows missing")
    width = max(map(len, MATRIX))
    print("\n" + "\n".join(f"{name:<{width}}  {row}" for name, row in sorted(MATRIX.items())))
