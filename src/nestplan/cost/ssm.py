"""What a Mamba-2 mixer's scan and a hybrid block's memory-bound kernels cost on one device.

The SSD scan (Dao & Gu 2024, arXiv 2405.21060, section 6) runs as the Triton kernels of mamba_ssm
``ops/triton/ssd_combined.py`` (``_chunk_cumsum_fwd``, ``_chunk_state_fwd``, ``_state_passing_fwd``,
``_bmm_chunk_fwd``, ``_chunk_scan_fwd``), which Megatron-core's MambaMixer and HF's NemotronHMamba2Mixer
call: four batched products (``ssd_gemms``, timed as GEMMs by cost/compute.py) and the HBM traffic
of their operands, the fp32 C B^T blocks and the fp32 chunk states (``ssd_scan_bytes``).
"""

from __future__ import annotations

from nestplan.model.layers import MASK_BYTES, Gemm, Shard
from nestplan.model.spec import ModelSpec
from nestplan.model.ssm import STATE_BYTES, Mamba2Shape, ssd_gemm_shapes

# the SSD backward (mamba_ssm ``_mamba_chunk_scan_combined_bwd``) recomputes the chunk states
# (``_chunk_state_fwd`` and ``_state_passing_fwd`` again) before its gradient kernels: index of that
# product in ``ssd_gemms``
CHUNK_STATE_GEMM = 2


def ssd_gemms(m: Mamba2Shape, shard: Shard) -> list[Gemm]:
    """The SSD scan's batched products on one device for one microbatch (model/ssm.py ``ssd_gemm_shapes``)."""
    return [Gemm(a, b, c, count) for a, b, c, count in ssd_gemm_shapes(m, shard.tokens, shard.tp)]


def ssd_scan_bytes(m: Mamba2Shape, shard: Shard) -> float:
    """HBM bytes the SSD kernels move in one forward pass on one device, per token (t: tp size):

    * x read twice (chunk state, chunk scan), B and C twice each (C B^T and the chunk state or
      scan), dt once, the output y written: B (3 d + 4 G N + H) / t;
    * C B^T, one fp32 Q x Q block per chunk and group, written and read: 2 x 4 G Q / t;
    * the chunk states, H P N fp32 per chunk: written by the chunk-state kernel, read and written by
      the state passing, read by the chunk scan: 4 x 4 H P N / (Q t).
    """
    B = shard.dtype_bytes
    operands = B * (3 * m.inner + 4 * m.groups * m.state_size + m.num_heads)
    blocks = 2 * STATE_BYTES * m.groups * m.chunk_size
    states = 4 * STATE_BYTES * m.inner * m.state_size / m.chunk_size
    return shard.tokens * (operands + blocks + states) / shard.tp


def hybrid_elementwise_bytes(spec: ModelSpec, layer: int, shard: Shard) -> float:
    """HBM traffic of the memory-bound kernels of a hybrid block's forward pass (Nemotron-H: one
    sub-block per layer): its norms (read, write), one residual add per sub-block (read two, write
    one, and a dropout mask), a Mamba-2 mixer's conv1d with its SiLU over x, B, C (read, write) and
    gated RMSNorm (read y and z, write), an MLP's activation (read 1-2, write 1). Nemotron-H's
    attention has no rotary embeddings and no QK-norm."""
    B, T, t = shard.dtype_bytes, shard.tokens, shard.tp
    rep = T * spec.hidden_size / shard.sp_div
    mixer = spec.mixer_of(layer)
    sub_blocks = (mixer != "none") + spec.has_ffn(layer)
    norms = spec.block_norms * 2 * B * rep
    residual = sub_blocks * (3 * B * rep + (MASK_BYTES * rep if spec.dropout else 0))
    total = norms + residual
    if mixer == "mamba":
        m = spec.mamba
        total += B * T * (2 * m.conv_channels + 3 * m.inner) / t
    if spec.has_ffn(layer):
        total += (3 if spec.gated_mlp else 2) * B * T * spec.ffn_hidden_size / t
    return total
