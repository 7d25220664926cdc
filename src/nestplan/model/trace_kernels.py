"""The fused kernels the trace puts in place of Hugging Face's unfused code, as torch autograd Functions
that keep for the backward what the training frameworks' kernels keep (``nestplan.model.trace``, whose
module docstring says which; this module needs torch, which the trace imports only once it is there)."""

import torch

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


class L2Norm(torch.autograd.Function):
    """RMSNorm without a weight (Llama 4's QK-norm) as one kernel keeping its input and 1/rms
    (Megatron-Core's jit-fused torch_norm.L2Norm)."""

    @staticmethod
    def forward(ctx, x, eps):
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd)
        return (x.float() * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, rstd = ctx.saved_tensors
        xhat, g = x.float() * rstd, grad.float()
        return (rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))).to(x.dtype), None


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
        return (
            (grad.float() * up.float() * s * (1 + gate.float() * (1 - s))).to(gate.dtype),
            (grad.float() * silu).to(up.dtype),
        )


class FlashAttention(torch.autograd.Function):
    """Keeps q, k, v, the output and the fp32 log-sum-exp, as flash attention does; the
    output laid out (batch, sequence, heads, dim), as flash attention writes it, so the
    output projection reads that same tensor rather than a transposed copy."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=scale, enable_gqa=k.shape[1] != q.shape[1]
        )
        out = out.transpose(1, 2).contiguous().transpose(1, 2)
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), None, None


class RouterGating(torch.autograd.Function):
    """The router's logits in the activations' dtype, keeping only its input (Megatron-Core
    moe_utils.RouterGatingLinearFunction; moe_router_dtype unset: the activations' dtype)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        return grad @ weight, grad.t() @ x, grad.sum(0) if ctx.needs_input_grad[2] else None


class WeightedActivation(torch.autograd.Function):
    """An expert's gated activation times the token's routing probability, keeping the
    first GEMM's output and the probabilities (Megatron-Core weighted_bias_swiglu_impl,
    weighted_bias_quick_geglu_impl); the backward recomputes the rest."""

    @staticmethod
    def forward(ctx, fc1, probs, gate):
        ctx.gate = gate
        ctx.save_for_backward(fc1, probs)
        return (gate(fc1.detach()) * probs.detach()).to(fc1.dtype)

    @staticmethod
    def backward(ctx, grad):
        fc1, probs = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        with torch.enable_grad():
            out = (ctx.gate(fc1) * probs).to(fc1.dtype)
        return *torch.autograd.grad(out, (fc1, probs), grad), None


class AuxLossScaler(torch.autograd.Function):
    """Passes the routing probabilities through and starts the load-balancing loss's backward
    from them (Megatron-Core moe_utils.MoEAuxLossAutoScaler)."""

    @staticmethod
    def forward(ctx, probs, aux_loss):
        ctx.save_for_backward(aux_loss)
        return probs

    @staticmethod
    def backward(ctx, grad):
        (aux_loss,) = ctx.saved_tensors
        return grad, torch.ones_like(aux_loss)
