"""The architecture facts of a model that change what it computes but not what nestplan counts: the norm's
epsilon, the MLP's activation, the rotary base and scaling, and how the router weighs the experts it picks.
A framework that builds the model from an export must build it with these (issue 27: "the model as exported
is the model as read"), so :class:`Facts` carries them from the ``config.json`` to every export.

Each family states where its config keeps them and Hugging Face's defaults (:class:`FactKeys`, in the
family's registry entry); :func:`read_facts` reads them with those names and :func:`fact_fields` writes them
back. RoPE scaling is read from ``rope_scaling`` or transformers 5's ``rope_parameters`` with the keys
transformers' own validators allow per ``rope_type`` (transformers/modeling_rope_utils.py,
``_validate_*_rope_parameters``); any other key is refused by name."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from nestplan.inputs import Fields

MAX_ROPE_THETA = 1e12  # published bases run from 10,000 to 5e7 (Llama 4 Maverick's is 500,000)
MAX_ROPE_FACTOR = 1e4  # published context-extension factors run to 64 (yarn on Kimi K2)
MAX_ROPE_FREQUENCIES = 4096  # longrope's per-frequency factors: head_dim / 2 of them (MAX_HEAD_DIM / 2 at most)


class RopeType(StrEnum):
    """Hugging Face's scaled rotary variants (transformers ROPE_INIT_FUNCTIONS; "default" is no scaling)."""

    LINEAR = "linear"  # positions divided by factor (Chen et al. 2023, position interpolation)
    DYNAMIC = "dynamic"  # NTK-aware base rescaled with the sequence length
    YARN = "yarn"  # Peng et al. 2023, YaRN (DeepSeek-V3, gpt-oss, Qwen3 long context)
    LONGROPE = "longrope"  # Ding et al. 2024, per-frequency factors (Phi-3 128k)
    LLAMA3 = "llama3"  # Llama 3.1's frequency-banded interpolation


# per rope_type: (required keys, optional keys) beside rope_type and rope_theta, as transformers validates them
ROPE_KEYS: dict[RopeType, tuple[frozenset[str], frozenset[str]]] = {
    RopeType.LINEAR: (frozenset({"factor"}), frozenset()),
    RopeType.DYNAMIC: (frozenset({"factor"}), frozenset({"original_max_position_embeddings"})),
    RopeType.YARN: (
        frozenset({"factor"}),
        frozenset(
            {"original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale"}
            | {"mscale_all_dim", "truncate"}
        ),
    ),
    RopeType.LONGROPE: (
        frozenset({"short_factor", "long_factor"}),
        frozenset({"original_max_position_embeddings", "attention_factor", "factor"}),
    ),
    RopeType.LLAMA3: (
        frozenset({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}),
        frozenset(),
    ),
}
LAYER_TYPES = ("full_attention", "sliding_attention")  # transformers 5's per-layer-type rope_parameters
_LIST_KEYS = frozenset({"short_factor", "long_factor"})
_FLAG_KEYS = frozenset({"truncate"})
_INTEGER_KEYS = frozenset({"original_max_position_embeddings"})
# YaRN's parameters a config may leave out, with the values transformers then takes (_compute_yarn_parameters)
YARN_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}

# Activations of transformers' ACT2FN that published decoders use ("relu2": squared ReLU, Nemotron)
ACTIVATIONS = (
    "silu",
    "swish",
    "gelu",
    "gelu_new",
    "gelu_fast",
    "gelu_pytorch_tanh",
    "gelu_accurate",
    "quick_gelu",
    "relu",
    "relu2",
    "relu6",
    "tanh",
    "sigmoid",
)


SILU = ("silu", "swish")  # transformers' two names of x * sigmoid(x) (ACT2FN)


class RouterScore(StrEnum):
    """How a router turns logits into expert weights: a softmax (over every expert or over the chosen ones,
    ``ModelSpec.router_scores_all_experts``) or a sigmoid per expert (DeepSeek-V3, Llama 4)."""

    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"


RopeValue = float | int | bool | tuple[float, ...]


@dataclass(frozen=True)
class RopeScaling:
    """A scaled rotary embedding: its ``kind`` and its parameters by Hugging Face's names, sorted."""

    kind: RopeType
    params: tuple[tuple[str, RopeValue], ...]

    def get(self, key: str, default: RopeValue | None = None) -> RopeValue | None:
        return dict(self.params).get(key, default)

    @property
    def factor(self) -> float:
        """The context-extension factor (longrope without one: 1)."""
        return float(self.get("factor", 1.0))  # type: ignore[arg-type]

    def as_dict(self) -> dict[str, Any]:
        """The ``rope_scaling`` object of a config.json."""
        return {"rope_type": self.kind.value} | {k: list(v) if isinstance(v, tuple) else v for k, v in self.params}


@dataclass(frozen=True)
class Router:
    """How the router weighs the ``experts_per_token`` experts it picks: its ``score`` function, whether the
    chosen weights are renormalised to sum to 1 (``norm_topk_prob``) and the factor they are scaled by
    (``routed_scaling_factor``, DeepSeek-V3 section 2.1.2)."""

    score: RouterScore = RouterScore.SOFTMAX
    renormalised: bool = True
    scaling_factor: float = 1.0


@dataclass(frozen=True)
class Facts:
    """What a model computes beyond its shapes: ``norm_eps``, the MLP ``activation``, the rotary base
    (``rope_theta``; None without rotary positions) and scaling, a second base for sliding-window layers
    (Gemma 3's ``rope_local_base_freq``), the ``router`` of a mixture of experts (None for dense), and a
    gated MLP's clamp and linear offset (gpt-oss: both halves clamped at ``glu_clamp``, the linear half
    plus ``glu_linear_offset``; HF GptOssExperts)."""

    norm_eps: float = 1e-6
    activation: str = "silu"
    rope_theta: float | None = 10000.0
    rope_scaling: RopeScaling | None = None
    local_rope_theta: float | None = None
    router: Router | None = None
    glu_clamp: float | None = None
    glu_linear_offset: float = 0.0


@dataclass(frozen=True)
class RouterKeys:
    """Where a family's config states its router: each entry is a config key (read, with the default) or
    None (the family fixes it: the default is the fact)."""

    score: tuple[str | None, RouterScore]
    renormalised: tuple[str | None, bool]
    scaling_factor: tuple[str | None, float] = (None, 1.0)


@dataclass(frozen=True)
class FactKeys:
    """Where a family's config.json keeps its facts and transformers' defaults for them. ``rope_theta``
    None: the family has no rotary positions (its config's rope keys, if any, are not read); an
    ``activation`` key None: the family's model computes its own, whatever the config says."""

    norm_eps: tuple[str, float]
    activation: tuple[str | None, str] = ("hidden_act", "silu")
    rope_theta: float | None = 10000.0
    local_rope_theta: tuple[str, float] | None = None
    router: RouterKeys | None = None
    glu: tuple[str, float, float] | None = None  # (the clamp's key, its default, the fixed linear offset)


def read_facts(f: Fields, keys: FactKeys, moe: bool) -> Facts:
    """The facts of one config (``f``) of a family whose config keeps them under ``keys``; a router only
    for a mixture of experts (``moe``)."""
    eps_key, eps_default = keys.norm_eps
    act_key, act_default = keys.activation
    theta, scaling = _rope(f, keys) if keys.rope_theta is not None else (None, None)
    local = _local_theta(f, keys.local_rope_theta) if keys.local_rope_theta and theta is not None else None
    return Facts(
        norm_eps=f.number(eps_key, 0.0, 1.0, eps_default),
        activation=f.choice(act_key, ACTIVATIONS, act_default) if act_key else act_default,
        rope_theta=theta,
        rope_scaling=scaling,
        local_rope_theta=local,
        router=_router(f, keys.router) if moe and keys.router is not None else None,
        glu_clamp=f.number(keys.glu[0], 0.0, MAX_ROPE_FACTOR, keys.glu[1]) if keys.glu else None,
        glu_linear_offset=keys.glu[2] if keys.glu else 0.0,
    )


def _local_theta(f: Fields, key_default: tuple[str, float]) -> float:
    """The sliding-window layers' base: ``key_default``'s key, or transformers 5's
    ``rope_parameters.sliding_attention.rope_theta`` (unscaled: a scaled local rotary is refused)."""
    _, table = _rope_table(f)
    if table and set(table) <= set(LAYER_TYPES) and table.get("sliding_attention") is not None:
        local = Fields(table["sliding_attention"], f.origin, "rope_parameters.sliding_attention.")
        _refuse_unknown(local, frozenset(), "rope_parameters.sliding_attention")
        return local.number("rope_theta", 1.0, MAX_ROPE_THETA, key_default[1])
    return f.number(key_default[0], 1.0, MAX_ROPE_THETA, key_default[1])


def _router(f: Fields, keys: RouterKeys) -> Router:
    score_key, score = keys.score
    renorm_key, renorm = keys.renormalised
    scale_key, scale = keys.scaling_factor
    return Router(
        score=RouterScore(f.choice(score_key, list(RouterScore), score.value)) if score_key else score,
        renormalised=f.flag(renorm_key, renorm) if renorm_key else renorm,
        scaling_factor=f.number(scale_key, 0.0, MAX_ROPE_FACTOR, scale) if scale_key else scale,
    )


def _rope_table(f: Fields) -> tuple[str, dict | None]:
    """(its key, the object) of ``rope_scaling`` or transformers 5's ``rope_parameters`` (base and scaling)."""
    params = f.raw("rope_parameters", None)
    if params is not None and f.has("rope_scaling"):
        raise f.error("give rope_scaling or rope_parameters, not both", "rope_parameters")
    key = "rope_parameters" if params is not None else "rope_scaling"
    table = params if params is not None else f.raw("rope_scaling", None)
    if table is not None and not isinstance(table, dict):
        raise f.error(f"field '{key}' must be an object, got {type(table).__name__}", key, None, "an object")
    return key, table


def _rope(f: Fields, keys: FactKeys) -> tuple[float, RopeScaling | None]:
    """(base, scaling) of the full-attention layers; transformers 5 keeps Gemma 3's per layer type
    (``rope_parameters.full_attention``)."""
    key, table = _rope_table(f)
    if table and set(table) <= set(LAYER_TYPES):
        key, table = f"{key}.full_attention", table.get("full_attention")
    return _rope_of(f, keys, key, table)


def _rope_of(f: Fields, keys: FactKeys, key: str, table: Any) -> tuple[float, RopeScaling | None]:
    if table is not None and not isinstance(table, dict):
        raise f.error(f"field '{key}' must be an object, got {type(table).__name__}", key, None, "an object")
    nested = Fields(table or {}, f.origin, f"{key}.")
    theta_default = f.number("rope_theta", 1.0, MAX_ROPE_THETA, keys.rope_theta)
    theta = nested.number("rope_theta", 1.0, MAX_ROPE_THETA, theta_default) if table else theta_default
    kind = nested.raw("rope_type", nested.raw("type", "default")) if table else "default"
    if kind == "default":
        _refuse_unknown(nested, frozenset(), key)
        return theta, None
    allowed = [k.value for k in RopeType]
    if kind not in allowed:
        raise nested.error(
            f"field '{key}.rope_type' is {kind!r}; allowed: default, {', '.join(allowed)}",
            f"{key}.rope_type",
            str(kind)[:40],
            ["default", *allowed],
        )
    rope_type = RopeType(kind)
    required, optional = ROPE_KEYS[rope_type]
    values = {
        name: _rope_value(nested, name) for name in sorted(required | optional) if name in required or nested.has(name)
    }
    _refuse_unknown(nested, required | optional, key)
    return theta, RopeScaling(rope_type, tuple(values.items()))


def _rope_value(f: Fields, name: str) -> RopeValue:
    if name in _FLAG_KEYS:
        return f.flag(name)
    if name in _INTEGER_KEYS:
        return f.integer(name, 2**24)
    if name in _LIST_KEYS:
        entries = f.items(name, MAX_ROPE_FREQUENCIES, minimum=1)
        inner = Fields(dict(enumerate(entries)), f.origin, f"{f.where}{name}[")
        return tuple(inner.number(i, 0.0, MAX_ROPE_FACTOR) for i in range(len(entries)))  # type: ignore[arg-type]
    return f.number(name, 0.0, MAX_ROPE_FACTOR)


def _refuse_unknown(f: Fields, allowed: frozenset[str], key: str) -> None:
    known = allowed | {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
    unknown = sorted(str(k) for k in f.data if k not in known)
    if unknown:
        raise f.error(
            f"field '{key}' has key {unknown[0]!r}, which its rope_type does not take; allowed: {', '.join(sorted(allowed))}",
            f"{key}.{unknown[0]}",
            unknown[0][:40],
            sorted(allowed),
        )


def fact_fields(facts: Facts, keys: FactKeys) -> dict[str, Any]:
    """``facts`` as the config.json fields :func:`read_facts` reads back (the inverse)."""
    fields: dict[str, Any] = {keys.norm_eps[0]: facts.norm_eps}
    if keys.activation[0]:
        fields[keys.activation[0]] = facts.activation
    if keys.glu and facts.glu_clamp is not None:
        fields[keys.glu[0]] = facts.glu_clamp
    if facts.rope_theta is not None:
        fields["rope_theta"] = facts.rope_theta
        if facts.rope_scaling is not None:
            fields["rope_scaling"] = facts.rope_scaling.as_dict()
    if keys.local_rope_theta and facts.local_rope_theta is not None:
        fields[keys.local_rope_theta[0]] = facts.local_rope_theta
    if facts.router is not None and keys.router is not None:
        for (key, _), value in zip(
            (keys.router.score, keys.router.renormalised, keys.router.scaling_factor),
            (facts.router.score.value, facts.router.renormalised, facts.router.scaling_factor),
        ):
            if key:
                fields[key] = value
    return fields
