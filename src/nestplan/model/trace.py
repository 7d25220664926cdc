"""Per-block FLOPs and saved-activation bytes measured from a PyTorch model (extra ``[trace]``).

The model is built from its Hugging Face config under torch's FakeTensorMode (shapes and dtypes
only: no weights, no GPU, no download), with its blocks cut to ``layers`` (identical blocks: the
per-block figures do not depend on the depth), and run forward and backward on one microbatch:
- FLOPs: torch's FlopCounterMode per block (forward + backward), with eager attention, whose
  s x s matmuls the counter sees (CPU SDPA is one kernel it does not count).
- Saved bytes: a saved-tensors hook records every tensor autograd keeps while a block runs (the
  bytes it spans, a storage's overlapping views once; parameters excluded), with attention as one
  kernel that keeps q, k, v, the output and the log-sum-exp, as flash attention does (registered
  as transformers attention implementation "nestplan_fused_attention").
Three substitutions make the graph the one training frameworks run: RMSNorm as one kernel that
keeps its input and 1/rms (Transformer Engine, Apex), the gated MLP's activation as one kernel
that keeps its two inputs (Megatron-LM's fused SwiGLU), and the experts of a mixture as one GEMM
per expert over a balanced share of the routed tokens (top-k x tokens / experts each; routing is
data-dependent, so shapes cannot follow it under fake tensors).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping

from nestplan.errors import ConfigError


@dataclass(frozen=True)
class BlockTrace:
    """One transformer block, one microbatch of ``tokens`` tokens."""

    index: int
    flops: float             # forward + backward
    saved_bytes: float       # activations kept for the backward pass


@dataclass(frozen=True)
class TraceResult:
    model_type: str
    tokens: int
    blocks: tuple[BlockTrace, ...]
    total_flops: float       # the whole model, forward + backward
    seconds: float


def _torch():
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError("tracing needs PyTorch and transformers: pip install 'nestplan[trace]'", field="trace",
                          limit="torch and transformers installed") from None
    return torch


class _Functions:
    """The fused kernels' autograd behaviour (built lazily: torch is optional)."""

    def __init__(self, torch) -> None:
        F = torch.nn.functional

        class RMSNorm(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, weight, eps):
                rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
                ctx.save_for_backward(x, weight, rstd)
                return (x.float() * rstd).to(x.dtype) * weight

            @staticmethod
            def backward(ctx, grad):
                x, weight, rstd = ctx.saved_tensors
                xhat = x.float() * rstd
                gw = (grad.float() * xhat).sum(dim=tuple(range(grad.dim() - 1))).to(weight.dtype)
                g = grad.float() * weight.float()
                gx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
                return gx.to(x.dtype), gw, None

        class SwiGLU(torch.autograd.Function):
            @staticmethod
            def forward(ctx, gate, up):
                ctx.save_for_backward(gate, up)
                return F.silu(gate) * up

            @staticmethod
            def backward(ctx, grad):
                gate, up = ctx.saved_tensors
                s = torch.sigmoid(gate.float())
                silu = gate.float() * s
                return ((grad.float() * up.float() * s * (1 + gate.float() * (1 - s))).to(gate.dtype),
                        (grad.float() * silu).to(up.dtype))

        class FlashAttention(torch.autograd.Function):
            """Keeps q, k, v, the output and the fp32 log-sum-exp, as flash attention does."""

            @staticmethod
            def forward(ctx, q, k, v, causal, scale):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                     enable_gqa=k.shape[1] != q.shape[1])
                lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
                ctx.save_for_backward(q, k, v, out, lse)
                return out

            @staticmethod
            def backward(ctx, grad):
                q, k, v, _, _ = ctx.saved_tensors
                return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), None, None

        self.rms_norm, self.swiglu, self.flash = RMSNorm.apply, SwiGLU.apply, FlashAttention.apply


def _fuse(model, torch, fn: _Functions) -> None:
    """Swap HF's unfused norm, gated activation and expert loop for the fused equivalents."""
    for mod in model.modules():
        kind = type(mod).__name__
        if kind.endswith("RMSNorm") and hasattr(mod, "weight"):
            eps = getattr(mod, "variance_epsilon", getattr(mod, "eps", 1e-6))
            mod.forward = (lambda m, e: lambda x: fn.rms_norm(x, m.weight, e))(mod, eps)
        elif all(hasattr(mod, a) for a in ("gate_proj", "up_proj", "down_proj")):
            mod.forward = (lambda m: lambda x: m.down_proj(fn.swiglu(m.gate_proj(x), m.up_proj(x))))(mod)
        elif "GELU" in kind:
            approximate = "tanh" if ("New" in kind or "Fast" in kind or "Tanh" in kind) else "none"
            mod.forward = (lambda a: lambda x: torch.nn.functional.gelu(x, approximate=a))(approximate)
        elif hasattr(mod, "gate_up_proj") and hasattr(mod, "down_proj") and hasattr(mod, "num_experts"):
            mod.forward = (lambda m: lambda h, idx, w: _balanced_experts(m, h, idx, w, torch, fn))(mod)


def _balanced_experts(m, hidden, top_k_index, top_k_weights, torch, fn):
    """Every expert runs one GEMM chain over an equal share of the token copies (balanced routing)."""
    k = top_k_index.shape[-1]
    copies = hidden.repeat_interleave(k, dim=0)
    share = -(-copies.shape[0] // m.num_experts)
    outs = []
    for e in range(m.num_experts):
        xe = copies[e * share:(e + 1) * share]
        gate, up = torch.nn.functional.linear(xe, m.gate_up_proj[e]).chunk(2, dim=-1)
        outs.append(torch.nn.functional.linear(fn.swiglu(gate.contiguous(), up.contiguous()), m.down_proj[e]))
    y = torch.cat(outs)[: copies.shape[0]] * top_k_weights.reshape(-1, 1).to(hidden.dtype)
    return y.reshape(hidden.shape[0], k, -1).sum(dim=1)


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
    for key in ("num_hidden_layers", "n_layer"):
        if hasattr(cfg, key):
            setattr(cfg, key, layers)
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
            if id(storage) not in params:   # the bytes this tensor spans, once per storage
                start = t.storage_offset() * t.element_size()
                saved[current[0]].setdefault(id(storage), set()).add((start, start + t.numel() * t.element_size()))
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
    module's transformer blocks (model.layers, transformer.h, encoder.layer). The norm, gated-MLP
    and expert modules' forwards are replaced in place by the fused equivalents (module docstring)."""
    torch = _torch()
    start = time.perf_counter()
    fn = _Functions(torch)
    flops, total = _run(module, sample_inputs, torch, fn, flops=True, blocks=blocks)
    saved, _ = _run(module, sample_inputs, torch, fn, flops=False, blocks=blocks)
    tokens = next((int(v.numel()) for v in sample_inputs.values() if hasattr(v, "numel")), 0)
    result = tuple(BlockTrace(i, flops.get(i, 0.0), saved[i]) for i in sorted(saved))
    return TraceResult(type(module).__name__, tokens, result, total, time.perf_counter() - start)


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
    fn = _Functions(torch)
    with FakeTensorMode(allow_non_fake_inputs=True):
        ids = {"input_ids": torch.zeros((1, seq_len), dtype=torch.long)}
        model, _ = _build(config, layers, "eager", torch)
        flops, total = _run(model, ids, torch, fn, flops=True)
        model, _ = _build(config, layers, _register_flash(fn), torch)
        saved, _ = _run(model, ids, torch, fn, flops=False)
    blocks = tuple(BlockTrace(i, flops.get(i, 0.0), saved[i]) for i in sorted(saved))
    return TraceResult(str(config.get("model_type")), seq_len, blocks, total, time.perf_counter() - start)
