"""Jamba (``jamba``): attention every ``attn_layer_period``-th layer from ``attn_layer_offset``,
Mamba-1 mixers (``model.ssm.Mamba1Shape``) in the others (``mamba_layers``), MoE every
``expert_layer_period``-th layer from ``expert_layer_offset``; no positional embedding."""

from __future__ import annotations

from typing import Any

from nestplan.errors import ConfigError, printable
from nestplan.model.families.common import (
    MAX_EXPERTS,
    MAX_FFN,
    MAX_HEAD_DIM,
    MAX_HIDDEN,
    MAX_LAYERS,
    ConfigFields,
    Family,
    expert_counts,
    rotary_decoder,
    rotary_fields,
)
from nestplan.model.facts import FactKeys, RouterKeys, RouterScore
from nestplan.model.spec import FFN, Block, Mixer, ModelSpec
from nestplan.model.ssm import Mamba1Shape


def _periodic_layers(
    f: ConfigFields, num_layers: int, period_key: str, offset_key: str, period: int, offset: int
) -> tuple[int, ...]:
    """The layers ``i`` with ``i % period == offset`` (Jamba's attention and expert layers)."""
    every = f.integer(period_key, MAX_LAYERS, default=period)
    first = f.integer(offset_key, MAX_LAYERS, default=offset, minimum=0)
    if first >= every:
        raise f.error(f"{offset_key} {first} must be below {period_key} {every}", offset_key, first, f"0..{every - 1}")
    return tuple(i for i in range(num_layers) if i % every == first)


def _mamba1_shape(f: ConfigFields, hidden: int) -> Mamba1Shape:
    """Jamba's selective-SSM mixers (HF JambaConfig defaults: state 16, conv 4, expand 2, dt rank
    "auto" = ceil(hidden / 16), a conv bias); ``mamba_proj_bias`` set to true is refused."""
    if f.flag("mamba_proj_bias", False):
        raise f.error(
            "field 'mamba_proj_bias' is true; nestplan counts Jamba's Mamba projections without biases",
            "mamba_proj_bias",
            True,
            "false",
        )
    rank = f.raw("mamba_dt_rank", "auto")
    dt_rank = -(-hidden // 16) if rank == "auto" else f.integer("mamba_dt_rank", MAX_HIDDEN)
    return Mamba1Shape(
        inner=f.integer("mamba_expand", 64, default=2) * hidden,
        state_size=f.integer("mamba_d_state", MAX_HEAD_DIM, default=16),
        conv_kernel=f.integer("mamba_d_conv", MAX_HEAD_DIM, default=4),
        dt_rank=dt_rank,
        conv_bias=f.flag("mamba_conv_bias", True),
    )


def _read_jamba(f: ConfigFields, name: str) -> ModelSpec:
    """Jamba (HF modeling_jamba; Lieber et al. 2024, arXiv 2403.19887, section 2; Jamba-1.5, arXiv
    2408.12570): every layer a mixer and an FFN, each with its RMSNorm; attention (GQA, no positional
    embedding) in the layers ``i % attn_layer_period == attn_layer_offset`` (default 8, 4), a Mamba-1
    mixer (``_mamba1_shape``) in the others; a top-k MoE of ``num_experts`` SwiGLU experts of
    ``intermediate_size`` in the layers ``i % expert_layer_period == expert_layer_offset`` (default 2,
    1), a dense SwiGLU MLP of the same width in the others (every layer where num_experts is 1)."""
    fields = rotary_decoder(f, name)
    layers = len(fields["blocks"])
    attention = _periodic_layers(f, layers, "attn_layer_period", "attn_layer_offset", 8, 4)
    expert_layers = _periodic_layers(f, layers, "expert_layer_period", "expert_layer_offset", 2, 1)
    ffn = f.integer("intermediate_size", MAX_FFN)
    moe: dict[str, Any] = {}
    if f.integer("num_experts", MAX_EXPERTS) > 1:
        experts, top_k = expert_counts(f, "num_experts")
        moe = {"num_experts": experts, "experts_per_token": top_k, "moe_ffn_hidden_size": ffn}
    else:
        f.has("num_experts_per_tok")
        expert_layers = ()
    blocks = tuple(
        Block(Mixer.ATTENTION if i in attention else Mixer.MAMBA1, FFN.MOE if i in expert_layers else FFN.DENSE)
        for i in range(layers)
    )
    return ModelSpec(
        ffn_hidden_size=ffn,
        rotary_fraction=0.0,
        mamba=_mamba1_shape(f, fields["hidden_size"]),
        **fields | {"blocks": blocks},
        **moe,
    )


def _period_and_offset(layers: tuple[int, ...], num_layers: int) -> tuple[int, int]:
    """(period, offset) that give ``layers`` as the i with i % period == offset (none: past the last
    layer); a set no period gives is written as its first two layers' spacing, and the round trip
    check of ``config_dict`` names it."""
    if not layers:
        return num_layers + 1, num_layers
    return (layers[1] - layers[0] if len(layers) > 1 else num_layers), layers[0]


def _jamba_fields(spec: ModelSpec) -> dict[str, Any]:
    m = spec.mamba
    if not isinstance(m, Mamba1Shape) or m.inner % spec.hidden_size:
        raise ConfigError(
            f"model {printable(spec.name)} cannot be written as a jamba config.json: its Mamba mixer "
            "is not Jamba's (a selective SSM of a whole multiple of the hidden size)",
            field="mamba",
        )
    attention = tuple(i for i in range(spec.num_layers) if spec.mixer_of(i) == "attention")
    attn_period, attn_offset = _period_and_offset(attention, spec.num_layers)
    expert_period, expert_offset = _period_and_offset(spec.moe_layers if spec.is_moe else (), spec.num_layers)
    return {
        **rotary_fields(spec),
        "intermediate_size": spec.ffn_hidden_size,
        "num_experts": spec.num_experts or 1,  # experts declared even where no layer falls on their period
        "num_experts_per_tok": spec.experts_per_token or 1,
        "attn_layer_period": attn_period,
        "attn_layer_offset": attn_offset,
        "expert_layer_period": expert_period,
        "expert_layer_offset": expert_offset,
        "mamba_d_state": m.state_size,
        "mamba_d_conv": m.conv_kernel,
        "mamba_expand": m.inner // spec.hidden_size,
        "mamba_dt_rank": m.dt_rank,
        "mamba_conv_bias": m.conv_bias,
    }


FAMILIES = (
    Family(
        "jamba",
        _read_jamba,
        _jamba_fields,
        262144,
        facts=FactKeys(
            ("rms_norm_eps", 1e-6), rope_theta=None, router=RouterKeys((None, RouterScore.SOFTMAX), (None, False))
        ),
    ),
)
