"""What a Mamba-2 mixer's scan and its memory-bound kernels cost on one device.

The SSD scan (Dao & Gu 2024, arXiv 2405.21060, section 6) runs as the Triton kernels of mamba_ssm
``ops/triton/ssd_combined.py`` (``_chunk_cumsum_fwd``, ``_chunk_state_fwd``, ``_state_passing_fwd``,
``_bmm_chunk_fwd``, ``_chunk_scan_fwd``), which Megatron-core's MambaMixer and HF's NemotronHMamba2Mixer
call: four batched products (``ssd_gemms``, timed as GEMMs by cost/compute.py) and the HBM traffic
of their operands, the fp32 C B^T blocks and the fp32 chunk states (``ssd_scan_bytes``).
"""

from __future__ import annotations

from nestplan.model.layers import Gemm, Shard
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


def mamba_elementwise_bytes(m: Mamba2Shape, shard: Shard) -> float:
    """HBM traffic of a Mamba-2 mixer's memory-bound kernels in one forward pass on one device: the
    causal conv1d with its SiLU over x, B and C (read, write: 2 (d + 2 G N) per token) and the gated
    RMSNorm (read y and z, write: 3 d per token), in the activations' dtype, over t = tp devices."""
    return shard.dtype_bytes * shard.tokens * (2 * m.conv_channels + 3 * m.inner) / shard.tp
