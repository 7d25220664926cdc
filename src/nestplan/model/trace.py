"""Per-block FLOPs and saved-activation bytes measured from a PyTorch model (extra ``[trace]``).

The model is built from its Hugging Face config under torch's FakeTensorMode (shapes and dtypes
only: no weights, no GPU, no download), with its blocks cut to ``layers`` (identical blocks: the
per-block figures do not depend on the depth), and run forward and backward on one microbatch:
- FLOPs: torch's FlopCounterMode per block (forward + backward), with eager attention, whose
  s x s matmuls the counter sees (CPU SDPA is one kernel it does not count).
- Saved bytes: a saved-tensors hook records every tensor autograd keeps while a block runs (the
  bytes its strides reach, a storage's overlapping views once; parameters excluded), with attention as one
  kernel that keeps q, k, v, the output and the log-sum-exp, as flash attention does (registered
  as transformers attention implementation "nestplan_fused_attention").
Substitutions make the graph the one training frameworks run (Megatron-Core's, where HF's eager
code keeps something else): RMSNorm (and Llama 4's weightless L2 QK-norm) as one kernel that keeps
its input and 1/rms (Transformer Engine, Apex; Megatron-Core's jit-fused L2Norm); the gated MLP's
activation as one kernel that keeps its two inputs (Megatron-LM's fused SwiGLU); attention's output
written (batch, sequence, heads, dim), read by the output projection as it is; no KV cache. In a mixture of experts (megatron/core/transformer/moe/, its
defaults: unfused router and permutation):
- the router (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2, gpt-oss; Llama 4's sigmoid one, whose
  probabilities scale the experts' input: moe_apply_probs_on_input) as Megatron-Core's TopKRouter:
  logits in the activations' dtype keeping only the router's input (HF's DeepSeek-V2 router keeps
  an fp32 copy of it), the top-k with the model's own scoring (softmax before or after the top-k,
  DeepSeek-V2's scaling factor; group-limited selection is not reproduced), and the load-balancing
  loss's fp32 softmax over all experts, which Megatron-Core computes in the block and HF outside;
- the experts as the all-to-all dispatcher and grouped MLP run them: the copies permuted by
  index (int64 maps), one GEMM chain per expert over a balanced share of them (top-k x tokens /
  experts each; routing is data-dependent, so shapes cannot follow it under fake tensors), the
  routing probabilities applied inside the activation (which keeps the first GEMM's output and the
  probabilities, the model's own gated activation: gpt-oss's clamped one too), and a scatter-add
  back; HF's expert loop instead weights each expert's output after the second GEMM, keeping that
  hidden-sized output for the backward (as Megatron-Core's unpermute did before 0.13), and HF's
  Llama 4 runs every expert on every token;
- shared experts and Qwen2-MoE's sigmoid shared-expert gate as HF has them (Megatron-Core keeps
  the same: the gated output and the gate).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from nestplan.errors import ConfigError


@dataclass(frozen=True)
class BlockTrace:
    """One transformer block, one microbatch of ``tokens`` tokens."""

    index: int
    flops: float  # forward + backward
    saved_bytes: float  # activations kept for the backward pass


@dataclass(frozen=True)
class TraceResult:
    model_type: str
    tokens: int
    blocks: tuple[BlockTrace, ...]
    total_flops: float  # the whole model, forward + backward
    seconds: float


def _torch():
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError(
            "tracing needs PyTorch and transformers: pip install 'nestplan[trace]'",
            field="trace",
            limit="torch and transformers installed",
        ) from None
    return torch


class _Functions:
    """The fused kernels' autograd behaviour (model/trace_kernels.py, imported here: torch is optional)."""

    def __init__(self) -> None:
        from nestplan.model import trace_kernels as kernels

        self.rms_norm, self.swiglu, self.flash = (
            kernels.RMSNorm.apply,
            kernels.SwiGLU.apply,
            kernels.FlashAttention.apply,
        )
        self.l2_norm = kernels.L2Norm.apply
        self.router_gating, self.weighted_activation = kernels.RouterGating.apply, kernels.WeightedActivation.apply
        self.aux_loss = kernels.AuxLossScaler.apply


# HF routers returning (logits, top-k weights, top-k indices) that ``_megatron_router`` replaces
ROUTERS = ("MixtralTopKRouter", "Qwen2MoeTopKRouter", "Qwen3MoeTopKRouter", "DeepseekV2TopkRouter", "GptOssTopKRouter")


def _fuse(model, torch, fn: _Functions) -> None:
    """Swap HF's unfused norm, gated activation, router and expert loop for the fused equivalents."""
    for mod in model.modules():
        kind = type(mod).__name__
        if kind.endswith("RMSNorm") and hasattr(mod, "weight"):
            eps = getattr(mod, "variance_epsilon", getattr(mod, "eps", 1e-6))
            mod.forward = (lambda m, e: lambda x: fn.rms_norm(x, m.weight, e))(mod, eps)
        elif kind.endswith("L2Norm") and hasattr(mod, "eps"):
            mod.forward = (lambda e: lambda x: fn.l2_norm(x, e))(mod.eps)
        elif all(hasattr(mod, a) for a in ("gate_proj", "up_proj", "down_proj")):
            mod.forward = (lambda m: lambda x: m.down_proj(fn.swiglu(m.gate_proj(x), m.up_proj(x))))(mod)
        elif "GELU" in kind:
            approximate = "tanh" if ("New" in kind or "Fast" in kind or "Tanh" in kind) else "none"
            mod.forward = (lambda a: lambda x: torch.nn.functional.gelu(x, approximate=a))(approximate)
        elif kind in ROUTERS:
            mod.forward = (lambda m: lambda h: _megatron_router(m, h, torch, fn))(mod)
        elif kind == "Llama4TextMoe":
            mod.forward = (lambda m: lambda h: _llama4_moe(m, h, torch, fn))(mod)
        elif all(hasattr(mod, a) for a in ("gate_up_proj", "down_proj", "num_experts", "_apply_gate")):
            mod.forward = (lambda m: lambda h, idx, w: _dispatched_experts(m, h, idx, w, torch, fn, _hf_layout(m)))(mod)


def _softmax_before_top_k(router) -> bool:
    """Whether the router keeps the softmax over all experts of its top-k, un-renormalised (Qwen2-MoE
    without norm_topk_prob, DeepSeek-V2: Megatron-Core's moe_router_pre_softmax); otherwise its
    weights are the softmax over the top-k logits (Mixtral, Qwen3-MoE renormalise to the same)."""
    return not getattr(router, "norm_topk_prob", True) or type(router).__name__ == "DeepseekV2TopkRouter"


def _megatron_router(m, hidden, torch, fn):
    """Megatron-Core's TopKRouter (router.py, moe_utils.topk_routing_with_score_function, unfused):
    logits in the activations' dtype, the top-k and their softmax (or the top-k of the softmax),
    scaled (DeepSeek-V2's routed_scaling_factor), with the load-balancing loss."""
    x = hidden.reshape(-1, m.weight.shape[1])
    logits = fn.router_gating(x, m.weight, getattr(m, "bias", None))
    if _softmax_before_top_k(m):
        probs, index = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.float32), m.top_k, dim=-1)
    else:
        top, index = torch.topk(logits, m.top_k, dim=-1)
        probs = torch.softmax(top, dim=-1, dtype=torch.float32)
    probs = (probs * getattr(m, "routed_scaling_factor", 1.0)).to(logits.dtype)
    return logits, _with_load_balancing_loss(probs, logits, index, torch, fn), index


def _with_load_balancing_loss(probs, logits, index, torch, fn):
    """The routing probabilities carrying the load-balancing loss on the fp32 softmax over all
    experts (moe_utils.compute_routing_scores_for_aux_loss, switch_load_balancing_loss_func)."""
    with torch.no_grad():
        tokens_per_expert = torch.zeros_like(logits, dtype=torch.float32).scatter(1, index, 1.0).sum(0)
    scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
    return fn.aux_loss(probs, (scores.sum(0) * tokens_per_expert).sum())


def _llama4_moe(m, hidden, torch, fn):
    """Llama 4's MoE block as Megatron-Core runs it: the sigmoid of every logit, its top-k
    (score_function sigmoid), the probability applied to the expert's input (moe_apply_probs_on_input,
    top-1), plus the shared expert. HF's Llama4TextMoe runs every expert on every token instead."""
    x = hidden.reshape(-1, m.hidden_dim)
    logits = fn.router_gating(x, m.router.weight, None)
    probs, index = torch.topk(torch.sigmoid(logits.float()), m.top_k, dim=-1)
    probs = _with_load_balancing_loss(probs.to(logits.dtype), logits, index, torch, fn)
    layout = _ExpertLayout(
        transposed=True, bias=False, gate=lambda y: _chunked_glu(m.experts.act_fn, y), probs_on_input=True
    )
    return m.shared_expert(x) + _dispatched_experts(m.experts, x, index, probs, torch, fn, layout), logits


def _chunked_glu(act, y):
    gate, up = y.chunk(2, dim=-1)
    return act(gate) * up


@dataclass(frozen=True)
class _ExpertLayout:
    """How HF stacks an experts module's weights and gates its first GEMM's output."""

    transposed: bool  # weights (experts, in, out) rather than (experts, out, in)
    bias: bool  # each GEMM has a bias per expert (gpt-oss)
    gate: Callable  # the gated activation of the first GEMM's output
    probs_on_input: bool = False


def _hf_layout(m) -> _ExpertLayout:
    """The layout transformers' use_experts_implementation records on an experts module."""
    return _ExpertLayout(m.is_transposed, m.has_bias, m._apply_gate)


def _expert_linear(m, x, name: str, expert: int, torch, layout: _ExpertLayout, bias: bool):
    """One expert's GEMM, whatever HF's layout of the stacked weights."""
    weight = getattr(m, name)[expert]
    b = getattr(m, f"{name}_bias")[expert] if bias else None
    return torch.nn.functional.linear(x, weight.t() if layout.transposed else weight, b)


def _dispatched_experts(m, hidden, top_k_index, top_k_weights, torch, fn, layout: _ExpertLayout):
    """Megatron-Core's all-to-all dispatcher and grouped experts on one device (ep 1, tp 1):
    permute the token copies by expert (moe_utils.permute: the dense probabilities gathered
    expert-major, the tokens by index_select), run every expert over an equal share of them
    (balanced routing: shapes cannot follow data under fake tensors) with the probabilities applied
    in the activation (experts.py TEGroupedMLP; to the input with ``probs_on_input``), and
    scatter-add them back (moe_utils.unpermute without probabilities)."""
    tokens, k = top_k_index.shape
    copies = tokens * k
    routing_probs = torch.zeros((tokens, m.num_experts), dtype=top_k_weights.dtype, device=hidden.device).scatter(
        1, top_k_index, top_k_weights
    )
    order = torch.arange(copies, device=hidden.device)  # copy i: expert-major position i
    token_of_copy = order % tokens
    permuted_probs = routing_probs.t().contiguous().reshape(-1)[order].unsqueeze(-1)
    permuted = hidden.index_select(0, token_of_copy)
    if layout.probs_on_input:
        permuted = (permuted_probs * permuted).to(hidden.dtype)
        permuted_probs = torch.ones_like(permuted_probs)
    share = -(-copies // m.num_experts)
    outs = []
    for e in range(m.num_experts):
        rows = slice(e * share, (e + 1) * share)
        fc1 = _expert_linear(m, permuted[rows], "gate_up_proj", e, torch, layout, layout.bias)
        act = fn.weighted_activation(fc1, permuted_probs[rows], layout.gate)
        out = _expert_linear(m, act, "down_proj", e, torch, layout, False)
        if layout.bias:  # the second bias, weighted like the rest (TEGroupedMLP._apply_bias)
            out = out + m.down_proj_bias[e] * permuted_probs[rows]
        outs.append(out)
    index = token_of_copy.unsqueeze(1).expand(-1, hidden.shape[-1])
    return torch.zeros_like(hidden).scatter_add(0, index, torch.cat(outs).to(hidden.dtype))


def _register_flash(fn: _Functions) -> str:
    """An attention implementation for transformers' AttentionInterface that keeps what flash keeps."""
    from transformers import AttentionInterface

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        causal = bool(getattr(module, "is_causal", True)) and query.shape[2] > 1
        out = fn.flash(query, key, value, causal, scaling)
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register("nestplan_fused_attention", attention)
    return "nestplan_fused_attention"


def _build(config: Mapping[str, Any], layers: int, attention: str, torch):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    fields = {k: v for k, v in config.items() if not k.startswith("_")}
    model_type = fields.pop("model_type", None)
    if not model_type:
        raise ConfigError("config.json has no model_type to trace", field="model_type")
    cfg = AutoConfig.for_model(model_type, **fields)
    for part in {id(c): c for c in (cfg, cfg.get_text_config())}.values():  # Llama 4: blocks in text_config
        for key in ("num_hidden_layers", "n_layer"):
            if hasattr(part, key):
                setattr(part, key, layers)
    cfg.use_cache = False  # training keeps no KV cache (its copies of K and V are no activations)
    causal = model_type != "bert"
    cls = AutoModelForCausalLM if causal else AutoModelForMaskedLM
    model = cls.from_config(cfg, dtype=torch.bfloat16, attn_implementation=attention)
    model.train()
    return model, cfg


def _blocks(model) -> list:
    for path in ("model.layers", "transformer.h", "bert.encoder.layer", "gpt_neox.layers"):
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return list(obj)
    raise ConfigError(f"cannot find the transformer blocks of {type(model).__name__}", field="model")


def _run(model, inputs: Mapping[str, Any], torch, fn, flops: bool, blocks: list | None = None):
    """FLOPs per block and in all (flops=True), or saved bytes per block, of one forward and
    backward of ``model(**inputs)``."""
    from torch.utils.flop_counter import FlopCounterMode

    _fuse(model, torch, fn)
    blocks = blocks if blocks is not None else _blocks(model)
    current: list = [None]
    for i, b in enumerate(blocks):
        b.register_forward_pre_hook(lambda m, a, i=i: current.__setitem__(0, i))
        b.register_forward_hook(lambda m, a, o: current.__setitem__(0, None))
    params = {id(p.untyped_storage()) for p in model.parameters()}
    saved: dict[int, dict[int, set]] = {i: {} for i in range(len(blocks))}

    def pack(t):
        if current[0] is not None:
            storage = t.untyped_storage()
            if id(storage) not in params:  # the bytes this tensor spans, once per storage
                start = t.storage_offset() * t.element_size()
                saved[current[0]].setdefault(id(storage), set()).add((start, start + _span(t)))
        return t

    # one pass counts FLOPs, the other saved bytes: each without the other's overhead
    counter = FlopCounterMode(display=False, depth=None)
    mode = counter if flops else torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with mode:
        out = model(**inputs)
        _loss(out, torch).backward()
    if not flops:
        return {i: float(sum(_union(r) for r in v.values())) for i, v in saved.items()}, 0.0
    names = {id(b): name for name, b in model.named_modules()}
    counts = counter.get_flop_counts()
    root = type(model).__name__
    per = {i: float(sum(counts.get(f"{root}.{names[id(b)]}", {}).values())) for i, b in enumerate(blocks)}
    return per, float(sum(counts["Global"].values()))


def _loss(out, torch):
    """A scalar to run backward from: the logits (or the first tensor output), summed."""
    if isinstance(out, torch.Tensor):
        return out.float().sum()
    logits = getattr(out, "logits", None)
    if logits is None:
        logits = out[0] if isinstance(out, (tuple, list)) else getattr(out, "last_hidden_state")
    return logits.float().sum()


def from_module(module, sample_inputs: Mapping[str, Any], blocks: list | None = None) -> TraceResult:
    """Trace a PyTorch module built by the caller (under torch's FakeTensorMode for no weights; run
    this call inside the same mode) on keyword ``sample_inputs``. ``blocks`` defaults to the
    module's transformer blocks (model.layers, transformer.h, encoder.layer). The norm, gated-MLP,
    router and expert modules' forwards are replaced in place by the fused equivalents (module
    docstring)."""
    torch = _torch()
    start = time.perf_counter()
    fn = _Functions()
    flops, total = _run(module, sample_inputs, torch, fn, flops=True, blocks=blocks)
    saved, _ = _run(module, sample_inputs, torch, fn, flops=False, blocks=blocks)
    tokens = next((int(v.numel()) for v in sample_inputs.values() if hasattr(v, "numel")), 0)
    result = tuple(BlockTrace(i, flops.get(i, 0.0), saved[i]) for i in sorted(saved))
    return TraceResult(type(module).__name__, tokens, result, total, time.perf_counter() - start)


def _span(t) -> int:
    """Bytes of storage a tensor reaches from its offset: an expanded view (stride 0) spans its
    source's bytes, not its element count's."""
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * stride for n, stride in zip(t.shape, t.stride()))) * t.element_size()


def _union(ranges: set) -> int:
    """Bytes covered by a set of [start, end) byte ranges."""
    total, reach = 0, 0
    for a, b in sorted(ranges):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def trace_config(config: Mapping[str, Any], seq_len: int = 2048, layers: int = 2) -> TraceResult:
    """Trace a Hugging Face config.json dict: per-block FLOPs and saved bytes for one sequence."""
    torch = _torch()
    from torch._subclasses.fake_tensor import FakeTensorMode

    start = time.perf_counter()
    fn = _Functions()
    with FakeTensorMode(allow_non_fake_inputs=True):
        ids = {"input_ids": torch.zeros((1, seq_len), dtype=torch.long)}
        model, _ = _build(config, layers, "eager", torch)
        flops, total = _run(model, ids, torch, fn, flops=True)
        model, _ = _build(config, layers, _register_flash(fn), torch)
        saved, _ = _run(model, ids, torch, fn, flops=False)
    blocks = tuple(BlockTrace(i, flops.get(i, 0.0), saved[i]) for i in sorted(saved))
    return TraceResult(str(config.get("model_type")), seq_len, blocks, total, time.perf_counter() - start)
